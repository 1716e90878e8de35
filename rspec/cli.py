"""`slicex substrate check|ad|ndl FILE`: check an operator's substrate file and show what it yields."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from rspec.advertisement import Usage, build_advertisement
from rspec.ndl import substrate_graph
from rspec.substrate import SubstrateError, load_substrate
from rspec.validate import validate_rspec


def _load(path: str):
    try:
        return load_substrate(path)
    except SubstrateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def cmd_check(args: argparse.Namespace) -> int:
    sub = _load(args.file)
    if sub is None:
        return 1
    ad = build_advertisement(sub, Usage(), datetime.now(UTC))
    problems = validate_rspec(ad, "advertisement")
    vms = [h for h in sub.hosts if not h.exclusive]
    bare = [h for h in sub.hosts if h.exclusive]
    tags = sum(hi - lo + 1 for s in sub.switches for lo, hi in s.vlan_range)
    print(f"{args.file}: OK — authority {sub.authority}")
    print(f"  VM hosts     {len(vms)} ({sum(h.cores for h in vms)} cores, {sum(h.memory_mb for h in vms) // 1024} GiB)")
    print(f"  bare metal   {len(bare)}")
    print(f"  switches     {len(sub.switches)} ({sum(len(s.ports) for s in sub.switches)} ports, {tags} VLAN tags)")
    print(f"  VM sizes     {', '.join(s.name for s in sub.vm_sizes)}")
    print(f"  images       {', '.join(i.name for i in sub.images)}")
    print(f"  external     {', '.join(f'{e.name} → {e.remote_aggregate}' for e in sub.external_links) or 'none'}")
    print(f"  FPGA boards  {len(sub.fpga_boards)}")
    print(f"  NDL-OWL      {len(substrate_graph(sub))} triples")
    if problems:
        print("the advertisement it yields is not valid:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    return 0


def cmd_ad(args: argparse.Namespace) -> int:
    sub = _load(args.file)
    if sub is None:
        return 1
    sys.stdout.write(build_advertisement(sub, Usage(), datetime.now(UTC)))
    return 0


def cmd_ndl(args: argparse.Namespace) -> int:
    sub = _load(args.file)
    if sub is None:
        return 1
    sys.stdout.write(substrate_graph(sub).serialize(format="turtle"))
    return 0


def add_substrate_commands(subparsers) -> None:
    p = subparsers.add_parser("substrate", help="check an operator's substrate file and show what it yields")
    sub = p.add_subparsers(dest="substrate_command", required=True)
    for name, func, text in (("check", cmd_check, "validate a substrate file and summarise it"),
                             ("ad", cmd_ad, "print the advertisement RSpec it yields"),
                             ("ndl", cmd_ndl, "print its NDL-OWL graph as Turtle")):
        c = sub.add_parser(name, help=text)
        c.add_argument("file")
        c.set_defaults(func=func)
