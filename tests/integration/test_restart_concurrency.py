"""A process that has just started answers its first concurrent requests like any later ones: start-up work
(schema compiles) is done once, before serving, and never by several request threads at once."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from slicex.home import Home
from slicex.tls_xmlrpc import client
from tests.factories import request_rspec, vm
from tests.integration.test_cli_processes import configure, slicex

# Eight threads validate at once as the first thing a fresh interpreter does (what eight Allocates arriving
# together right after a restart did). Before the compile lock, 2 to 20 fresh processes in a hundred (more
# under load) ended with XMLSchemaParseError or crashed in libxml2.
FIRST_VALIDATIONS = """
import threading
from rspec.validate import validate_rspec
from tests.factories import request_rspec, vm
doc = request_rspec([vm("a")])
barrier = threading.Barrier(8)
results = []
def go():
    barrier.wait()
    try:
        results.append(validate_rspec(doc, "request"))
    except Exception as exc:
        results.append(repr(exc))
threads = [threading.Thread(target=go) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
print("OK" if results == [[]] * 8 else f"BROKEN {results}")
"""


def test_eight_first_validations_at_once_succeed_in_every_fresh_process(root: Path | None = None):
    root = root or Path(__file__).resolve().parents[2]
    outcomes = []
    for _batch in range(20):
        procs = [subprocess.Popen([sys.executable, "-c", FIRST_VALIDATIONS], cwd=root, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for _ in range(2)]
        for p in procs:
            out, _ = p.communicate(timeout=60)
            outcomes.append((p.returncode, out.strip().splitlines()[-1] if out.strip() else ""))
    broken = [o for o in outcomes if o != (0, "OK")]
    assert not broken, f"{len(broken)} of {len(outcomes)} fresh processes could not validate: {broken[:3]}"


def test_schemas_are_compiled_by_one_thread_at_a_time_and_once(monkeypatch):
    """The deterministic form of the race above: compiles are slowed down so that unguarded ones overlap."""
    import time

    from lxml import etree

    from rspec import validate

    real = etree.XMLSchema
    inside, most, compiled = [0], [0], []
    guard = threading.Lock()

    def slow_compile(*args, **kwargs):
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.05)
        try:
            schema = real(*args, **kwargs)
            compiled.append(schema)
            return schema
        finally:
            with guard:
                inside[0] -= 1

    monkeypatch.setattr(validate, "_schemas", {})
    monkeypatch.setattr(validate.etree, "XMLSchema", slow_compile)
    barrier = threading.Barrier(8)
    errors: list[str] = []

    def first_validation(i: int) -> None:
        barrier.wait()
        try:
            validate.schema_for(validate.KINDS[i % 3])
            assert validate.validate_rspec(request_rspec([vm("a")]), "request") == []
        except Exception as exc:  # noqa: BLE001 - collected and reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=first_validation, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and most[0] == 1 and len(compiled) == 3


def test_eight_allocates_arriving_together_right_after_a_restart_all_succeed(tmp_path):
    home = tmp_path / "home"
    ports = configure(home, "restart.test")
    assert slicex(home, "up", "--detach").returncode == 0
    try:
        h = Home(home)
        cert, key = str(h.user_cert("alice")), str(h.user_key("alice"))
        sa = client(f"https://127.0.0.1:{ports['sa_port']}/", cert, key)
        slices = [f"urn:publicid:IDN+restart.test+slice+r{i}" for i in range(8)]
        creds = {urn: [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": sa.CreateSlice(urn)}]
                 for urn in slices}
        assert slicex(home, "down").returncode == 0
        up = slicex(home, "up", "--detach")
        assert up.returncode == 0, up.stdout + up.stderr
        barrier = threading.Barrier(8)
        replies: dict[str, dict] = {}

        def allocate(urn: str) -> None:
            am = client(f"https://127.0.0.1:{ports['am_port']}/", cert, key)
            barrier.wait()
            replies[urn] = am.Allocate(urn, creds[urn], request_rspec([vm("n")]), {})

        threads = [threading.Thread(target=allocate, args=(urn,)) for urn in slices]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert {urn: r["code"]["geni_code"] for urn, r in replies.items()} == dict.fromkeys(slices, 0), \
            [r["output"] for r in replies.values() if r["code"]["geni_code"]]
    finally:
        slicex(home, "down")


def test_a_process_that_cannot_validate_requests_says_so_on_its_health_endpoint(pki_home, tmp_path, monkeypatch):
    import json
    import urllib.error
    import urllib.request

    from rspec import validate
    from tests.integration.test_dashboard import deployment

    with deployment(pki_home, tmp_path, dashboard_port=0) as r:
        url = r.deployment.dashboard_url + "health"
        with urllib.request.urlopen(url, timeout=10) as reply:
            # store: the deployment record read and a document written; disk: the SQLite store's has room
            assert reply.status == 200 and json.load(reply) == {"serving": True, "checks": {
                "rspec": "ok", "store": "ok", "disk": "ok"}}
        # what a corrupted libxml2 did: the request schema no longer accepts a valid request
        broken = validate.etree.XMLSchema(validate.etree.fromstring(
            b'<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema"><xs:element name="nothing"/></xs:schema>'))
        monkeypatch.setitem(validate._schemas, "request", broken)
        try:
            urllib.request.urlopen(url, timeout=10)
            raise AssertionError("health answered 200 for a process that cannot validate requests")
        except urllib.error.HTTPError as exc:
            report = json.load(exc)
            assert exc.code == 503 and not report["serving"]
            assert "request validation is broken" in report["checks"]["rspec"] and report["checks"]["store"] == "ok"
