"""The Slice Exchange Point on a third lab host (lab/, docs/lab.md) joining testbeds on two others: testbed A
(a.test, user alice) a `slicex up` on h1, testbed B (b.test, trusting A's root) on h2, the SEP (`slicex sep
serve`, its certificate from A's CA) on h3, each serving on its host's address; the hosts on a line of fibres
h1 — h2 — h3, so the SEP reaches A across two fibres. One slice spans A and B through the SEP (a node at each
and the stitched link between them on one agreed tag), each testbed holds its half (asked directly), Describe
through the SEP shows both, and Delete leaves nothing at either. B's AM stopped and then killed with SIGKILL
while it holds the SEP's Allocate leaves nothing allocated on any host: A's half is released at once, and
B's is swept by the SEP when B is back.

Needs what the lab needs; skipped, saying which, only where the machine lacks it. Takes the lab chain's
host-wide lock (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import yaml
from lxml import etree

from federation.sep.config import load_config
from federation.sep.sdk import speaks_for_credential
from lab import edge, line, running
from slicex.home import Home
from slicex.store import open_store
from slicex.tls_xmlrpc import client
from tests.integration.test_sep import RSPEC3, STITCH, request, substrate, urn

# switches, servers and routers only inside lab hosts: tests/conftest.py's lab chain, beside the root namespace's
USES_HOST_NETWORK = "lab"

SEP_PORT = 8010


@pytest.fixture(scope="module")
def fed():
    missing = edge.missing_capabilities()
    if missing:
        pytest.skip("the lab needs: " + "; ".join(missing))
    with running(line("tp", hosts=3)) as lab:
        h = {"a": lab.hosts["h1"], "b": lab.hosts["h2"], "sep": lab.hosts["h3"]}
        homes = {}
        for n, user, peer in (("a", "alice", "b"), ("b", "bob", "a")):
            path = h[n].lab_dir / f"{n}-substrate.yaml"  # goes with the lab
            path.write_text(yaml.safe_dump(substrate(n, peer)))
            homes[n] = Home(h[n].make_home(f"{n}.test", users=(user,), dashboard_port=None, am_v2_port=None,
                                           tick_seconds=0.05, substrate=str(path)))
        (homes["b"].trusted_roots / "a-ca.pem").write_bytes(homes["a"].ca_cert.read_bytes())
        for n in ("a", "b"):
            h[n].slicex(homes[n].root, "up", "--detach")
        am = {n: h[n].am_url(homes[n].root) for n in ("a", "b")}
        sep_yaml = h["sep"].lab_dir / "sep" / "sep.yaml"
        h["sep"].slicex(homes["a"].root, "sep", "init", "--config", str(sep_yaml), "--aggregate",
                        f"{urn('a')}={am['a']}", "--aggregate", f"{urn('b')}={am['b']}", "--trust",
                        str(homes["b"].ca_cert), "--host", h["sep"].address, "--port", str(SEP_PORT))
        cfg = yaml.safe_load(sep_yaml.read_text())
        cfg.update(retry_seconds=0.3, timeout_seconds=20)
        sep_yaml.write_text(yaml.safe_dump(cfg))
        log = open(sep_yaml.parent / "serve.log", "ab")
        sep = h["sep"].popen([sys.executable, "-m", "cli", "sep", "serve", "--config", str(sep_yaml)], stdout=log,
                             stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while f"{h['sep'].address}:{SEP_PORT}" not in h["sep"].run(["ss", "-ltnH"]).stdout:
                assert sep.poll() is None and time.monotonic() < deadline, (sep_yaml.parent / "serve.log").read_text()
                time.sleep(0.1)
            alice = homes["a"]
            cert, key = str(alice.user_cert("alice")), str(alice.user_key("alice"))
            sa_port = yaml.safe_load(alice.config_file.read_text()).get("sa_port", 8000)
            yield {"h": h, "am": am, "cert": cert, "key": key, "homes": homes,
                   "sep_store": load_config(sep_yaml).store,
                   "sfa": client(f"https://{h['a'].address}:{sa_port}/", cert, key),
                   "sep": client(f"https://{h['sep'].address}:{SEP_PORT}/", cert, key),
                   "speaksfor": speaks_for_credential(cert, key, (sep_yaml.parent / "sep-cert.pem").read_bytes())}
        finally:
            sep.terminate()
            sep.wait(20)
            log.close()


def test_the_sep_on_a_third_host_spans_one_slice_over_testbeds_on_two_others(fed):
    slice_urn = urn("a", "slice+labspan")
    cred = [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": fed["sfa"].CreateSlice(slice_urn)},
            fed["speaksfor"]]
    sep = fed["sep"]
    out = sep.Allocate(slice_urn, cred, request(), {})
    assert out["code"]["geni_code"] == 0, out["output"]
    assert {s["geni_sliver_urn"].split("+")[1] for s in out["value"]["geni_slivers"]} == {"a.test", "b.test"}
    prov = sep.Provision([slice_urn], cred, {"geni_users": []})
    assert prov["code"]["geni_code"] == 0, prov["output"]
    for domain, node in (("a", "na"), ("b", "nb")):  # each testbed holds its half, asked on its own host
        st = client(fed["am"][domain], fed["cert"], fed["key"]).Status([slice_urn], cred[:1], {})
        assert st["code"]["geni_code"] == 0, st["output"]
        assert {s["geni_client_id"] for s in st["value"]["geni_slivers"]} == {node, "xlink"}
    desc = sep.Describe([slice_urn], cred, {"geni_rspec_version": {"type": "GENI", "version": "3"}})
    assert desc["code"]["geni_code"] == 0, desc["output"]
    manifest = etree.fromstring(desc["value"]["geni_rspec"].encode())
    assert {n.get("client_id") for n in manifest.iter(f"{{{RSPEC3}}}node")} == {"na", "nb"}
    tags = {h.find(f".//{{{STITCH}}}suggestedVLANRange").text for h in manifest.iter(f"{{{STITCH}}}hop")}
    assert len(tags) == 1 and 100 <= int(next(iter(tags))) <= 103
    gone = sep.Delete([slice_urn], cred, {})
    assert gone["code"]["geni_code"] == 0, gone["output"]
    for domain in ("a", "b"):
        st = client(fed["am"][domain], fed["cert"], fed["key"]).Status([slice_urn], cred[:1], {})
        assert st["code"]["geni_code"] == 12


def sep_parts(store_url: str, slice_urn: str) -> dict:
    """Domain -> state of each part of the SEP's transaction for the slice: {} when it has no record, and
    {"record": "present"} for a record without parts."""
    s = open_store(store_url)
    try:
        rec = s.get("sep_slices", slice_urn)
    finally:
        s.close()
    return {} if rec is None else {p["domain"]: p["state"] for p in (rec.get("txn") or {}).get("parts", [])} or {
        "record": "present"}


def test_killing_a_testbeds_am_on_its_host_mid_allocate_leaves_nothing_on_any_host(fed):
    slice_urn = urn("a", "slice+labkill")
    cred = [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": fed["sfa"].CreateSlice(slice_urn)},
            fed["speaksfor"]]
    b_home = fed["homes"]["b"]
    pid = json.loads((b_home.root / "run" / "slicex.pid").read_text())["pid"]
    os.kill(pid, signal.SIGSTOP)  # B takes the SEP's Allocate into its socket queue and never answers it
    answer: dict = {}
    t = threading.Thread(target=lambda: answer.update(fed["sep"].Allocate(slice_urn, cred, request(link=False), {})))
    try:
        t.start()
        deadline = time.monotonic() + 20
        while sep_parts(fed["sep_store"], slice_urn) != {"a.test": "done", "b.test": "pending"}:
            assert time.monotonic() < deadline, sep_parts(fed["sep_store"], slice_urn)
            time.sleep(0.05)
    finally:
        os.kill(pid, signal.SIGKILL)
        t.join(30)
    assert answer["code"]["geni_code"] == 11, answer
    status_a = client(fed["am"]["a"], fed["cert"], fed["key"]).Status([slice_urn], cred[:1], {})
    assert status_a["code"]["geni_code"] == 12  # A's half, on h1, released at once
    fed["h"]["b"].slicex(b_home.root, "up", "--detach")  # B is back on h2: the SEP sweeps what B holds
    deadline = time.monotonic() + 30
    while sep_parts(fed["sep_store"], slice_urn) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sep_parts(fed["sep_store"], slice_urn) == {}
    for domain in ("a", "b"):
        st = client(fed["am"][domain], fed["cert"], fed["key"]).Status([slice_urn], cred[:1], {})
        assert st["code"]["geni_code"] == 12, (domain, st)
