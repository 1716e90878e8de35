"""A deployment on a Redis that Sentinel manages (issue 37): `store: redis+sentinel://...` with one primary, one
replica and three sentinels on 127.0.0.1; `slicex up` (distributed, and embedded); three slices provisioned
through the AM API; the primary killed (kill -9); an Allocate succeeds within 30 s, every call before it
answered BUSY (14) with a reason (never a fault, never another code), every slice is still described, and
after deleting them all nothing is left: no claim (units, VLAN tags), no claim counter, nothing pending.

SLICEX_SENTINEL_PORT_BASE=N runs the five Redis processes on ports N..N+4 (a machine whose Redis ports are
shared out); by default they take free ports."""

from __future__ import annotations

import os
import shutil
import time
import xmlrpc.client
from pathlib import Path

import pytest

from lab.redis_ha import Node, RedisHa
from tests.integration.test_chaos import REQUEST, Deployment, _wait
from tests.ports import free_ports

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")

FAILOVER_S = 30
RSPEC_V3 = {"type": "GENI", "version": "3"}


def redis_ha(root: Path, replicas: int = 1, **kw) -> RedisHa:
    """A primary, `replicas` replicas and three sentinels on 127.0.0.1."""
    n = 1 + replicas + 3
    base = os.environ.get("SLICEX_SENTINEL_PORT_BASE")
    ports = list(range(int(base), int(base) + n)) if base else free_ports(n)
    nodes = [Node("127.0.0.1", p) for p in ports]
    return RedisHa(root, nodes[0], nodes[1:1 + replicas], nodes[1 + replicas:], **kw)


def _slice(dep: Deployment, name: str) -> tuple[str, list[dict[str, str]]]:
    _am, sa = dep.proxy()
    urn = f"urn:publicid:IDN+chaos.test+slice+{name}"
    return urn, [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": sa.CreateSlice(urn)}]


def _ok(reply: dict, what: str) -> dict:
    assert reply["code"]["geni_code"] == 0, f"{what}: {reply['code']} {reply.get('output')}"
    return reply


def _slivers(reply: dict) -> set[str]:
    value = reply["value"]
    return {s["geni_sliver_urn"] for s in (value if isinstance(value, list) else value["geni_slivers"])}


def _counts(dep: Deployment) -> tuple[dict[str, int], dict[str, int]]:
    """The claim counters the store keeps, and the same counted from the claims themselves (not the slice
    authority's slice names: slices outlive their slivers)."""
    store = dep.store()
    try:
        return ({c: n for c, n in store.claim_counts().items() if not c.startswith("sa_slice:")},
                {c: n for c, n in store.recount_claims().items() if n and not c.startswith("sa_slice:")})
    finally:
        store.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("distributed", [True, False], ids=["distributed", "embedded"])
def test_the_primary_killed_an_allocate_succeeds_within_30_s_and_nothing_is_lost_or_leaked(tmp_path: Path,
                                                                                           distributed: bool):
    ha = redis_ha(tmp_path / "redis")
    ha.start()
    dep = Deployment(tmp_path / "home", distributed=distributed, store=ha.url())
    try:
        dep.up()
        assert dep.status_ok(30), dep.cli("status", check=False).stdout
        before = dep.units()
        counted_before, _ = _counts(dep)
        am, _sa = dep.proxy()
        slices = [_slice(dep, f"ha{i}") for i in range(3)]
        provisioned: dict[str, set[str]] = {}
        for urn, cred in slices:
            _ok(am.Allocate(urn, cred, REQUEST, {}), f"Allocate {urn}")
            provisioned[urn] = _slivers(_ok(am.Provision([urn], cred, {}), f"Provision {urn}"))
        late = _slice(dep, "late")  # its credential before the kill: the slice authority's store is the same

        ha.kill(ha.primary)
        killed = time.monotonic()
        refusals: list[str] = []
        while True:
            try:
                reply = am.Allocate(late[0], late[1], REQUEST, {})
            except xmlrpc.client.Fault as fault:
                pytest.fail(f"Allocate during the failover answered a fault: {fault}")
            code = reply["code"]["geni_code"]
            if code == 0:
                break
            assert code == 14 and reply["output"].strip(), f"Allocate during the failover: {code} {reply['output']}"
            refusals.append(reply["output"])
            assert time.monotonic() - killed < FAILOVER_S, f"no Allocate succeeded in {FAILOVER_S} s: {refusals[-3:]}"
            time.sleep(0.5)
        resumed = time.monotonic() - killed
        print(f"Allocate succeeded {resumed:.1f} s after the primary was killed; {len(refusals)} BUSY before it"
              + (f", e.g. {refusals[0][:200]}" if refusals else ""))
        assert ha.primary_now() == (ha.replicas[0].host, ha.replicas[0].port)

        provisioned[late[0]] = _slivers(reply)
        for urn, cred in [*slices, late]:  # the acknowledged writes of before the failover, and of during it
            described = _ok(am.Describe([urn], cred, {"geni_rspec_version": RSPEC_V3}), f"Describe {urn} after it")
            assert _slivers(described) == provisioned[urn]
        assert _wait(lambda: dep.cli("status", check=False).returncode == 0, 30), dep.cli("status", check=False).stdout

        for urn, cred in [*slices, late]:
            _ok(am.Delete([urn], cred, {}), f"Delete {urn}")
        settled = _wait(lambda: dep.units() == before and not dep.unsettled(), 30)
        leftover = {k: v for k, v in dep.units().items() if before.get(k) != v}
        assert settled, f"left after deleting every slice: claims {leftover}, reservations {dep.unsettled()[:5]}"
        kept, recounted = _counts(dep)
        assert kept == counted_before and kept == recounted, (counted_before, kept, recounted)
    finally:
        dep.cli("down", check=False)
        ha.stop()
