"""`slicex peer add|list|remove` (federation peers in slicex.yaml) and `slicex ca export-root` (this
deployment's root, to hand to a peer). The format is slicex/peers.py's; docs/federation.md "Peers".

Each command is a function of parsed arguments returning an exit status (0 done, 2 a mistake in what was
asked), so `cli/main.py` only registers them."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives import hashes

from slicex import pki
from slicex.home import Home
from slicex.peers import PeerConfigError, load_peers, parse_peer, peer_config


def _home(args: argparse.Namespace) -> Home:
    return Home(Path(args.home)) if getattr(args, "home", None) else Home()


def _raw_config(home: Home) -> dict[str, Any]:
    return (yaml.safe_load(home.config_file.read_text()) or {}) if home.config_file.exists() else {}


def set_block(text: str, key: str, value: Any) -> str:
    """`text` (slicex.yaml) with the top-level `key:` block replaced by `value` in block style (removed when
    empty), or appended; every other line, the operator's comments included, is kept."""
    block = yaml.safe_dump({key: value}, sort_keys=False, default_flow_style=False).splitlines() if value else []
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(rf"^{re.escape(key)}\s*:", line)), None)
    if start is None:
        return "\n".join(lines + block) + "\n"
    end = start + 1
    while end < len(lines) and (lines[end][:1] in (" ", "\t") or (not lines[end].strip() and end + 1 < len(lines)
                                                                 and lines[end + 1][:1] in (" ", "\t"))):
        end += 1
    return "\n".join(lines[:start] + block + lines[end:]) + "\n"


def _write_peers(home: Home, peers: dict[str, Any]) -> None:
    text = home.config_file.read_text() if home.config_file.exists() else ""
    home.config_file.write_text(set_block(text, "peers", peers))


def cmd_peer_add(args: argparse.Namespace) -> int:
    home = _home(args)
    raw = _raw_config(home)
    cfg = home.config()
    peers = dict(raw.get("peers") or {})
    if args.name in peers and not args.force:
        print(f"peer {args.name} exists in {home.config_file}; use --force to replace it", file=sys.stderr)
        return 2
    source = Path(args.root).expanduser()
    if not source.is_file() or not pki.load_certs(source.read_bytes()):
        print(f"--root {args.root}: not a PEM certificate file", file=sys.stderr)
        return 2
    target = home.root / "peers" / f"{args.name}.pem"
    entry: dict[str, Any] = {"root": str(target.relative_to(home.root))}
    if args.namespace:
        entry["namespaces"] = args.namespace
    for key in ("trust_roots_url", "ch_url", "refresh_seconds"):
        if getattr(args, key) is not None:
            entry[key] = getattr(args, key)
    if args.am_url:
        try:
            entry["am_urls"] = dict(item.split("=", 1) for item in args.am_url)
        except ValueError:
            print("--am-url: give URN=URL", file=sys.stderr)
            return 2
    policy: dict[str, Any] = {}
    if args.aggregate:
        policy["aggregates"] = args.aggregate
    if args.sliver_type:
        policy["sliver_types"] = args.sliver_type
    for key in ("max_lease_hours", "max_slivers", "max_nodes", "max_cores"):
        if getattr(args, key) is not None:
            policy[key] = getattr(args, key)
    if policy:
        entry["policy"] = policy
    staged = home.root / "peers" / f".{args.name}.pem.new"
    staged.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, staged)
    try:  # check it exactly as `slicex up` will read it, beside the other peers, before writing anything
        parse_peer(args.name, {**entry, "root": str(staged.relative_to(home.root))}, home.root,
                   cfg.authority)
        others = {k: v for k, v in peers.items() if k != args.name}
        load_peers({**others, args.name: {**entry, "root": str(staged.relative_to(home.root))}}, cfg.authority,
                   home.root)
    except PeerConfigError as exc:
        staged.unlink()
        print(f"error: {exc.message.replace(str(staged.relative_to(home.root)), args.root)}", file=sys.stderr)
        return 2
    staged.replace(target)
    peer = parse_peer(args.name, entry, home.root, cfg.authority)
    peers[args.name] = peer_config(peer, home.root)
    _write_peers(home, peers)
    print(f"peer {args.name}: root {target}, namespaces {', '.join(peer.namespaces)}; recorded in "
          f"{home.config_file}. Restart `slicex up` to apply.")
    return 0


def cmd_peer_remove(args: argparse.Namespace) -> int:
    home = _home(args)
    peers = dict(_raw_config(home).get("peers") or {})
    if args.name not in peers:
        print(f"no peer {args.name} in {home.config_file}", file=sys.stderr)
        return 2
    del peers[args.name]
    _write_peers(home, peers)
    print(f"peer {args.name} removed from {home.config_file} (its root file stays); restart `slicex up` to apply")
    return 0


