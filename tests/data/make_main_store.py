"""Make tests/data/store-main-COMMIT.json: a store as the slicex of an earlier main writes it, on SQLite and on
Redis, for tests/integration/test_store_migration.py: 8a6e8e1 (main before issue 33's lean records, no layout
mark) and 400d7c3 (main before the one typed codec: lean records written by hand, layout 5 marked, as its
`slicex up` left every store).

Run from a checkout of that commit (its code writes the store; this file only drives it and dumps the result):

    git worktree add /some/where COMMIT && cd /some/where
    .venv/bin/python NEW_CHECKOUT/tests/data/make_main_store.py COMMIT redis://127.0.0.1:6379/N > store-main-COMMIT.json

Binary values (deflated documents, from 400d7c3 on) are dumped as {"b64": ...}.

Three slices on the default substrate at 2030-01-01T00:00Z (ManualClock's start): one only allocated (10
min), one provisioned for 1 h, one for 3 h, two VMs each, their usage in the ledger; signed with the ECDSA
key the dump carries (a test key: the migrated store's broker signs renewals with it)."""

from __future__ import annotations

import base64
import json
import sqlite3
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from authority.actor import Authority
from authority.substrate.emulated import EmulatedDriver
from broker.broker import Broker
from operations.ledger import Ledger
from resources import export_substrate
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slice_manager.actor import ActorSliceManager
from slicex.clock import ManualClock
from slicex.store import open_store
from tests.factories import request_rspec, vm

SUB = default_substrate("t.org")
AUTH = "urn:publicid:IDN+t.org+authority+am"
USER = "urn:publicid:IDN+t.org+user+alice"
SLICES = [f"urn:publicid:IDN+t.org+slice+m{i}" for i in range(3)]


def _json(value):
    """A value JSON can carry: bytes as {"b64": ...}."""
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode()}
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {(k.decode() if isinstance(k, bytes) else k): _json(v) for k, v in value.items()}
    return value


def mark_current(store) -> None:
    """What that commit's `slicex up` did to a new store: marked at its layout (commits with a layout mark)."""
    try:
        from deployment.migrations import STEPS
        from slicex.store.migration import migrate
    except ImportError:
        return
    migrate(store, STEPS)


def fill(store, key) -> dict[str, list[str]]:
    mark_current(store)
    clock = ManualClock()
    broker = Broker("broker", store, key, authority=AUTH)
    authority = Authority(AUTH, EmulatedDriver(SUB), {"broker": key.public_key()}, store=store, key=key,
                          inventory=export_substrate(SUB, AUTH, "broker"))
    authority.delegate(broker)
    sm = ActorSliceManager(store, SUB, broker, authority, name="sm")
    ledger = Ledger(store, SUB)
    now = clock.now()
    made = {}
    for n, (slice_urn, hours) in enumerate(zip(SLICES, (0, 1, 3), strict=True)):
        req = parse_request(request_rspec([vm(f"a{n}"), vm(f"b{n}")]))
        slivers = ledger.allocate(USER, slice_urn, req, now, now + timedelta(minutes=10), True,
                                  lambda end, s=slice_urn, r=req: sm.allocate(s, USER, r, end, now))
        urns = [s.urn for s in slivers]
        if hours:
            ledger.extended(sm.provision(urns, now + timedelta(hours=hours), [], now))
        made[slice_urn] = sorted(urns)
    return made


def dump_sqlite(key) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.db"
        store = open_store(f"sqlite://{path}")
        made = fill(store, key)
        store.close()
        db = sqlite3.connect(path)
        schema = [sql for (sql,) in db.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid")]
        tables = {name: [_json(list(r)) for r in db.execute(f"SELECT * FROM {name} ORDER BY 1, 2")]
                  for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        db.close()
    return {"made": made, "schema": schema, "tables": tables}


def dump_redis(url: str, key) -> dict:
    store = open_store(url)
    store.flush()
    made = fill(store, key)
    r, keys = getattr(store, "_rb", store._r), {}  # the binary client where there is one
    for k in sorted(r.scan_iter(match="slicex:*")):
        kind = r.type(k)
        kind = kind.decode() if isinstance(kind, bytes) else kind
        keys[k] = {"string": lambda k=k: ["string", r.get(k)], "hash": lambda k=k: ["hash", r.hgetall(k)],
                   "set": lambda k=k: ["set", sorted(r.smembers(k))],
                   "zset": lambda k=k: ["zset", r.zrange(k, 0, -1, withscores=True)]}[kind]()
    store.flush()
    store.close()
    return {"made": made, "keys": {(k.decode() if isinstance(k, bytes) else k): _json(v) for k, v in keys.items()}}


def main() -> int:
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    out = {"commit": sys.argv[1], "key": pem, "sqlite": dump_sqlite(key), "redis": dump_redis(sys.argv[2], key)}
    print(json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
