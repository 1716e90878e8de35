"""`slicex sep init|serve|speaksfor`: the Slice Exchange Point (federation/sep/, docs/federation.md).

`init` issues the exchange point's certificate from this home's CA and writes sep.yaml naming the domains'
AMs; `serve` runs it in the foreground; `speaksfor` signs a user's speaks-for credential for a running one
(what lets it act for the user at each domain). cli/main.py only calls `add_sep_command(subparsers)`."""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import yaml

from slicex.home import Home


def _home(args: argparse.Namespace) -> Home:
    return Home(Path(args.home)) if getattr(args, "home", None) else Home()


def cmd_init(args: argparse.Namespace) -> int:
    from cryptography.hazmat.primitives import hashes

    from slicex import pki
    from slicex.peers import PeerConfigError, load_peers

    home = _home(args)
    if not home.ca_key.exists():
        print(f"no CA key in {home.root}: run `slicex ca init` first (the exchange point's certificate is issued "
              f"by this home's CA)", file=sys.stderr)
        return 2
    config = Path(args.config)
    if config.exists() and not args.force:
        print(f"{config} exists (use --force to rewrite it)", file=sys.stderr)
        return 2
    domains = []
    for entry in args.aggregate:
        urn, sep, url = entry.partition("=")
        if not sep or not urn.startswith("urn:publicid:IDN+") or not url.startswith("https://"):
            print(f"--aggregate {entry!r}: expected AM_URN=https://HOST:PORT/", file=sys.stderr)
            return 2
        domains.append({"urn": urn, "url": url})
    base = config.parent
    base.mkdir(parents=True, exist_ok=True)
    authority = home.config().authority
    urn = f"urn:publicid:IDN+{authority}+tool+sep"  # a tool acting for users, not an authority: it issues nothing
    cert, key = pki.issue_certificate(home.ca_cert.read_bytes(), home.ca_key.read_bytes(), urn,
                                      f"{authority} slice exchange point", days=3650)
    pki.write_cert(base / "sep-cert.pem", cert)
    pki.write_key(base / "sep-key.pem", key)
    roots = base / "trusted_roots"
    roots.mkdir(exist_ok=True)
    for f in sorted(home.trusted_roots.glob("*")):
        if f.suffix in (".pem", ".crt"):
            shutil.copyfile(f, roots / f.name)
    namespaces: dict[str, Any] = dict(home.config().trusted_root_namespaces)
    try:
        peers = load_peers(home.config().peers, authority, home.root)
    except PeerConfigError as exc:
        print(f"slicex sep init: {exc.message}", file=sys.stderr)
        return 2
    # the home's peers, each root bound to the namespaces the home binds it to (as its AM does): bound only by
    # its own URN, a root naming a wider authority would vouch here for other peers' names, or ours
    peer_roots: dict[bytes, str] = {}
    for peer in peers:
        name = f"peer-{peer.name}.pem"
        shutil.copyfile(peer.root, roots / name)
        namespaces[name] = list(peer.namespaces)
        for cert in pki.load_certs(peer.root.read_bytes()):
            peer_roots[cert.fingerprint(hashes.SHA256())] = peer.name
    for f in args.trust or []:
        certs = pki.load_certs(Path(f).read_bytes())
        if certs and all(c.fingerprint(hashes.SHA256()) in peer_roots for c in certs):
            print(f"--trust {f}: the root of peer {peer_roots[certs[0].fingerprint(hashes.SHA256())]}, already "
                  f"trusted for that peer's namespaces only")
            continue
        shutil.copyfile(f, roots / Path(f).name)
    cfg = {"host": args.host, "port": args.port, "cert": "sep-cert.pem", "key": "sep-key.pem",
           "trusted_roots": ["trusted_roots"], "store": args.store, "aggregates": domains,
           "timeout_seconds": 120, "retry_seconds": 5}
    if namespaces:
        cfg["trusted_root_namespaces"] = namespaces
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    print(f"wrote {config} ({urn}, {len(domains)} domains); trusted roots in {roots}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from federation.sep.config import SepConfigError, load_config
    from federation.sep.overlay import OverlayUnavailable
    from federation.sep.server import SepServer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        server = SepServer(load_config(args.config), port=args.port)
    except (SepConfigError, OverlayUnavailable, OSError) as exc:
        print(f"slicex sep: {exc}", file=sys.stderr)
        return 2
    url = server.start()
    print(f"slicex sep: {url} ({server.sep.urn}; domains: "
          f"{', '.join(d.urn for d in server.cfg.domains)})", flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    server.stop()
    return 0


def cmd_speaksfor(args: argparse.Namespace) -> int:
    from federation.sep.sdk import sep_certificate, speaks_for_credential

    if not args.url and not args.sep_cert:
        print("slicex sep speaksfor: give --url (the running exchange point) or --sep-cert", file=sys.stderr)
        return 2
    home = _home(args)
    cert, key = home.user_cert(args.user), home.user_key(args.user)
    if not cert.exists():
        print(f"no user {args.user} in {home.root}", file=sys.stderr)
        return 2
    try:
        sep_pem = Path(args.sep_cert).read_bytes() if args.sep_cert else sep_certificate(args.url, str(cert), str(key))
    except OSError as exc:
        print(f"slicex sep speaksfor: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 2
    cred = speaks_for_credential(cert, key, sep_pem, args.days)
    out = Path(args.out) if args.out else home.root / f"{args.user}-speaksfor-sep.xml"
    out.write_text(cred["geni_value"])
    if args.json:
        print(json.dumps(cred))
    else:
        print(f"wrote {out}: {args.user}'s speaks-for credential for the exchange point ({args.days} days)")
    return 0


def add_sep_command(sub: argparse._SubParsersAction) -> None:
    sep = sub.add_parser("sep", help="the Slice Exchange Point: one AM API v3 endpoint through which a slice "
                                     "spans testbeds (docs/federation.md)")
    sep_sub = sep.add_subparsers(dest="sep_command", required=True)
    init = sep_sub.add_parser("init", help="issue the exchange point's certificate from this home's CA and write "
                                           "sep.yaml")
    init.add_argument("--config", required=True, help="sep.yaml to write (cert, key, trusted_roots/ go beside it)")
    init.add_argument("--aggregate", action="append", required=True, metavar="AM_URN=URL",
                      help="a domain's aggregate (repeat for each testbed)")
    init.add_argument("--trust", action="append", metavar="PEM",
                      help="another root certificate to trust, for the namespace in its own URN (this home's "
                           "trusted_roots/ are copied, and its peers' roots bound to their namespaces)")
    init.add_argument("--host", default="127.0.0.1")
    init.add_argument("--port", type=int, default=8010)
    init.add_argument("--store", default="sep.db",
                      help="where the cross-domain slice record lives: a SQLite file beside sep.yaml (default "
                           "sep.db) or redis://HOST:PORT/DB")
    init.add_argument("--force", action="store_true", help="rewrite an existing sep.yaml and certificate")
    init.set_defaults(func=cmd_init)
    serve = sep_sub.add_parser("serve", help="run the exchange point in the foreground (rolls back what a crash "
                                             "left unfinished first)")
    serve.add_argument("--config", required=True)
    serve.add_argument("--port", type=int, help="override sep.yaml's port (0: any free port)")
    serve.set_defaults(func=cmd_serve)
    sf = sep_sub.add_parser("speaksfor", help="sign a user's speaks-for credential for the exchange point (pass it "
                                              "with your slice credential)")
    sf.add_argument("--url", help="the exchange point's URL (its certificate is read from its TLS handshake)")
    sf.add_argument("--sep-cert", help="the exchange point's certificate file, instead of --url")
    sf.add_argument("--user", default="alice")
    sf.add_argument("--days", type=int, default=30)
    sf.add_argument("--out", help="file to write (default $SLICEX_HOME/<user>-speaksfor-sep.xml)")
    sf.add_argument("--json", action="store_true", help="also print the AM API credential struct as JSON")
    sf.set_defaults(func=cmd_speaksfor)
