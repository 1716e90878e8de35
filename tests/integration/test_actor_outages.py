"""A broker that is down, or a store that is down, gives a clear result and loses nothing; service resumes
when they are back."""

from __future__ import annotations

import yaml

from am.service import ActorProcess
from tests.factories import request_rspec, vm
from tests.integration.conftest import REDIS_URL, start, stop
from tests.integration.test_am_api import code, ok


def test_broker_outage_is_unavailable_and_recovers(pki_home, tmp_path):
    from slicex.store.redis_store import RedisStore

    cfg = yaml.safe_load((pki_home.root / "slicex.yaml").read_text())
    cfg["store"] = REDIS_URL
    (pki_home.root / "slicex.yaml").write_text(yaml.safe_dump(cfg))
    RedisStore(REDIS_URL).flush()
    r = start(pki_home, distributed=True)
    try:
        alice = r.user("alice")
        urn, creds = alice.slice_credential("outage")
        ok(alice.am.Allocate(urn, creds, request_rspec([vm("kept")]), {}))
        held = r.deployment.sm.usage_keys()
        broker_port = int(r.actors[0].url.rsplit(":", 1)[1].strip("/"))
        r.actors[0].stop()
        reply = alice.am.Allocate(urn, creds, request_rspec([vm("more")]), {})
        assert code(reply) == 11 and "broker" in reply["output"]
        assert r.deployment.sm.usage_keys() == held  # nothing taken, nothing lost
        assert len(ok(alice.am.Status([urn], creds, {}))["geni_slivers"]) == 1
        again = ActorProcess(pki_home, "broker", port=broker_port)
        again.start()
        r.actors = (again, r.actors[1])
        ok(alice.am.Allocate(urn, creds, request_rspec([vm("more")]), {}))
        assert len(ok(alice.am.Status([urn], creds, {}))["geni_slivers"]) == 2
    finally:
        stop(r)
        RedisStore(REDIS_URL).flush()
        cfg.pop("store")
        (pki_home.root / "slicex.yaml").write_text(yaml.safe_dump(cfg))


def test_store_outage_is_a_result_not_a_crash(pki_home):
    from slicex.store.redis_store import RedisStore

    cfg = yaml.safe_load((pki_home.root / "slicex.yaml").read_text())
    r = start(pki_home)
    try:
        alice = r.user("alice")
        urn, creds = alice.slice_credential("storedown")
        real = r.deployment.sm.store
        r.deployment.sm.store = RedisStore("redis://127.0.0.1:1/0", timeout=0.5)  # a store that is not there
        reply = alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {})
        assert code(reply) == 11 and "not answering" in reply["output"]
        r.deployment.sm.store = real
        ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))
    finally:
        stop(r)
        (pki_home.root / "slicex.yaml").write_text(yaml.safe_dump(cfg))
