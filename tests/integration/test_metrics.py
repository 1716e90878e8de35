"""Prometheus /metrics on the dashboard's port and the request id in JSON logs, on both deployments: AM API
calls made as omni makes them, then /metrics scraped over HTTP as Prometheus does."""

from __future__ import annotations

import io
import json
import logging
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from operations.metrics import Metrics, StateSample
from rspec.substrate import default_substrate
from slicex import logs
from slicex.config import parse_config
from slicex.home import Home
from tests.factories import request_rspec, vm
from tests.integration.conftest import AUTHORITY, Running, deployment
from tests.integration.test_am_api import code, ok

V3 = {"geni_rspec_version": {"type": "GENI", "version": "3"}}


@pytest.fixture(params=["embedded", "distributed"])
def served(request, pki_home: Home, tmp_path: Path) -> Iterator[Running]:
    """A deployment of each kind with its dashboard (and so /metrics) on a free port."""
    yield from deployment(request.param, pki_home, tmp_path, dashboard_port=0, metrics_interval_seconds=0)


def scrape(r: Running) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics over HTTP: {(sample name, sorted labels): value}."""
    assert r.deployment.dashboard_url
    with urllib.request.urlopen(r.deployment.dashboard_url + "metrics", timeout=10) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_count_am_calls_failures_and_what_is_held(served):
    alice = served.user("alice")
    urn, creds = alice.slice_credential("metrics")
    before = scrape(served)
    ok(alice.am.GetVersion())
    ok(alice.am.ListResources(alice.user_credential(), V3))
    ok(alice.am.Allocate(urn, creds, request_rspec(
        [vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0"])],
        [{"client_id": "lan0", "ifaces": ["n1:if0", "n2:if0"]}]), {}))
    # three bare-metal nodes where there are two: refused (InsufficientNodes), nothing held
    refused = alice.am.Allocate(urn, creds, request_rspec(
        [{"client_id": f"b{i}", "sliver_type": "raw-pc"} for i in range(3)]), {})
    assert code(refused) != 0
    after = scrape(served)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("slicex_am_requests_total", method="GetVersion", code="0") == 1
    assert moved("slicex_am_requests_total", method="ListResources", code="0") == 1
    assert moved("slicex_am_requests_total", method="Allocate", code="0") == 1
    assert moved("slicex_am_requests_total", method="Allocate", code=str(code(refused))) == 1
    assert moved("slicex_am_request_duration_seconds_count", method="Allocate", code="0") == 1
    assert moved("slicex_am_request_duration_seconds_sum", method="Allocate", code="0") > 0
    assert moved("slicex_am_request_duration_seconds_bucket", method="Allocate", code="0", le="+Inf") == 1
    assert moved("slicex_allocation_failures_total", reason="InsufficientNodes") == 1
    # the state: three reservations ticketed (2 nodes + the LAN), 2 cores and the LAN's tag in use on rack1
    assert value(after, "slicex_state_readable") == 1
    assert value(after, "slicex_reservations", state="Ticketed") == 3
    assert value(after, "slicex_tickets_outstanding") == 3
    assert value(after, "slicex_leases_outstanding") == 0
    assert value(after, "slicex_units_in_use", site="rack1", kind="core") == 2
    assert value(after, "slicex_units_total", site="rack1", kind="core") == 48
    assert value(after, "slicex_vlan_tags_in_use", site="rack1", switch="sw1") == 1
    assert value(after, "slicex_vlan_tags_total", site="rack1", switch="sw1") == 100
    assert value(after, "slicex_reservations_pending", operation="Ticketing") == 0
    ok(alice.am.Provision([urn], creds, {}))
    provisioned = scrape(served)
    assert value(provisioned, "slicex_leases_outstanding") == 3
    assert value(provisioned, "slicex_am_requests_total", method="Provision", code="0") == 1


def test_unknown_method_names_do_not_grow_the_label_set(served):
    alice = served.user("alice")
    for name in ("Bogus1", "Bogus2"):
        assert code(getattr(alice.am, name)()) != 0
    samples = scrape(served)
    assert value(samples, "slicex_am_requests_total", method="other", code="13") == 2
    assert not any(("method", n) in labels for (_, labels) in samples for n in ("Bogus1", "Bogus2"))


def test_two_deployments_in_one_process_do_not_share_counters():
    one, two = (Metrics(default_substrate(AUTHORITY), StateSample) for _ in range(2))
    one.observe("GetVersion", 0, 0.01)
    assert b'slicex_am_requests_total{code="0",method="GetVersion"} 1.0' in one.exposition()
    assert b"slicex_am_requests_total{" not in two.exposition()


@pytest.fixture
def json_logs() -> Iterator[io.StringIO]:
    """The root logger as `log_format: json` sets it up, into a buffer."""
    buf = io.StringIO()
    root = logging.getLogger()
    saved = root.level
    logs.configure(parse_config({"log_format": "json"}), buf)
    try:
        yield buf
    finally:
        for h in [h for h in root.handlers if getattr(h, "slicex", False)]:
            root.removeHandler(h)
        root.setLevel(saved)


def test_one_request_id_in_json_lines_at_the_am_and_at_the_broker(served, json_logs):
    alice = served.user("alice")
    urn, creds = alice.slice_credential("traced")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("n1")]), {}))
    lines = [json.loads(line) for line in json_logs.getvalue().splitlines() if line.strip()]
    am = [x for x in lines if x["logger"] == "slicex.am" and x["message"].startswith("Allocate -> 0")]
    assert len(am) == 1 and len(am[0]["request_id"]) == 16
    rid = am[0]["request_id"]
    broker = [x for x in lines if x["logger"] == "slicex.broker" and x["request_id"] == rid]
    # the broker's call line: "broker.place" in process, "place -> 0 in … ms from <the AM's URN>" as a server
    assert any(x["message"].startswith(("broker.place", "place -> 0")) for x in broker), lines
    assert {"time", "level", "logger", "message", "request_id"} <= set(am[0])
