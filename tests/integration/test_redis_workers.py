"""Two AM API workers (separate deployments, separate ports) share one real Redis: state written by one is
seen by the other, and concurrent allocations never hand out a unit twice."""

from __future__ import annotations

import os
import threading
import uuid

import yaml

from tests.factories import request_rspec
from tests.integration.conftest import start
from tests.integration.test_am_api import code, ok

REDIS = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/14")


def test_two_workers_share_state_and_never_double_allocate(pki_home, tmp_path):
    cfg = yaml.safe_load((pki_home.root / "slicex.yaml").read_text())
    cfg["store"] = REDIS
    (pki_home.root / "slicex.yaml").write_text(yaml.safe_dump(cfg))
    from slicex.store.redis_store import RedisStore

    RedisStore(REDIS).flush()
    a, b = start(pki_home), start(pki_home, clock=None)
    try:
        alice_a, alice_b = a.user("alice"), b.user("alice")
        urn, creds = alice_a.slice_credential("shared")
        ok(alice_a.am.Allocate(urn, creds, request_rspec([{"client_id": "x", "sliver_type": "raw-pc"}]), {}))
        assert len(ok(alice_b.am.Status([urn], creds, {}))["geni_slivers"]) == 1  # worker b sees worker a's sliver
        ok(alice_b.am.Provision([urn], creds, {}))  # and redeems the ticket a's broker signed
        results = []

        def grab(worker, i):
            user = worker.user("alice")  # one connection per thread: ServerProxy is not thread-safe
            u, c = user.slice_credential(f"race{i}-{uuid.uuid4().hex[:4]}")
            results.append(code(user.am.Allocate(u, c, request_rspec([{"client_id": "y", "sliver_type": "raw-pc"}]),
                                                 {})))

        threads = [threading.Thread(target=grab, args=(a if i % 2 else b, i)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # two bare-metal nodes exist; one is taken: exactly one more allocation can succeed
        assert sorted(results).count(0) == 1 and all(c in (0, 14, 26) for c in results)
        nodes = [k for k in a.deployment.sm.usage_keys() if k.startswith("node:")]
        assert len(nodes) == 2
    finally:
        a.deployment.stop()
        b.deployment.stop()
        RedisStore(REDIS).flush()
        cfg.pop("store")
        (pki_home.root / "slicex.yaml").write_text(yaml.safe_dump(cfg))
