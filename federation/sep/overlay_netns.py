"""The overlay for netns testbeds on this host: joins a cross-domain link's two nodes through the IPOP-style
overlay of federation/overlay/ (one overlay namespace per link; per testbed, a virtual router process with a
tap in the node's network namespace; the address claimed atomically in Redis, renewed at a quarter lease).

It finds a node's network namespace the way the netns driver names it (`netns_name(prefix, sliver URN)`),
so it needs each testbed's netns prefix. Each testbed's router runs where that testbed runs: a `Placement`
answers, per testbed, the argv prefix that runs a command on its host *in place* (the router's pid is the one
started, so `leave` can stop it: `nsenter --net=/run/netns/H`, `ip netns exec H`; empty: the exchange point's
own host), the address:port its UDP socket binds, and the address other routers reach it at (behind a NAT,
the NAT's outside address). The default placement reads `where:` (below); another is named by
`placement: "module:factory"` (called with overlay_options). A host the exchange point reaches only over the
network (ssh) is not built: stopping its router needs the remote pid. sep.yaml:

    overlay: "federation.sep.overlay_netns:make_overlay"
    overlay_options:
      redis: redis://127.0.0.1:6379/0     # the overlay's shared claim store
      network: 10.78.0.0/24               # each link's overlay namespace (keep it apart from the slices' own)
      lease_seconds: 60
      netns_prefixes: {a.test: PREFIX_A, b.test: PREFIX_B}   # slicex.yaml netns: prefix of each testbed
      log_dir: run/overlay                # the routers' logs (default: run/overlay beside sep.yaml)
      where:                              # optional: where each testbed's router runs (default: here)
        a.test: {run: [nsenter, --net=/run/netns/HOST_A], listen: "10.0.0.1:0", advertise: 10.0.0.9}

Each router logs to `<log_dir>/<tap>.log`, removed with the link (`leave`), so logs neither outlive their
slice nor grow across runs.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any, Protocol

from authority.substrate.netns_plan import netns_name
from federation.overlay import tap
from federation.overlay.claims import RedisClaims
from federation.overlay.core import NamespaceConfig
from federation.sep.overlay import Endpoint
from federation.sep.split import domain_key
from slicex.errors import BadArgs, ServerError, Unsupported

READY_SECONDS = 30.0


def _h(*parts: str, n: int = 10) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:n]


def link_namespace(slice_urn: str, link_id: str) -> str:
    """The overlay namespace (its claims in Redis) of one cross-domain link of one slice."""
    return f"sep-{_h(slice_urn, link_id, n=16)}"


@dataclass(frozen=True)
class RouterPlace:
    """Where one testbed's router runs: `run` (argv prefix that executes it on the testbed's host in place),
    `listen` (HOST:PORT its UDP socket binds; "" the router's default), `advertise` (the address other routers
    reach it at; "" the listening one)."""

    run: tuple[str, ...] = ()
    listen: str = ""
    advertise: str = ""

    def argv(self) -> list[str]:
        """What the router's command line gets from its place (before the router subcommand)."""
        return [*(["--listen", self.listen] if self.listen else []),
                *(["--advertise", self.advertise] if self.advertise else [])]


class Placement(Protocol):
    def place(self, testbed: str) -> RouterPlace:
        """Where the router of `testbed` (a domain key, e.g. a.test) runs."""
        ...


class StaticPlacement:
    """Places from overlay_options `where:` (testbed -> {run, listen, advertise}); a testbed it does not name
    runs its router on the exchange point's own host."""

    def __init__(self, where: Mapping[str, Any]):
        self.places: dict[str, RouterPlace] = {}
        for testbed, place in dict(where or {}).items():
            unknown = set(place) - {"run", "listen", "advertise"}
            if unknown:
                raise BadArgs(f"overlay_options where: {testbed}: unknown key(s) {', '.join(sorted(unknown))} "
                              f"(known: run, listen, advertise)")
            run = place.get("run") or ()
            if isinstance(run, str) or not all(isinstance(a, str) for a in run):
                raise BadArgs(f"overlay_options where: {testbed}: run must be a list of strings (an argv prefix)")
            self.places[domain_key(testbed)] = RouterPlace(tuple(run), str(place.get("listen") or ""),
                                                           str(place.get("advertise") or ""))

    def place(self, testbed: str) -> RouterPlace:
        return self.places.get(domain_key(testbed), RouterPlace())


def static_placement(options: Mapping[str, Any]) -> StaticPlacement:
    return StaticPlacement(options.get("where") or {})


def load_placement(options: Mapping[str, Any]) -> Placement:
    """The placement overlay_options name (`placement: "module:factory"`), else the one reading `where:`."""
    spec = str(options.get("placement") or "")
    if not spec:
        return static_placement(options)
    module, _, factory = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), factory or "make_placement")(options)
    except (ImportError, AttributeError) as exc:
        raise BadArgs(f"overlay_options placement {spec!r} cannot be loaded: {exc}") from None


