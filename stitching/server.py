"""`slicex scs`: the path computation service over plain-HTTP XML-RPC, as omni's stitcher calls it
(`--scsURL http://HOST:PORT/geni/xmlrpc`; the stitcher sends no client certificate to an http URL).

A thin edge: it reads the topology (reloading the file when it changes), hands each call to
stitching.scs.compute_path, and logs what it answered."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from xmlrpc.server import SimpleXMLRPCRequestHandler, SimpleXMLRPCServer

from stitching.model import Topology
from stitching.scs import compute_path
from stitching.topology import TopologyError, load_topology

log = logging.getLogger("slicex.scs")
RPC_PATHS = ("/", "/RPC2", "/geni/xmlrpc")


class _Handler(SimpleXMLRPCRequestHandler):
    rpc_paths = RPC_PATHS

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("%s " + format, self.address_string(), *args)


class _Server(ThreadingMixIn, SimpleXMLRPCServer):
    daemon_threads = True
    allow_reuse_address = True


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


def make_server(topology: Callable[[], Topology], host: str = "127.0.0.1", port: int = 8081) -> _Server:
    """An XML-RPC server answering ComputePath (and GetVersion, ListAggregates for scs.py's own main)."""
    server = _Server((host, port), requestHandler=_Handler, allow_none=False, logRequests=False)

    def ComputePath(params: Any) -> dict[str, Any]:  # noqa: N802 - the GENI SCS method name
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

    server.register_function(ComputePath, "ComputePath")
    server.register_function(GetVersion, "GetVersion")
    server.register_function(ListAggregates, "ListAggregates")
    return server


def serve(topology_file: Path, host: str, port: int) -> int:
    """Run until interrupted; prints the URL to give the stitcher."""
    source = TopologySource(topology_file)
    server = make_server(source.get, host, port)
    topo = source.get()
    print(f"slicex scs: http://{host}:{server.server_address[1]}/geni/xmlrpc ({len(topo.aggregates)} aggregates, "
          f"{len(topo.ports)} ports from {topology_file}); give it to stitcher.py as --scsURL", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
