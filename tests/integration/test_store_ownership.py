"""Each actor writes only its own tables and claim namespaces, and reads another's only where
slicex/store/ownership.py says so: on SQLite and on a real Redis server (SLICEX_REDIS_URL), through the view
each actor is given and through the actors themselves."""

from __future__ import annotations

import os
import uuid

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from authority.actor import Authority
from broker.broker import Broker
from rspec.substrate import default_substrate
from slice_manager.actor import ActorSliceManager
from slicex.inventory import UNIT_KINDS
from slicex.store.ownership import OWNERSHIP, Actor, OwnershipError, owned_by, scoped
from slicex.store.redis_store import RedisStore
from slicex.store.sqlite_store import SqliteStore

KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(params=["sqlite", "redis"])
def raw(request, tmp_path):
    if request.param == "sqlite":
        store = SqliteStore(str(tmp_path / "s.db"))
    else:
        store = RedisStore(os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/15"),
                           prefix=f"test-{uuid.uuid4().hex[:8]}")
        store.ping()
    yield store
    if request.param == "redis":
        store.flush()
    store.close()


def nothing_written(raw) -> bool:
    return all(raw.scan(h.name) == [] for h in OWNERSHIP if not h.claims) and raw.all_claims() == {}


@pytest.mark.parametrize("actor", list(Actor))
def test_an_actor_writes_its_own_tables_and_none_of_another_actors(raw, actor):
    view = scoped(raw, actor)
    for h in OWNERSHIP:
        if h.owner == actor:
            continue
        with pytest.raises(OwnershipError, match=f"{actor} wrote .*{h.name}.*the {h.owner}'s"):
            if h.claims:
                view.claim_all([f"{h.name}:k"], "x")
            else:
                view.put(h.name, "k", {"x": 1})
        with pytest.raises(OwnershipError):
            view.release(f"{h.name}:k", "x") if h.claims else view.delete(h.name, "k")
    assert nothing_written(raw)
    table = owned_by(actor, claims=False)[0]
    view.put(table, "k", {"x": 1})
    assert view.get(table, "k") == {"x": 1} and view.delete(table, "k")
    for ns in owned_by(actor, claims=True):
        assert view.claim(f"{ns}:k", "me") and view.claims_of("me") == [f"{ns}:k"]
        assert view.release_owner("me") == 1


def test_reads_of_another_actors_state_are_the_declared_ones_only(raw):
    raw.put("sa_slices", "s", {"members": []})
    raw.claim_all(["core:pc1:0", "leased:core:pc1:0"], "g")
    assert scoped(raw, Actor.DEPLOYMENT).get("sa_slices", "s") == {"members": []}  # a declared reader
    with pytest.raises(OwnershipError, match="broker read table 'sa_slices'.*readers: deployment"):
        scoped(raw, Actor.BROKER).get("sa_slices", "s")
    with pytest.raises(OwnershipError, match="broker read claim namespace 'leased'"):
        scoped(raw, Actor.BROKER).claims_in(["leased"])
    with pytest.raises(OwnershipError, match="authority read claim namespace 'core'"):
        scoped(raw, Actor.AUTHORITY).owner_of("core:pc1:0")
    with pytest.raises(OwnershipError, match="slice manager read claim namespace 'leased'"):
        scoped(raw, Actor.SLICE_MANAGER).claims_of("g")  # g's claims include the authority's lease marker
    assert scoped(raw, Actor.SLICE_MANAGER).all_claims() == {"core:pc1:0": "g"}  # units: a declared read
    assert scoped(raw, Actor.AUTHORITY).all_claims() == {"leased:core:pc1:0": "g"}


def test_a_release_by_owner_token_holding_another_actors_claims_is_refused_whole(raw):
    raw.claim_all(["core:pc1:0", "sm-lock:r1"], "token")
    with pytest.raises(OwnershipError, match="sm-lock"):
        scoped(raw, Actor.BROKER).release_owner("token")
    assert raw.all_claims() == {"core:pc1:0": "token", "sm-lock:r1": "token"}


def test_every_actor_constructed_keeps_its_own_view(raw):
    sub = default_substrate("t.org")
    broker = Broker("b", raw, KEY)
    authority = Authority("a", None, {}, store=raw)
    sm = ActorSliceManager(raw, sub, broker, authority, lease_key=KEY.public_key())
    given_another = Broker("b2", sm.store, KEY)  # handed a view: its own view of the same store
    for actor, owner in ((broker, Actor.BROKER), (authority, Actor.AUTHORITY), (sm, Actor.SLICE_MANAGER),
                         (given_another, Actor.BROKER)):
        assert actor.store.actor == owner and actor.store.inner is raw
    with pytest.raises(OwnershipError, match="broker wrote table 'sm-reservations'"):
        broker.store.put("sm-reservations", "r", {})
    with pytest.raises(OwnershipError, match="authority wrote claim namespace 'core'"):
        authority.store.claim_all([f"{UNIT_KINDS[0]}:pc1:0"], "lease")
    with pytest.raises(OwnershipError, match="slice manager wrote table 'authority-leases'"):
        sm.store.delete("authority-leases", "l")
    assert nothing_written(raw)
