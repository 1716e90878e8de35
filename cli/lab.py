"""`slicex lab up|down|status`: a multi-host lab on this machine (lab/; docs/lab.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import yaml

from lab import edge
from lab.plan import LabSpec, LabSpecError, line
from slicex.errors import GeniError


def _spec(args: argparse.Namespace) -> LabSpec:
    if args.file:
        doc = yaml.safe_load(Path(args.file).read_text()) or {}
        if args.name:
            doc["name"] = args.name
        if args.network:
            doc["network"] = args.network
        return LabSpec.from_document(doc)
    return line(args.name or "lab", args.hosts, args.rate, args.nat, args.network)


def cmd_lab_up(args: argparse.Namespace) -> int:
    try:
        spec = _spec(args)
        redis_url = None if args.no_redis else os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/0")
        p = edge.up(spec, redis_url)
    except (LabSpecError, OSError) as e:
        print(f"slicex lab up: {e}", file=sys.stderr)
        return 2
    except GeniError as e:
        print(f"slicex lab up: {e}", file=sys.stderr)
        return 1
    for h in p.hosts:
        print(f"{h.name:8} {h.address:15} {' '.join(edge.inside(h.namespace))} …")
    if redis_url:
        print(f"Redis for the hosts: {edge.hosts_redis_url(p, redis_url)}")
    return 0


def cmd_lab_down(args: argparse.Namespace) -> int:
    removed = edge.down(args.name)
    print(f"removed {', '.join(removed)}" if removed else f"no lab {args.name} on this machine")
    return 0


def cmd_lab_status(args: argparse.Namespace) -> int:
    p, hosts = edge.status(args.name)
    if p is None:
        print(f"no lab {args.name} on this machine")
        return 3
    if args.json:
        print(json.dumps({"lab": p.spec.document(), "operator": p.operator_address,
                          "hosts": [h.__dict__ for h in hosts]}, indent=1))
    else:
        for h in hosts:
            links = ", ".join(f"{k} {v}" for k, v in h.links.items()) or "namespace missing"
            print(f"{h.name:8} {h.address:15} {h.namespace:20} {links}")
    healthy = all(h.exists and all(v.startswith("UP") and "UNSHAPED" not in v for v in h.links.values())
                  for h in hosts)
    return 0 if healthy else 3


def add_parser(sub: argparse._SubParsersAction) -> None:
    lab = sub.add_parser("lab", help="a multi-host lab on this machine: hosts as network namespaces joined by shaped "
                                     "veth fibres, optionally through a NAT (docs/lab.md)")
    lab_sub = lab.add_subparsers(dest="lab_command", required=True)
    up = lab_sub.add_parser("up", help="make the lab (an existing one of the same name is replaced)")
    up.add_argument("--name", help="lab name, 1-5 letters and digits (default lab, or the file's)")
    up.add_argument("--file", help="a lab description (YAML: name, hosts, fibres [[a, b, mbit]], nats {host: "
                                   "[inside, ..]}, network); without it, hosts h1…hN on a line")
    up.add_argument("--hosts", type=int, default=2, help="hosts on the line (default 2)")
    up.add_argument("--rate", type=float, help="shape every fibre to this many Mbit/s (default: unshaped)")
    up.add_argument("--nat", action="store_true", help="put h1 behind a NAT host `nat` (h1 — nat — h2 …)")
    up.add_argument("--network", default="", help="the lab's /16 (default: one of 10.200-10.239.0.0 chosen by "
                                                  "the name)")
    up.add_argument("--no-redis", action="store_true", help="do not relay $SLICEX_REDIS_URL to the hosts")
    up.set_defaults(func=cmd_lab_up)
    down = lab_sub.add_parser("down", help="stop the lab's slicex homes and whatever runs in its hosts, remove it")
    down.add_argument("name", nargs="?", default="lab")
    down.set_defaults(func=cmd_lab_down)
    st = lab_sub.add_parser("status", help="each host, its address and its links (exit 3 if something is missing)")
    st.add_argument("name", nargs="?", default="lab")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_lab_status)
