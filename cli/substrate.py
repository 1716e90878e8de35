"""`slicex substrate check|ad|ndl FILE`: check an operator's substrate file and show what it yields.

Each command is a function of parsed arguments returning an exit status (0 fine, 1 a mistake in the file),
so `cli/main.py` only has to call `add_substrate_commands(subparsers)`."""

from __future__ import annotations

import argparse
import base64
import sys
import zlib
from datetime import UTC, datetime

from rspec.advertisement import Usage, build_advertisement, format_ranges
from rspec.ndl import substrate_graph
from rspec.substrate import Substrate, SubstrateError, check_substrate, load_substrate, urn_name
from rspec.validate import validate_rspec

NDL_FORMATS = {"turtle": "turtle", "xml": "xml", "nt": "nt"}


def _load(path: str) -> Substrate | None:
    try:
        return load_substrate(path)
    except SubstrateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def summary(sub: Substrate) -> list[str]:
    """What a substrate offers, a line per kind of resource (the body of `slicex substrate check`)."""
    vms = [h for h in sub.hosts if not h.exclusive]
    bare = [h for h in sub.hosts if h.exclusive]
    tags = sum(hi - lo + 1 for s in sub.switches for lo, hi in s.vlan_range)
    shared = ", ".join(f"{v.name} (tag {v.tag})" for v in sub.shared_vlans)
    return [
        f"  sites        {', '.join(s.name for s in sub.all_sites) or 'none named'}",
        f"  VM hosts     {len(vms)} ({sum(h.cores for h in vms)} cores, {sum(h.memory_mb for h in vms) // 1024} GiB)",
        f"  bare metal   {len(bare)}",
        f"  switches     {len(sub.switches)} ({sum(len(s.ports) for s in sub.switches)} ports, {tags} VLAN tags for "
        f"slices), {len(sub.trunks)} trunk{'s' if len(sub.trunks) != 1 else ''}",
        *(f"  trunk        {t.name}: {_trunk_ends(t)}" for t in sub.trunks),
        f"  static VLANs {len(sub.static_vlans)}{' — shared: ' + shared if shared else ''}",
        f"  VM sizes     {', '.join(s.name for s in sub.vm_sizes)}",
        f"  images       {', '.join(i.name for i in sub.images)}",
        f"  external     {', '.join(f'{e.name} → {e.remote_aggregate}' for e in sub.external_links) or 'none'}",
        f"  FPGA boards  {len(sub.fpga_boards)}",
    ]


def _trunk_ends(t) -> str:
    """What a trunk's ends can do for links between its racks (docs/operator-guide.md)."""
    def names(ports) -> str:
        return ", ".join(urn_name(p) for p in ports) or "no end"
    wire = f"carries {format_ranges(t.vlan_range)}; " if t.vlan_range else ""
    return f"{wire}translates at {names(t.translation)}; Q-in-Q at {names(t.qinq)}"


def cmd_check(args: argparse.Namespace) -> int:
    sub = _load(args.file)
    if sub is None:
        return 1
    ad = build_advertisement(sub, Usage(), datetime.now(UTC))
    problems = validate_rspec(ad, "advertisement")
    print(f"{args.file}: OK — authority {sub.authority}")
    print("\n".join(summary(sub)))
    print(f"  NDL-OWL      {len(substrate_graph(sub))} triples; advertisement {len(ad) // 1024} KiB")
    sys.stdout.flush()  # the summary before the warnings when both go to one pipe
    for warning in check_substrate(sub):
        print(f"warning: {warning}", file=sys.stderr)
    if problems:
        print("the advertisement it yields is not valid (a slicex bug; please report it):\n  "
              + "\n  ".join(problems), file=sys.stderr)
        return 1
    return 0


def cmd_ad(args: argparse.Namespace) -> int:
    sub = _load(args.file)
    if sub is None:
        return 1
    ad = build_advertisement(sub, Usage(), datetime.now(UTC), am_url=args.am_url)
    if args.compressed:
        ad = base64.b64encode(zlib.compress(ad.encode())).decode() + "\n"
    sys.stdout.write(ad)
    return 0


def cmd_ndl(args: argparse.Namespace) -> int:
    sub = _load(args.file)
    if sub is None:
        return 1
    sys.stdout.write(substrate_graph(sub).serialize(format=NDL_FORMATS[args.format]))
    return 0


def add_substrate_commands(subparsers) -> None:
    """Register `substrate check|ad|ndl` on the main parser's subparsers; each sets `func`."""
    p = subparsers.add_parser("substrate", help="check an operator's substrate file and show what it yields",
                              description="Check a substrate description (YAML, or NDL-OWL Turtle/RDF-XML) and show "
                                          "the advertisement and the NDL-OWL graph it yields. See "
                                          "docs/operator-guide.md.")
    sub = p.add_subparsers(dest="substrate_command", required=True)
    check = sub.add_parser("check", help="validate a substrate file and summarise it (warnings on stderr)")
    check.add_argument("file")
    check.set_defaults(func=cmd_check)
    ad = sub.add_parser("ad", help="print the advertisement RSpec it yields (nothing in use)")
    ad.add_argument("file")
    ad.add_argument("--am-url", default=None, help="the AM URL to advertise for stitching (default: the file's am_url)")
    ad.add_argument("--compressed", action="store_true", help="zlib + base64, as geni_compressed returns it")
    ad.set_defaults(func=cmd_ad)
    ndl = sub.add_parser("ndl", help="print its NDL-OWL graph (ORCA vocabulary)")
    ndl.add_argument("file")
    ndl.add_argument("--format", choices=sorted(NDL_FORMATS), default="turtle", help="RDF syntax (default turtle)")
    ndl.set_defaults(func=cmd_ndl)
