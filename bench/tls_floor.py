"""GetVersion over mutual TLS, a NEW connection per call: slicex against two floors with the same certificates.

Servers, each in processes of its own, all listening on 127.0.0.1 with the AM's certificate and key and
requiring a client certificate from the same CA bundle slicex's AM trusts:
  slicex       `slicex up` (the embedded deployment, as bench/am_api.py starts it)
  python-noop  a naive Python XML-RPC server (xmlrpc.server, a thread per connection, the TLS handshake in that
               thread) whose one method, GetVersion, returns a fixed value: the document slicex answered
  nginx        nginx (Debian's package, installed by `make bench-deps`), its master and `worker_processes
               auto` workers, answering every POST with slicex's GetVersion reply, byte for byte, from a file
               (a refused POST answered with the file): the C floor
The fixed document is fetched from slicex once, before any clock starts.

The client is bench/am_api.py's (client processes, a TCP connect and a full handshake per call, as omni makes
them); cells are interleaved (for each concurrency: slicex, python-noop, nginx), each timed on its own, and
report calls/s, per-call p50/p99 and the CPU per call of the server's processes (from /proc) and of the
clients. A second table gives slicex's rate as a % of each floor's at the same concurrency in the same round
(a ratio of two measured rates); a third, labelled "model", the CPU-bound ceiling cores / (server + client
CPU per call). Setup (certificates, servers, the clients' TLS contexts) is outside the timed window.

Run: .venv/bin/python bench/tls_floor.py [--servers slicex,python-noop,nginx] [--concurrency 1,4,16]
     [--rounds R] [--seconds S] [--min-calls N]"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import socketserver
import ssl
import subprocess
import sys
import tempfile
import time
import xmlrpc.client
import xmlrpc.server
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import emit, machine, report  # noqa: E402
from bench.am_api import Deployment, _free_port, ceiling_rows, run_cell  # noqa: E402

SERVERS = ("slicex", "python-noop", "nginx")
NGINX = "/usr/sbin/nginx"


# ---- the floors ---------------------------------------------------------------------------------------------
class _NoopXmlRpcServer(socketserver.ThreadingMixIn, xmlrpc.server.SimpleXMLRPCServer):
    """The naive Python server: xmlrpc.server's dispatch and marshalling, a thread per connection, the TLS
    handshake in that thread (not in accept, where it would serialise the handshakes)."""

    daemon_threads = True
    request_queue_size = 128
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], context: ssl.SSLContext):
        self.context = context
        super().__init__(address, logRequests=False, allow_none=True)

    def process_request_thread(self, request: socket.socket, client_address: tuple) -> None:
        try:
            secured = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            self.shutdown_request(request)
            return
        super().process_request_thread(secured, client_address)


def serve_python_noop(port: int, cert: str, key: str, ca: str, document: str) -> None:
    """Run the no-op server until killed (the bench starts it as a process of its own)."""
    from slicex.tls_xmlrpc import server_context  # the same TLS settings as slicex's servers

    (value,), _ = xmlrpc.client.loads(Path(document).read_text())
    server = _NoopXmlRpcServer(("127.0.0.1", port), server_context(cert, key, ca))
    server.register_function(lambda *_args: value, "GetVersion")
    server.serve_forever()


def nginx_config(run: Path, port: int, cert: str, key: str, ca: str) -> str:
    """nginx answering every request on 127.0.0.1:`port` with `run`/getversion.xml (text/xml), over TLS requiring
    a client certificate from `ca`; everything it writes stays in `run`. The document is a file (a `return`
    string is limited to 4 KB): a POST is refused (405) and the refusal answered with the file, status 200,
    the request body discarded."""
    import pwd

    # as root, nginx's workers would run as nobody, who may not read the bench's private temporary directory
    user = f"user {pwd.getpwuid(os.geteuid()).pw_name};\n" if os.geteuid() == 0 else ""
    return f"""daemon off;
{user}master_process on;
worker_processes auto;
pid {run}/nginx.pid;
error_log {run}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {run}/body;
    proxy_temp_path {run}/proxy;
    fastcgi_temp_path {run}/fastcgi;
    uwsgi_temp_path {run}/uwsgi;
    scgi_temp_path {run}/scgi;
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_client_certificate {ca};
        ssl_verify_client on;
        ssl_verify_depth 4;
        ssl_session_tickets off;
        location / {{
            error_page 405 =200 /getversion.xml;
            return 405;
        }}
        location = /getversion.xml {{
            internal;
            root {run};
            types {{ }}
            default_type text/xml;
        }}
    }}
}}
"""


class Floor:
    """A floor server in processes of its own, shaped as bench/am_api.py's Deployment for its run_cell."""

    shared_workers, store, am_workers = 0, None, 1  # as a one-process deployment on no store

    def __init__(self, name: str, proc: subprocess.Popen, url: str, cert: str, key: str):
        self.name, self.procs, self.am_urls, self.sa_url = name, [proc], [url], ""
        self.cert, self.key = cert, key

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _wait_answering(floor: Floor, log: Path, document: str) -> None:
    """Until the floor answers GetVersion with the fixed document (or its process exits: say why)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if floor.procs[0].poll() is not None:
            raise RuntimeError(f"{floor.name} exited with {floor.procs[0].returncode}: {log.read_text()[-2000:]}")
        try:
            if _fetch(floor.am_urls[0], floor.cert, floor.key) == document:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{floor.name} did not answer GetVersion within 30 s: {log.read_text()[-2000:]}")


def _fetch(url: str, cert: str, key: str) -> str:
    """The body a server answers to an XML-RPC GetVersion call, as bytes on the wire (decoded)."""
    from slicex.tls_xmlrpc import client_context

    host, port = url.removeprefix("https://").rstrip("/").split(":")
    conn = http.client.HTTPSConnection(host, int(port), context=client_context(cert, key), timeout=10)
    try:
        conn.request("POST", "/", xmlrpc.client.dumps((), "GetVersion"), {"Content-Type": "text/xml"})
        reply = conn.getresponse()
        body = reply.read().decode()
        if reply.status != 200:
            raise OSError(f"HTTP {reply.status}: {body[:200]}")
        return body
    finally:
        conn.close()


def start_floor(name: str, root: Path, home: Path, document: str) -> Floor:
    """Start the `name` floor with the AM's certificate and key and the CA bundle slicex's AM trusts."""
    from slicex.devpki import roots_bundle
    from slicex.home import Home

    h = Home(home)
    cert, key, ca = str(h.am_cert), str(h.am_key), str(roots_bundle(h))
    user_cert, user_key = str(h.user_cert("bench")), str(h.user_key("bench"))
    run = root / name
    run.mkdir()
    (run / "getversion.xml").write_text(document)
    port = _free_port()
    log = run / "server.log"
    with open(log, "ab") as out:
        if name == "python-noop":
            cmd = [sys.executable, __file__, "--serve-python-noop", str(port), cert, key, ca,
                   str(run / "getversion.xml")]
        else:
            (run / "nginx.conf").write_text(nginx_config(run, port, cert, key, ca))
            cmd = [NGINX, "-p", str(run), "-e", str(run / "error.log"), "-c", str(run / "nginx.conf")]
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    floor = Floor(name, proc, f"https://127.0.0.1:{port}/", user_cert, user_key)
    try:
        _wait_answering(floor, log if name == "python-noop" else run / "error.log", document)
    except Exception:
        floor.stop()
        raise
    return floor


# ---- main -----------------------------------------------------------------------------------------------------
def ratio_rows(rows: list[dict]) -> list[dict]:
    """slicex's measured rate as a % of each floor's, per round and concurrency."""
    by = {(r["round"], r["deployment"], r["concurrency"]): r for r in rows}
    out = []
    for (rnd, server, c), r in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][2])):
        if server != "slicex" or not r.get("rate"):
            continue
        row = {"bench": "tls_floor", "round": rnd, "concurrency": c, "slicex_calls_per_s": r["rate"]}
        for floor in SERVERS[1:]:
            other = by.get((rnd, floor, c))
            if other and other.get("rate"):
                row[f"pct_of_{floor.replace('-', '_')}"] = 100 * r["rate"] / other["rate"]
        out.append(row)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--servers", default=",".join(SERVERS), help="slicex, python-noop, nginx (default all three)")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts")
    p.add_argument("--rounds", type=int, default=1, help="how many times the interleaved sequence runs")
    p.add_argument("--seconds", type=float, default=3.0, help="least measurement time per cell (default 3)")
    p.add_argument("--max-seconds", type=float, default=20.0, help="most measurement time per cell (default 20)")
    p.add_argument("--min-calls", type=int, default=300, help="GetVersion samples wanted per cell (default 300)")
    p.add_argument("--clients", choices=["processes", "threads"], default="processes")
    p.add_argument("--serve-python-noop", nargs=5, metavar=("PORT", "CERT", "KEY", "CA", "DOCUMENT"),
                   help=argparse.SUPPRESS)  # the no-op floor's own process
    args = p.parse_args()
    if args.serve_python_noop:
        port, cert, key, ca, document = args.serve_python_noop
        serve_python_noop(int(port), cert, key, ca, document)
        return 0
    servers = args.servers.split(",")
    unknown = [s for s in servers if s not in SERVERS]
    if unknown:
        p.error(f"--servers: unknown {', '.join(unknown)}; choose from {', '.join(SERVERS)}")
    if "nginx" in servers and not Path(NGINX).exists():
        p.error(f"{NGINX} is missing: `make bench-deps` installs nginx (or leave it out of --servers)")
    args.min_cycles = 0  # run_cell's lifecycle setting; only GetVersion is measured here
    rows: list[dict] = []
    print(f"machine: {machine()}; clients are {args.clients}; each server runs in its own process(es)\n")
    with tempfile.TemporaryDirectory(prefix="slicex-tlsfloor-") as tmp:
        root = Path(tmp)
        slicex = Deployment(root, "slicex").start()
        running: dict[str, Deployment | Floor] = {"slicex": slicex}
        try:
            document = _fetch(slicex.am_urls[0], slicex.cert, slicex.key)
            for name in servers:
                if name != "slicex":
                    running[name] = start_floor(name, root, slicex.homes[0], document)
            n = 0
            for rnd in range(1, args.rounds + 1):
                for c in (int(x) for x in args.concurrency.split(",")):
                    for name in servers:
                        n += 1
                        head = run_cell(running[name], "GetVersion", c, True, args, f"f{n}")[0]
                        head.update({"bench": "tls_floor", "round": rnd, "server_processes": _processes(name)})
                        head.pop("am_workers", None)
                        rows.append(head)
                        print(f"  round {rnd} {name} x{c}: {head['samples']} in {head['wall_s']} s",
                              file=sys.stderr, flush=True)
        finally:
            for server in running.values():
                server.stop()
    report(rows, ["deployment", "round", "concurrency", "rate", "rate_unit", "samples", "p50_ms", "p99_ms",
                  "mean_ms", "server_cpu_ms", "client_cpu_ms", "errors"],
           title="GetVersion over mutual TLS, a new connection per call (measured; deployment = server; "
                 "*_cpu_ms: CPU milliseconds per call)", json_lines=False)
    ratios = ratio_rows(rows)
    report(ratios, ["round", "concurrency", "slicex_calls_per_s", "pct_of_python_noop", "pct_of_nginx"],
           title="slicex's rate as a % of each floor's (ratio of the measured rates above)", json_lines=False)
    model = ceiling_rows(rows)
    report(model, ["deployment", "round", "concurrency", "operation", "rate", "rate_unit"],
           title="Model, not measured: cores / (server + client CPU per call)", json_lines=False)
    emit(rows + ratios + [{**m, "bench": "tls_floor", "model": True} for m in model])
    return 0


def _processes(name: str) -> str:
    """What serves: how many processes, each with its interpreter lock or not."""
    return {"slicex": "1 Python process (embedded)", "python-noop": "1 Python process",
            "nginx": f"nginx master + {os.cpu_count()} workers (auto)"}[name]


if __name__ == "__main__":
    sys.exit(main())
