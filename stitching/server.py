"""`slicex scs`: the path computation service over plain-HTTP XML-RPC, as omni's stitcher calls it
(`--scsURL http://HOST:PORT/geni/xmlrpc`; the stitcher sends no client certificate to an http URL).

A thin edge: it reads the topology (reloading the file when it changes), hands each call to
stitching.scs.compute_path, and logs what it answered.

Anyone who can reach the port may call it, inside the `slicex up` process, so the server is the AM's bounded
one (slicex/tls_xmlrpc.py) over plain HTTP: a body over `MAX_BODY_BYTES` is answered TOOBIG (6) from its
Content-Length before it is read, and `PATH_SERVICE_LIMITS` close idle sockets, cut connections that trickle,
and serve a bounded number at once (more are closed unserved)."""

from __future__ import annotations

import logging
import threading
import xmlrpc.client
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from slicex.endpoint import Endpoint, Faults, method
from slicex.errors import BadArgs, GeniError, TooBig
from slicex.tls_xmlrpc import STOP_POLL_SECONDS, ConnectionLimits, XmlRpcServer
from stitching.model import Topology
from stitching.scs import compute_path
from stitching.topology import TopologyError, load_topology

log = logging.getLogger("slicex.scs")

MAX_BODY_BYTES = 2 * 1024 * 1024
"""A ComputePath request is one request RSpec; the largest stitched requests are tens of KB."""
PATH_SERVICE_LIMITS = ConnectionLimits(idle_seconds=15.0, lifetime_seconds=120.0, max_connections=16)
"""At most 16 connections at once (16 threads, 16 × 2 MB of bodies), each closed after 15 s without a byte and
cut after 2 minutes: omni's stitcher makes one short call at a time."""


def _error(code: int, message: str) -> dict[str, Any]:
    return {"code": {"geni_code": code}, "output": message}


class UnknownMethod(BadArgs):
    """A method the path service does not offer: answered as a fault, as it always was."""


@dataclass(frozen=True)
class PathServiceAnswers(Faults):
    """The path service's answers, as the stitcher reads them: a method's value as it is, a refusal or a
    request refused before a method as `{code: {geni_code}, output}` like ComputePath's own, an unknown
    method as a fault (the stitcher's ServerProxy raises it)."""

    service: str = "this path service"
    unknown: type[GeniError] = UnknownMethod

    def refused(self, method: str, err: Exception) -> Any:
        assert isinstance(err, GeniError)
        if isinstance(err, UnknownMethod):
            return xmlrpc.client.Fault(err.code, err.message)
        return _error(err.code, err.message)

    def failed(self, method: str, exc: Exception) -> Any:
        return _error(BadArgs.code, f"server failed in {method}: {type(exc).__name__}")

    def rejected(self, message: str, too_big: bool) -> Any:
        """A request refused before it reached a method, as a result the stitcher reads like ComputePath's own."""
        return _error(TooBig.code if too_big else BadArgs.code, message)

    def code_of(self, answer: Any) -> int:
        return answer.faultCode if isinstance(answer, xmlrpc.client.Fault) else int(answer["code"]["geni_code"])


class TopologySource:
    """The topology file, re-read when its modification time changes (an operator edits it in place); a file
    that no longer reads keeps the last good topology and says why in the log."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self._mtime = path.stat().st_mtime
        self._topo = load_topology(path)

    def get(self) -> Topology:
        with self._lock:
            try:
                mtime = self.path.stat().st_mtime
                if mtime != self._mtime:
                    self._topo, self._mtime = load_topology(self.path), mtime
                    log.info("reloaded topology %s: %d aggregates, %d ports", self.path,
                             len(self._topo.aggregates), len(self._topo.ports))
            except (OSError, TopologyError) as exc:
                log.error("keeping the previous topology: %s", exc)
            return self._topo


def make_server(topology: Callable[[], Topology], host: str = "127.0.0.1", port: int = 8081,
                limits: ConnectionLimits = PATH_SERVICE_LIMITS) -> XmlRpcServer:
    """An XML-RPC server answering ComputePath (and GetVersion, ListAggregates for scs.py's own main)."""

    def ComputePath(_caller: Any, params: Any) -> dict[str, Any]:  # noqa: N802 - the GENI SCS method name
        result = compute_path(topology(), params, datetime.now(UTC))
        code = result["code"]["geni_code"]
        log.info("ComputePath %s -> %s %s", params.get("slice_urn") if isinstance(params, dict) else "?", code,
                 result.get("output") or ",".join(result.get("value", {}).get("workflow_data", {})))
        return result

    def GetVersion(*_: Any) -> dict[str, Any]:  # noqa: N802
        return {"code": {"geni_code": 0}, "output": "",
                "value": {"interface_version": "2", "code_tag": "slicex", "slicex_extensions": {
                    "qinq": "http://slicex.dev/rspec/ext/qinq/1"}}}

    def ListAggregates(*_: Any) -> dict[str, Any]:  # noqa: N802
        topo = topology()
        return {"code": {"geni_code": 0}, "output": "",
                "value": {"geni_aggregate_list": {a.urn: {"urn": a.urn, "url": a.url}
                                                  for a in topo.aggregates.values()}}}

    methods = [method(call.__name__, call, needs_certificate=False) for call in (ComputePath, GetVersion,
                                                                                ListAggregates)]
    server = XmlRpcServer((host, port), max_body=MAX_BODY_BYTES, limits=limits)
    return server.answer(Endpoint("scs", methods, PathServiceAnswers()))


def serve(topology_file: Path, host: str, port: int) -> int:
    """Run until interrupted; prints the URL to give the stitcher."""
    source = TopologySource(topology_file)
    server = make_server(source.get, host, port)
    topo = source.get()
    print(f"slicex scs: http://{host}:{server.server_address[1]}/geni/xmlrpc ({len(topo.aggregates)} aggregates, "
          f"{len(topo.ports)} ports from {topology_file}); give it to stitcher.py as --scsURL", flush=True)
    try:
        server.serve_forever(poll_interval=STOP_POLL_SECONDS)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
