"""The AM API's own CPU per call: the sliver lifecycle (Allocate → Provision → Status → Delete of a 1-node slice)
dispatched in this process through the XML-RPC parse and marshal, with no TLS, no sockets and one thread.

What `bench/am_api.py` measures is this plus the edge (the TLS handshake, HTTP, the connection's thread, the
kernel's loopback); this bench takes the edge away, so a change below it (the slice manager, broker, authority,
store, credential checks, signatures, logging) shows without the 10-25 % run-to-run spread of a served cell,
and `--profile FILE` writes a cProfile of the timed cycles (pstats) for finding where it goes.

Set-up (a temporary SLICEX_HOME made with `slicex ca init` and `slicex user add`, the embedded deployment
built as `slicex up` builds it but not serving, the slice credential, --warmup cycles) is outside the timed
window. Each call's CPU is this thread's CPU time across the call (time.thread_time), its wall time beside it;
a cycle is the sum of its four calls. Rounds repeat the timed window so their spread shows.

Run: .venv/bin/python bench/am_dispatch.py [--cycles 300] [--rounds 5] [--store URL] [--profile FILE]"""

from __future__ import annotations

import argparse
import cProfile
import subprocess
import sys
import tempfile
import time
import xmlrpc.client
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from bench._common import machine, report  # noqa: E402
from bench.am_api import AUTH, LIFECYCLE, REQUEST, USER  # noqa: E402 - the served bench's slice, user and request
from bench.stats import summarise  # noqa: E402


def _home(root: Path, store: str | None) -> Path:
    home = root / "home"
    home.mkdir()
    cfg: dict[str, object] = {"authority": AUTH, "host": "127.0.0.1", "dashboard_port": None,
                              **{k: 0 for k in ("sa_port", "am_port", "am_v2_port", "chapi_port", "broker_port",
                                                "authority_port")}}
    if store:
        cfg["store"] = store
    (home / "slicex.yaml").write_text(yaml.safe_dump(cfg))
    for args in (["ca", "init", "--authority", AUTH], ["user", "add", USER]):
        subprocess.run([sys.executable, "-m", "cli", "--home", str(home), *args], check=True, capture_output=True)
    return home


class InProcess:
    """The embedded deployment's AM and slice authority surfaces, called as their server calls them."""

    def __init__(self, home: Path, log_file: Path):
        from deployment.service import EmbeddedDeployment
        from slicex import logs, pki
        from slicex.home import Home
        from slicex.tls_xmlrpc import parse_call

        self._parse = parse_call
        h = Home(home)
        self.dep = EmbeddedDeployment(h)
        self._log = open(log_file, "w")  # noqa: SIM115 - open while the bench runs; logs as `slicex up` writes them
        logs.configure(h.config(), stream=self._log)
        self.cert = pki.load_cert((home / f"{USER}-cert.pem").read_bytes())
        self.am, self.sa = self.dep._am_server, self.dep._sa_server

    def call(self, method: str, *params: object) -> dict:
        """One AM API call from the bytes a client sends to the bytes it gets back."""
        body = xmlrpc.client.dumps(params, method, allow_none=True).encode()
        parsed, name = self._parse(body)
        answer = self.am.dispatch(name or "", parsed, self.cert)
        xmlrpc.client.dumps((answer,), methodresponse=True, allow_none=True)
        return answer

    def close(self) -> None:
        for server in (self.am, self.sa, getattr(self.dep, "_am_v2_server", None)):
            if server is not None:
                server.server_close()
        self._log.close()


def run(args: argparse.Namespace) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="slicex-dispatch-") as tmp:
        root = Path(tmp)
        am = InProcess(_home(root, args.store), root / "slicex.log")
        try:
            urn = f"urn:publicid:IDN+{AUTH}+slice+dispatch"
            creds = [{"geni_type": "geni_sfa", "geni_version": "3",
                      "geni_value": am.sa.dispatch("CreateSlice", (urn,), am.cert)}]
            params = {"Allocate": (urn, creds, REQUEST, {}), "Provision": ([urn], creds, {}),
                      "Status": ([urn], creds, {}), "Delete": ([urn], creds, {})}

            def cycle(cpu: dict[str, list[float]], wall: dict[str, list[float]]) -> None:
                total_cpu = total_wall = 0.0
                for step in LIFECYCLE:
                    c0, w0 = time.thread_time(), time.perf_counter()
                    answer = am.call(step, *params[step])
                    c1, w1 = time.thread_time(), time.perf_counter()
                    if answer["code"]["geni_code"] != 0:
                        raise RuntimeError(f"{step}: {answer['code']} {answer.get('output')}")
                    cpu[step].append(c1 - c0)
                    wall[step].append(w1 - w0)
                    total_cpu, total_wall = total_cpu + c1 - c0, total_wall + w1 - w0
                cpu["cycle"].append(total_cpu)
                wall["cycle"].append(total_wall)

            scratch: dict[str, list[float]] = {k: [] for k in (*LIFECYCLE, "cycle")}
            for _ in range(args.warmup):
                cycle(scratch, dict(scratch))
            rows = []
            profile = cProfile.Profile() if args.profile else None
            for rnd in range(1, args.rounds + 1):
                cpu: dict[str, list[float]] = {k: [] for k in (*LIFECYCLE, "cycle")}
                wall: dict[str, list[float]] = {k: [] for k in (*LIFECYCLE, "cycle")}
                if profile is not None:
                    profile.enable()
                for _ in range(args.cycles):
                    cycle(cpu, wall)
                if profile is not None:
                    profile.disable()
                for what in ("cycle", *LIFECYCLE):
                    c = summarise(cpu[what], None, (50, 90, 99), rate_unit=None)
                    w = summarise(wall[what], None, (50,), rate_unit=None)
                    rows.append({"bench": "am_dispatch", "round": rnd, "what": what if what == "cycle" else f"  {what}",
                                 "samples": c["samples"], "cpu_mean_ms": c["mean_ms"], "cpu_p50_ms": c["p50_ms"],
                                 "cpu_p90_ms": c["p90_ms"], "cpu_p99_ms": c["p99_ms"], "wall_p50_ms": w["p50_ms"],
                                 "store": args.store or "sqlite (embedded)"})
            if profile is not None:
                profile.dump_stats(args.profile)
            return rows
        finally:
            am.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=300, help="lifecycles per round (default 300)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    parser.add_argument("--warmup", type=int, default=50, help="untimed cycles first (default 50)")
    parser.add_argument("--store", help="slicex.yaml `store:` (e.g. redis://127.0.0.1:6379/7); default: SQLite")
    parser.add_argument("--profile", metavar="FILE", help="write a cProfile of the timed cycles (pstats format)")
    args = parser.parse_args()
    print(f"AM API dispatched in-process, no TLS and no sockets (measured; {machine()}; CPU ms of this thread)")
    rows = run(args)
    report(rows, ["what", "round", "samples", "cpu_mean_ms", "cpu_p50_ms", "cpu_p90_ms", "cpu_p99_ms", "wall_p50_ms",
                  "store"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
