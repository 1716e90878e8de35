"""AM API throughput: GetVersion and full-lifecycle (Allocate→Provision→Status→Delete) calls per second with
p50/p99 latency at concurrency 1, 4 and 16, against a real deployment on 127.0.0.1 over mutual TLS.

Run: .venv/bin/python bench/am_api.py [--seconds N]"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from am.service import EmbeddedDeployment  # noqa: E402
from bench._common import report, summarise  # noqa: E402
from slicex.devpki import add_user, init_ca  # noqa: E402
from slicex.home import Home  # noqa: E402
from slicex.tls_xmlrpc import client  # noqa: E402

AUTH = "bench.slicex"
REQUEST = ('<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">'
           '<node client_id="n1"><sliver_type name="default-vm"/></node></rspec>')


def setup(root: Path) -> tuple[Home, EmbeddedDeployment]:
    home = Home(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / "slicex.yaml").write_text(yaml.safe_dump({"authority": AUTH, "sa_port": 0, "am_port": 0, "dashboard_port": None}))
    init_ca(home, AUTH)
    add_user(home, AUTH, "bench")
    d = EmbeddedDeployment(home)
    d.start()
    return home, d


def run(concurrency: int, seconds: float, work) -> tuple[list[float], float]:
    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def worker(i: int) -> None:
        state = work.prepare(i)
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            work.call(state)
            dt = time.perf_counter() - t0
            with lock:
                latencies.append(dt)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, time.perf_counter() - t0


class GetVersion:
    def __init__(self, home: Home, d: EmbeddedDeployment):
        self.home, self.d = home, d

    def prepare(self, i: int):
        return client(self.d.endpoints.am_url, str(self.home.user_cert("bench")), str(self.home.user_key("bench")))

    def call(self, am) -> None:
        assert am.GetVersion()["code"]["geni_code"] == 0


class Lifecycle:
    def __init__(self, home: Home, d: EmbeddedDeployment):
        self.home, self.d = home, d

    def prepare(self, i: int):
        cert, key = str(self.home.user_cert("bench")), str(self.home.user_key("bench"))
        am = client(self.d.endpoints.am_url, cert, key)
        sa = client(self.d.endpoints.sa_url, cert, key)
        urn = f"urn:publicid:IDN+{AUTH}+slice+bench{i}"
        creds = [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": sa.CreateSlice(urn)}]
        return am, urn, creds

    def call(self, state) -> None:
        am, urn, creds = state
        for reply in (am.Allocate(urn, creds, REQUEST, {}), am.Provision([urn], creds, {}),
                      am.Status([urn], creds, {}), am.Delete([urn], creds, {})):
            if reply["code"]["geni_code"] != 0:
                raise RuntimeError(reply["output"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=5.0, help="measurement time per cell (default 5)")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        home, d = setup(Path(tmp))
        try:
            for name, work in (("GetVersion", GetVersion(home, d)), ("lifecycle", Lifecycle(home, d))):
                for c in (int(x) for x in args.concurrency.split(",")):
                    lat, wall = run(c, args.seconds, work)
                    rows.append({"bench": "am_api", "operation": name, "concurrency": c, **summarise(lat, wall)})
        finally:
            d.stop()
    report(rows, ["operation", "concurrency", "calls", "per_second", "p50_ms", "p99_ms"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
