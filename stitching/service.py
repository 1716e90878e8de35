"""The path service inside `slicex up`: when slicex.yaml has an `scs:` section, the deployment also serves
ComputePath (stitching/server.py) over plain HTTP on its own port, in a thread of the `up` process, and
records its URL so `slicex status` shows it.

    scs:
      topology: topology.yaml   # the operator's topology file (stitching/topology.py), relative to the home
      host: 127.0.0.1           # default: the deployment's host
      port: 8081                # default 8081; 0 picks a free port

It is the same service as `slicex scs --topology FILE`; the topology file is re-read when it changes."""

from __future__ import annotations

import threading
import xmlrpc.client
from pathlib import Path
from typing import Any

from slicex.config import SlicexConfig
from stitching.server import TopologySource, make_server
from stitching.topology import TopologyError


class PathService:
    """ComputePath over the operator's topology file, served from a thread until `stop`."""

    def __init__(self, topology: Path, host: str, port: int):
        self.source = TopologySource(topology)  # TopologyError now, at `up`, if the file does not read
        self.server = make_server(self.source.get, host, port)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/geni/xmlrpc"

    def start(self) -> str:
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="slicex-scs", daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        if self._thread is None:
            self.server.server_close()
            return
        self.server.close()  # stops serving and cuts the connections kept alive
        self._thread.join(5)

    def describe(self) -> str:
        topo = self.source.get()
        return f"{self.url} ({len(topo.aggregates)} aggregates, {len(topo.ports)} ports from {self.source.path})"


def from_config(cfg: SlicexConfig, home_root: Path) -> PathService | None:
    """The path service slicex.yaml asks for (`scs:`), not yet started; None without an `scs:` section.
    TopologyError names what is wrong with the topology file (the section's keys were checked as the file
    was read)."""
    opts = cfg.scs
    if opts is None:
        return None
    path = Path(opts.topology)
    path = path if path.is_absolute() else home_root / path
    if not path.is_file():
        raise TopologyError(f"slicex.yaml scs: topology file {path} does not exist")
    port = opts.port
    try:
        return PathService(path, opts.host or cfg.host, port)
    except OSError as exc:
        raise TopologyError(f"slicex.yaml scs: cannot serve on port {port}: {exc.strerror or exc}") from None


class _Transport(xmlrpc.client.Transport):
    def __init__(self, timeout: float):
        super().__init__()
        self.timeout = timeout

    def make_connection(self, host: Any) -> Any:
        conn = super().make_connection(host)
        conn.timeout = self.timeout
        return conn


def answering(url: str, timeout: float = 2.0) -> bool:
    """Whether a path service answers GetVersion at `url` (for `slicex status`)."""
    try:
        return xmlrpc.client.ServerProxy(url, transport=_Transport(timeout)).GetVersion()["code"]["geni_code"] == 0
    except (OSError, xmlrpc.client.Error, KeyError, TypeError):
        return False