class NetnsOverlay:
    def __init__(self, options: Mapping[str, Any]):
        try:
            self.redis = str(options.get("redis") or os.environ.get("SLICEX_REDIS_URL") or "redis://127.0.0.1:6379/0")
            self.network = IPv4Network(str(options["network"]), strict=True)
            self.lease = float(options.get("lease_seconds", 60))
            self.prefixes = {domain_key(k): str(v) for k, v in dict(options["netns_prefixes"]).items()}
            self.log_dir = Path(str(options.get("log_dir") or "run/overlay"))
        except (KeyError, TypeError, ValueError) as exc:
            raise BadArgs(f"overlay_options: {exc}; give network and netns_prefixes (see "
                          f"federation/sep/overlay_netns.py)") from None
        self.placement = load_placement(options)
        self.pool = NamespaceConfig.build("sep-links", str(self.network), self.lease)  # what every link's namespace is
        self._procs: dict[int, subprocess.Popen] = {}

    def admit(self, link_id: str, addresses: Mapping[str, str], capacity_kbps: int) -> None:
        """Refuse at Allocate what the routers would fail on at Provision (which rolls the whole slice back):
        an address the overlay reserves, one address asked for twice, a host that cannot run the data plane
        or cannot hold the link to its capacity."""
        reserved = ", ".join(str(a) for a in sorted(self.pool.always_reserved))
        seen: dict[IPv4Address, str] = {}
        for iface, text in sorted(addresses.items()):
            try:
                address = IPv4Address(text)
            except ValueError:
                continue  # not IPv4: the overlay picks the address (as it does outside its network)
            if address not in self.network:
                continue
            if not self.pool.claimable(address):
                raise BadArgs(f"overlay link {link_id}: interface {iface} asks for {address}, which the overlay "
                              f"reserves in {self.network} (reserved: {reserved}); ask for another address of "
                              f"{self.network}, or none and the overlay picks one")
            if address in seen:
                raise BadArgs(f"overlay link {link_id}: interfaces {seen[address]} and {iface} both ask for "
                              f"{address}")
            seen[address] = iface
        if tap.missing():
            raise Unsupported(f"overlay link {link_id}: this exchange point's host cannot run the overlay's data "
                              f"plane ({'; '.join(tap.missing())}). Nothing was allocated")
        if capacity_kbps and tap.shaping() != "ok":
            raise Unsupported(f"overlay link {link_id} asks for {capacity_kbps} kbps, and this exchange point's "
                              f"host cannot hold an overlay link to a capacity ({tap.shaping()}); ask for none, "
                              f"or use a host with tc's tbf. Nothing was allocated")

    def join(self, slice_urn: str, link_id: str, a: Endpoint, b: Endpoint) -> dict[str, Any]:
        ns = link_namespace(slice_urn, link_id)
        claims = RedisClaims(self.redis)
        try:
            claims.define(NamespaceConfig.build(ns, str(self.network), self.lease))
        finally:
            claims.close()
        routers: dict[str, Any] = {}
        joined = {"namespace": ns, "network": str(self.network), "routers": routers}
        try:
            for ep in (a, b):
                routers[ep.node] = self._router(ns, slice_urn, link_id, ep)
        except Exception:
            self.leave(slice_urn, link_id, joined)
            raise
        return joined

    def _router(self, ns: str, slice_urn: str, link_id: str, ep: Endpoint) -> dict[str, Any]:
        cluster = domain_key(ep.domain)
        prefix = self.prefixes.get(cluster)
        if prefix is None or not ep.sliver_urn:
            raise BadArgs(f"overlay: node {ep.node} at {ep.domain}: "
                          f"{'no sliver URN in its manifest' if prefix else 'no netns prefix configured for it'}")
        netns = netns_name(prefix, ep.sliver_urn)
        tap_name = "ov" + _h(slice_urn, link_id, ep.node, n=11)
        mac = "02:" + ":".join(_h(ns, ep.node, n=10)[i:i + 2] for i in range(0, 10, 2))
        spec = f"id={ep.node},netns={netns},tap={tap_name},mac={mac}" + (f",rate={ep.capacity_kbps}" if ep.capacity_kbps
                                                                      else "")
        try:
            if ep.ip and IPv4Address(ep.ip) in self.network:
                spec += f",address={ep.ip}"
        except ValueError:
            pass
        self.log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        log = self.log_dir / f"{tap_name}.log"  # the router logs here, not into a pipe; removed by leave()
        with open(log, "wb") as err:
            place = self.placement.place(cluster)
            proc = subprocess.Popen([*place.run, sys.executable, "-m", "federation.overlay", "--redis", self.redis,
                                     "router", ns, "--cluster", cluster, *place.argv(), "--node", spec],
                                    stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
        self._procs[proc.pid] = proc
        ready, _, _ = select.select([proc.stdout], [], [], READY_SECONDS)
        line = proc.stdout.readline() if ready else ""  # type: ignore[union-attr]
        if not line:
            proc.kill()
            raise ServerError(f"overlay router for {ep.node} did not start: {log.read_text()[-500:].strip() or 'no answer'}")
        info = json.loads(line)
        return {"pid": proc.pid, "cluster": cluster, "netns": netns, "tap": tap_name, "endpoint": info["endpoint"],
                "address": info["nodes"][ep.node], "log": str(log.resolve())}

    def leave(self, slice_urn: str, link_id: str, joined: Mapping[str, Any]) -> None:
        ns = joined.get("namespace") or link_namespace(slice_urn, link_id)
        for r in dict(joined.get("routers") or {}).values():
            self._stop(int(r["pid"]), ns)
            logs = [Path(r["log"])] if r.get("log") else []
            # where routers of earlier versions logged, appending run after run
            logs.append(Path(tempfile.gettempdir()) / f"slicex-sep-overlay-{r.get('tap', '')}.log")
            for log in logs:
                log.unlink(missing_ok=True)
        claims = RedisClaims(self.redis)
        try:
            claims.undefine(ns)
        finally:
            claims.close()

    def _stop(self, pid: int, ns: str) -> None:
        """SIGTERM the router (it releases its claims), only if that pid still runs this namespace's router."""
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            return
        if b"federation.overlay" not in cmd or ns.encode() not in cmd:
            return
        os.kill(pid, signal.SIGTERM)
        proc = self._procs.pop(pid, None)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if proc is not None:
                if proc.poll() is not None:
                    return
            elif not os.path.exists(f"/proc/{pid}"):
                return
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)


def make_overlay(options: Mapping[str, Any]) -> NetnsOverlay:
    return NetnsOverlay(options)