def _describe(peer: Any) -> dict[str, Any]:
    certs = pki.load_certs(peer.root.read_bytes())
    out = {"name": peer.name, "namespaces": list(peer.namespaces), "root": str(peer.root),
           "root_urns": [pki.cert_urn(c) or c.subject.rfc4514_string() for c in certs],
           "root_sha256": [c.fingerprint(hashes.SHA256()).hex() for c in certs],
           "fetch": peer.trust_roots_url or peer.ch_url or "",
           "refresh_seconds": int(peer.refresh.total_seconds()) if peer.fetches else None,
           "am_urls": dict(peer.am_urls), "policy": peer.policy.to_config()}
    return out


def cmd_peer_list(args: argparse.Namespace) -> int:
    home = _home(args)
    try:
        cfg = home.config()
        peers = load_peers(cfg.peers, cfg.authority, home.root)
    except PeerConfigError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    described = [_describe(p) for p in peers]
    if args.json:
        print(json.dumps(described, indent=2))
        return 0
    if not peers:
        print(f"no peers in {home.config_file}")
        return 0
    for d in described:
        policy = d["policy"]
        limits = ", ".join(f"{k} {v}" for k, v in policy.items() if k.startswith("max_")) or "none"
        print(f"{d['name']}")
        print(f"  namespaces    {', '.join(d['namespaces'])}")
        print(f"  root          {d['root']} ({', '.join(d['root_urns'])}; sha256 {d['root_sha256'][0][:16]}…)")
        print(f"  refreshed     {(d['fetch'] + ' every ' + str(d['refresh_seconds']) + ' s') if d['fetch'] else 'no'}")
        print(f"  aggregates    {', '.join(policy['aggregates'])}")
        print(f"  sliver types  {', '.join(policy['sliver_types'])}")
        print(f"  limits        {limits}")
    return 0


def cmd_ca_export_root(args: argparse.Namespace) -> int:
    home = _home(args)
    if not home.ca_cert.exists():
        print(f"no CA in {home.root}: run `slicex ca init` first", file=sys.stderr)
        return 2
    pem = home.ca_cert.read_bytes()
    cert = pki.load_cert(pem)
    namespace = pki.urn_authority(cert) or home.config().authority
    if args.out:
        Path(args.out).write_bytes(pem)
        print(f"wrote {args.out}: root of namespace {namespace}. A peer adds it with\n  slicex peer add NAME "
              f"--root {Path(args.out).name} --namespace {namespace}", file=sys.stderr)
    else:
        sys.stdout.write(pem.decode())
    return 0


def add_ca_export_root(ca_subparsers: Any) -> None:
    """Register `ca export-root` on the `ca` command's subparsers."""
    ex = ca_subparsers.add_parser("export-root", help="print (or write) this deployment's root CA certificate, "
                                                      "to hand to a federation peer")
    ex.add_argument("--out", help="write it to this file instead of standard output")
    ex.set_defaults(func=cmd_ca_export_root)


def add_peer_commands(subparsers: Any) -> None:
    """Register `peer add|list|remove` on the main parser's subparsers; each sets `func`."""
    p = subparsers.add_parser("peer", help="federation peers: other testbeds whose users may use this aggregate",
                              description="Federation peers in slicex.yaml `peers:` (docs/federation.md, Peers). "
                                          "Changes apply when `slicex up` next starts.")
    sub = p.add_subparsers(dest="peer_command", required=True)
    add = sub.add_parser("add", help="trust a peer's root for its namespace(s), with a policy")
    add.add_argument("name", help="the peer's name (letters, digits, '.', '_', '-')")
    add.add_argument("--root", required=True, help="the peer's root CA certificate (PEM), e.g. from its "
                                                   "`slicex ca export-root`; copied to $SLICEX_HOME/peers/NAME.pem")
    add.add_argument("--namespace", action="append", metavar="NS",
                     help="URN authority the root may vouch for (repeat for more; default: the root's own)")
    add.add_argument("--trust-roots-url", help="refresh the root from this PEM bundle URL (http or https)")
    add.add_argument("--ch-url", help="refresh the root from this CH API's get_trust_roots (e.g. "
                                      "https://host:8007/CH)")
    add.add_argument("--refresh-seconds", type=int, help="how often to refresh (default 3600)")
    add.add_argument("--am-url", action="append", metavar="URN=URL", help="one of the peer's aggregates "
                                                                          "(for clients such as the SEP)")
    add.add_argument("--aggregate", action="append", metavar="URN",
                     help="policy: an aggregate URN of ours its users may use (repeat; default all)")
    add.add_argument("--sliver-type", action="append", metavar="TYPE",
                     help="policy: a sliver type its users may ask for (repeat; default all)")
    add.add_argument("--max-lease-hours", type=float, help="policy: latest sliver expiry, hours from now")
    add.add_argument("--max-slivers", type=int, help="policy: live slivers of its users at once")
    add.add_argument("--max-nodes", type=int, help="policy: live nodes of its users at once")
    add.add_argument("--max-cores", type=int, help="policy: cores held by its users' nodes at once")
    add.add_argument("--force", action="store_true", help="replace an existing peer of that name")
    add.set_defaults(func=cmd_peer_add)
    ls = sub.add_parser("list", help="the configured peers, their roots and policies")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_peer_list)
    rm = sub.add_parser("remove", help="forget a peer")
    rm.add_argument("name")
    rm.set_defaults(func=cmd_peer_remove)
