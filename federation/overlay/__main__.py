"""Command line for the overlay: define a namespace, list its claims, run a cluster's virtual router.

  python -m federation.overlay define NAMESPACE NETWORK [--lease S] [--reserve IP ...]
  python -m federation.overlay show NAMESPACE
  python -m federation.overlay undefine NAMESPACE
  python -m federation.overlay router NAMESPACE --cluster C [--listen HOST:PORT] [--advertise HOST[:PORT]]
                                    [--dataplane auto|offload|plain] --node id=ID,netns=NS,tap=IF,mac=MAC[,address=IP] ...

The store is the Redis database in --redis (default $SLICEX_REDIS_URL, else redis://127.0.0.1:6379/0).
`router` runs until SIGTERM or SIGINT, then releases its nodes' claims; it prints one JSON line when ready
({"endpoint", "dataplane", "nodes": {id: address}}) and one JSON line of counters on SIGUSR1."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
from ipaddress import IPv4Address

from federation.overlay import tap
from federation.overlay.claims import DEFAULT_PREFIX, RedisClaims
from federation.overlay.core import Holder, Lease, NamespaceConfig, Phase
from federation.overlay.keeper import LeaseKeeper
from federation.overlay.router import Port, VirtualRouter
from slicex.errors import BadArgs, GeniError

log = logging.getLogger("federation.overlay")
SO_SNDBUFFORCE, SO_RCVBUFFORCE = 32, 33  # Linux; not in the socket module
SOCKET_BUFFER = 16 << 20


def _node_spec(text: str) -> dict[str, str]:
    try:
        spec = dict(part.split("=", 1) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: use id=ID,netns=NS,tap=IF,mac=MAC[,address=IP][,rate=KBPS]") from None
    missing = {"id", "netns", "tap", "mac"} - spec.keys()
    if missing:
        raise argparse.ArgumentTypeError(f"{text!r} lacks {', '.join(sorted(missing))}")
    if spec.get("rate") and not spec["rate"].isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: rate {spec['rate']!r} is not a whole number of kbps")
    if spec.get("address"):
        try:
            IPv4Address(spec["address"])
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: address {spec['address']!r} is not IPv4") from None
    return spec


def _listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host, int(port)


def run_router(claims: RedisClaims, namespace: str, cluster: str, listen: tuple[str, int],
               nodes: list[dict[str, str]], stop: threading.Event, advertise: str | None = None,
               offload: bool = False) -> int:
    """`offload`: the fast data plane (taps pass super-frames, tap.open_tap); else one frame per call."""
    config = claims.namespace(namespace)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for forced, plain in ((SO_RCVBUFFORCE, socket.SO_RCVBUF), (SO_SNDBUFFORCE, socket.SO_SNDBUF)):
        try:  # as root, past net.core.[rw]mem_max: a burst of super-frames must not overflow the socket
            sock.setsockopt(socket.SOL_SOCKET, forced, SOCKET_BUFFER)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, plain, SOCKET_BUFFER)
    sock.bind(listen)
    router = VirtualRouter(claims, config, cluster, sock, advertise=advertise)
    keepers: list[LeaseKeeper] = []
    fds: list[int] = []
    plen = config.network.prefixlen
    try:
        ready: dict[str, str] = {}
        for spec in nodes:
            holder = Holder(spec["id"], router.endpoint, cluster, spec["mac"].lower())
            fd = tap.open_tap(spec["tap"], offload)
            fds.append(fd)
            tap.place(spec["tap"], spec["netns"], holder.mac)
            if spec.get("rate"):  # the link's capacity, on what this node sends (the other end holds the rest)
                tap.shape(spec["netns"], spec["tap"], int(spec["rate"]))

            def changed(lease: Lease, spec: dict[str, str] = spec) -> None:
                if lease.phase is Phase.LOST and lease.address is not None:
                    log.error("node %s lost %s: %s", spec["id"], lease.address, lease.reason)
                    tap.drop_address(spec["netns"], spec["tap"], str(lease.address), plen)

            keeper = LeaseKeeper(claims, config, holder, on_change=changed)
            preferred = IPv4Address(spec["address"]) if spec.get("address") else None
            address = keeper.acquire(preferred)
            keepers.append(keeper)
            tap.set_address(spec["netns"], spec["tap"], str(address), plen)
            keeper.start()
            router.add_port(Port(holder.node, fd, bytes.fromhex(holder.mac.replace(":", "")), offload))
            ready[holder.node] = str(address)
        by_node = {k.holder.node: k for k in keepers}

        def gone(port: Port) -> None:
            keeper = by_node[port.node]
            try:
                released = keeper.leave()
            except GeniError as exc:
                log.warning("node %s is gone; releasing its claim: %s", port.node, exc.message)
                return
            log.info("node %s is gone (its namespace was deleted); claim %s", port.node,
                     "released" if released else "had already lapsed")

        router.on_port_gone = gone
        print(json.dumps({"endpoint": router.endpoint, "dataplane": "offload" if offload else "plain",
                          "nodes": ready}), flush=True)
        want_stats = threading.Event()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, lambda *_: want_stats.set())

        def tick() -> None:
            if want_stats.is_set():
                want_stats.clear()
                leases = {k.holder.node: k.lease.phase.value for k in keepers}
                print(json.dumps({"stats": dict(router.stats), "leases": leases,
                                  "renewals": sum(k.renewals for k in keepers)}), flush=True)

        router.serve(stop, tick)
        return 0
    finally:
        for k in keepers:
            try:
                k.leave()
            except GeniError as exc:
                log.warning("releasing %s: %s", k.holder.node, exc.message)
        for fd in fds:
            os.close(fd)
        sock.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m federation.overlay", description=__doc__.splitlines()[0])
    p.add_argument("--redis", default=os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/0"),
                   help="the shared claim store (default $SLICEX_REDIS_URL, else redis://127.0.0.1:6379/0)")
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help=f"key prefix in the store (default {DEFAULT_PREFIX})")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("define", help="define a namespace (a slice's overlay)")
    d.add_argument("namespace")
    d.add_argument("network", help="IPv4 network, e.g. 10.77.0.0/24")
    d.add_argument("--lease", type=float, default=60.0, help="lease seconds (default 60; renewed every quarter)")
    d.add_argument("--reserve", action="append", default=[], help="an address no node may claim")
    s = sub.add_parser("show", help="the namespace and its live claims")
    s.add_argument("namespace")
    u = sub.add_parser("undefine", help="delete a namespace and all its claims")
    u.add_argument("namespace")
    r = sub.add_parser("router", help="run a cluster's virtual router (needs root: taps, namespaces)")
    r.add_argument("namespace", help="a defined overlay namespace")
    r.add_argument("--cluster", required=True, help="the segment this router serves (recorded in its claims)")
    r.add_argument("--listen", type=_listen, default=("127.0.0.1", 0), help="UDP HOST:PORT (default 127.0.0.1:0)")
    r.add_argument("--advertise", help="HOST[:PORT] other routers reach this one at, when not where it listens "
                                       "(behind a NAT: the NAT's outside address; the port defaults to the bound one, "
                                       "which a masquerade keeps); docs/federation.md")
    r.add_argument("--dataplane", choices=("auto", "offload", "plain"), default="auto",
                   help="offload: taps pass TCP super-frames with their offload header (virtio_net_hdr), up to "
                        "64 KiB per datagram; plain: one frame per system call (the portable fallback); auto "
                        "(default): offload when this host's taps can (probed at start)")
    r.add_argument("--node", type=_node_spec, action="append", required=True,
                   help="id=ID,netns=NS,tap=IF,mac=MAC[,address=IP]: a node in existing namespace NS; the router "
                        "makes tap IF there and claims IP (else a free address); repeat per node")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    claims = RedisClaims(args.redis, args.prefix)
    try:
        if args.command == "define":
            cfg = claims.define(NamespaceConfig.build(args.namespace, args.network, args.lease, args.reserve))
            print(f"namespace {cfg.name}: {cfg.network}, lease {cfg.lease:g} s, "
                  f"{len(cfg.candidates())} claimable addresses")
        elif args.command == "show":
            cfg = claims.namespace(args.namespace)
            print(f"namespace {cfg.name}: {cfg.network}, lease {cfg.lease:g} s")
            for address, h in sorted(claims.holders(cfg.name).items()):
                left = claims.remaining(cfg.name, address)
                print(f"  {address}  node {h.node}  cluster {h.cluster}  router {h.endpoint}  mac {h.mac}  "
                      f"{'expired' if left is None else f'{left:.1f} s left'}")
        elif args.command == "undefine":
            print(f"removed {claims.undefine(args.namespace)} keys")
        else:
            if tap.missing():
                raise BadArgs("the overlay data plane cannot run here: " + "; ".join(tap.missing()))
            if args.dataplane == "offload" and tap.offload() != "ok":
                raise BadArgs(f"--dataplane offload: {tap.offload()}")
            offload = args.dataplane == "offload" or (args.dataplane == "auto" and tap.offload() == "ok")
            if args.dataplane == "auto" and not offload:
                log.info("taps here cannot pass super-frames (%s): one frame per system call", tap.offload())
            stop = threading.Event()
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
            return run_router(claims, args.namespace, args.cluster, args.listen, args.node, stop, args.advertise,
                              offload)
        return 0
    except GeniError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    finally:
        claims.close()


if __name__ == "__main__":
    sys.exit(main())
