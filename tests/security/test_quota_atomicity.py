"""Quotas hold under concurrency: parallel Allocates by a federation peer's users, by one user, or in one
project never together pass the peer's, the user's or the project's limit. Each check and the allocation it
admits are one step (operations/ledger.py). Real threads make real AM API calls over mutual TLS against both
deployments (embedded SQLite, distributed Redis); what is held afterwards is read back from the aggregate.

Before, six parallel 2-node Allocates by a peer's users with `max_nodes: 2` were all admitted: the peer check
counted what was held, and the next call counted again before the first one's slivers existed."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from operations import quotas
from operations.ledger import Ledger
from protocol.slice_manager import Sliver
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slice_manager.peer_gate import ENDED, wanted_nodes
from slicex import pki
from slicex.credentials import create_credential
from slicex.devpki import add_user, init_ca
from slicex.errors import Forbidden, Refused
from slicex.home import Home
from slicex.peers import Held, Peer, PeerGate, PeerPolicy
from slicex.store import open_store
from slicex.store.redis_store import RedisStore
from slicex.tls_xmlrpc import client
from tests.factories import request_rspec, vm
from tests.integration.conftest import AUTHORITY, REDIS_URL, Running, deployment

PEER = "a.test"
CALLS = 6


def _sfa(xml: str) -> list[dict]:
    return [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": xml}]


def _slice_credential(home: Home, authority: str, owner_cert: Path, name: str, expires) -> tuple[str, list[dict]]:
    """What `home`'s slice authority gives `owner` for slice `name` in `authority` (a project is
    `<ns>:<project>`): its own slice certificate and a `*` credential, signed with its key."""
    urn = f"urn:publicid:IDN+{authority}+slice+{name}"
    sa, sa_key = home.sa_cert.read_bytes(), home.sa_key.read_bytes()
    target, _ = pki.issue_certificate(sa, sa_key, urn, name)
    return urn, _sfa(create_credential(owner_cert=owner_cert.read_bytes(), target_cert=target,
                                       privileges={"*": True}, expires=expires, signer_cert_chain=[sa],
                                       signer_key_pem=sa_key))


def _together(calls: list) -> list[dict]:
    """Run every call at once (each in its own thread, released together); their replies in order."""
    start = threading.Barrier(len(calls))
    replies: list = [None] * len(calls)

    def run(i: int) -> None:
        start.wait()
        replies[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return replies


def _nodes_held(running: Running, owners: set[str] | None = None, slices: set[str] | None = None) -> int:
    """Live node slivers the aggregate holds, of these owners or slices."""
    return sum(1 for rec in running.deployment.sm.records()
               if rec.kind == "node" and rec.r.state not in ENDED and not rec.discard
               and (owners is None or rec.owner_urn in owners) and (slices is None or rec.slice_urn in slices))


def _codes(replies: list[dict]) -> list[int]:
    return [r["code"]["geni_code"] for r in replies]


# ---- a federation peer's quota -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def peer_home(tmp_path_factory) -> Home:
    """Testbed a.test: its CA, slice authority and two users (its aggregate need not run: its slice authority's
    credentials are what its users bring)."""
    home = Home(tmp_path_factory.mktemp("peer-a"))
    init_ca(home, PEER)
    for name in ("pat", "quinn"):
        add_user(home, PEER, name)
    return home


@pytest.fixture(params=["embedded", "distributed"])
def peered(request, pki_home: Home, tmp_path: Path, peer_home: Home) -> Iterator[Running]:
    root = tmp_path / "testbed-a.pem"
    root.write_bytes(peer_home.ca_cert.read_bytes())
    yield from deployment(request.param, pki_home, tmp_path,
                          peers={"testbed-a": {"root": str(root), "namespaces": [PEER],
                                               "policy": {"max_nodes": 2}}})


def test_parallel_allocates_never_pass_a_peers_quota(peered: Running, peer_home: Home):
    """The reported race: six 2-node Allocates at once by two of the peer's users, `max_nodes: 2`."""
    url = peered.deployment.endpoints.am_url
    expires = peered.clock.now() + timedelta(days=1)
    calls = []
    for i in range(CALLS):
        user = ("pat", "quinn")[i % 2]
        cert, key = peer_home.user_cert(user), peer_home.user_key(user)
        urn, creds = _slice_credential(peer_home, PEER, cert, f"race{i}", expires)
        am = client(url, str(cert), str(key))
        calls.append(lambda am=am, urn=urn, creds=creds: am.Allocate(
            urn, creds, request_rspec([vm("n1"), vm("n2")]), {}))
    replies = _together(calls)
    codes = _codes(replies)
    assert codes.count(0) == 1, codes
    assert set(codes) == {0, 7}, replies
    assert all("policy.max_nodes" in r["output"] for r in replies if r["code"]["geni_code"] == 7)
    peer_users = {f"urn:publicid:IDN+{PEER}+user+{u}" for u in ("pat", "quinn")}
    assert _nodes_held(peered, owners=peer_users) == 2


# ---- a user's and a project's quota --------------------------------------------------------------------------
@pytest.fixture(params=["embedded", "distributed"])
def limited(request, pki_home: Home, tmp_path: Path) -> Iterator[Running]:
    yield from deployment(request.param, pki_home, tmp_path, quotas={
        "users": {"default": {"nodes": 3}},
        "projects": {"default": {"nodes": 4}}})


def test_parallel_allocates_never_pass_a_users_or_a_projects_quota(limited: Running):
    """Random sizes (1-3 nodes), in random order, at once: alice's own slices against her limit of 3 nodes,
    and alice's and bob's slices in project `lab` against its limit of 4."""
    rng = random.Random(21)
    url = limited.deployment.endpoints.am_url
    home = limited.home
    expires = limited.clock.now() + timedelta(days=1)
    calls, project_slices, alices = [], set(), set()
    for i in range(2 * CALLS):
        user = ("alice", "bob")[i % 2]
        authority = f"{AUTHORITY}:lab" if i % 3 else AUTHORITY
        urn, creds = _slice_credential(home, authority, home.user_cert(user), f"q{i}", expires)
        (project_slices if i % 3 else set()).add(urn)
        if user == "alice":
            alices.add(urn)
        am = client(url, str(home.user_cert(user)), str(home.user_key(user)))
        nodes = [vm(f"n{k}") for k in range(rng.randint(1, 3))]
        calls.append(lambda am=am, urn=urn, creds=creds, nodes=nodes: am.Allocate(urn, creds, request_rspec(nodes),
                                                                                   {}))
    rng.shuffle(calls)
    replies = _together(calls)
    assert set(_codes(replies)) <= {0, 3}, replies
    assert 0 in _codes(replies) and 3 in _codes(replies), replies
    alice = f"urn:publicid:IDN+{AUTHORITY}+user+alice"
    assert _nodes_held(limited, owners={alice}) <= 3
    assert _nodes_held(limited, slices=project_slices) <= 4
    bob = f"urn:publicid:IDN+{AUTHORITY}+user+bob"
    assert _nodes_held(limited, owners={bob}) <= 3


# ---- any interleaving, two AM workers over one store (hypothesis) ---------------------------------------------
SUB = default_substrate(AUTHORITY)
AM_URN = f"urn:publicid:IDN+{AUTHORITY}+authority+am"
LIMITS = {"user": 3, "project": 4, "peer": 2}
WHO = {"alice": f"urn:publicid:IDN+{AUTHORITY}+user+alice", "bob": f"urn:publicid:IDN+{AUTHORITY}+user+bob",
       "pat": f"urn:publicid:IDN+{PEER}+user+pat"}
HELD = "test-held"


class Worker:
    """One AM worker's view: its own store connection, ledger and peer gate; its slice manager stands in
    as a function that takes a moment, then stores the slivers it made (where the peer gate counts them)."""

    def __init__(self, store_url: str, rng: random.Random):
        self.store = open_store(store_url)
        self.rng = rng
        policy = quotas.policy_from_config({"users": {"default": {"nodes": LIMITS["user"]}},
                                            "projects": {"default": {"nodes": LIMITS["project"]}}})
        self.ledger = Ledger(self.store, SUB, policy)
        peer = Peer("testbed-a", Path("unused.pem"), (PEER,), PeerPolicy(max_nodes=LIMITS["peer"]))
        self.gate = PeerGate(lambda: [peer], AM_URN, self._held, wanted_nodes(SUB))

    def _held(self, peer: Peer) -> list[Held]:
        return [Held(d["owner"], d["slice"], "node", d["cores"]) for d in self.store.scan(HELD)]

    def allocate(self, owner: str, slice_urn: str, nodes: int, now: datetime) -> list[Sliver]:
        request = parse_request(request_rspec([vm(f"n{k}") for k in range(nodes)]))

        def make(end: datetime) -> list[Sliver]:
            time.sleep(self.rng.uniform(0, 0.005))  # the broker and authority take a while: others run meanwhile
            out = []
            for node in request.nodes:
                urn = f"urn:publicid:IDN+{AUTHORITY}+sliver+{uuid.uuid4().hex[:16]}"
                self.store.put(HELD, urn, {"owner": owner, "slice": slice_urn, "cores": 1})
                out.append(Sliver(urn, slice_urn, node.client_id, "node", "geni_allocated", "geni_pending_allocation",
                                  end, owner_urn=owner, details={"cores": 1, "memory_mb": 1024}))
            return out

        return self.ledger.allocate(owner, slice_urn, request, now, now + timedelta(hours=1), False, make,
                                    peers=self.gate)


ASKS = st.lists(st.tuples(st.sampled_from(sorted(WHO)), st.booleans(), st.integers(1, 3), st.integers(0, 1)),
                min_size=3, max_size=10)


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(asks=ASKS, seed=st.integers(0, 2**32 - 1))
def test_no_interleaving_of_allocates_passes_a_quota(kind, tmp_path_factory, asks, seed):
    """Whoever asks (two local users, a peer's user), in or out of project `lab`, 1-3 nodes, through either
    of two AM workers, all at once: every limit holds afterwards, and every refusal is a quota's."""
    if kind == "redis":
        url = REDIS_URL
        RedisStore(url).flush()
    else:
        url = f"sqlite:///{tmp_path_factory.mktemp('ledger') / 'state.db'}"
    rng = random.Random(seed)
    workers = [Worker(url, random.Random(rng.random())), Worker(url, random.Random(rng.random()))]
    now = datetime.now(UTC).replace(microsecond=0)
    refusals: list[Exception] = []

    def ask(i: int, who: str, in_project: bool, nodes: int, worker: int) -> Callable[[], None]:
        authority = (PEER if who == "pat" else AUTHORITY) + (":lab" if in_project else "")
        slice_urn = f"urn:publicid:IDN+{authority}+slice+s{i}"

        def call() -> None:
            try:
                workers[worker].allocate(WHO[who], slice_urn, nodes, now)
            except (Forbidden, Refused) as exc:
                refusals.append(exc)
        return call

    try:
        _together([ask(i, *a) for i, a in enumerate(asks)])
        held = workers[0].store.scan(HELD)
        for who, urn in WHO.items():
            limit = LIMITS["peer"] if who == "pat" else LIMITS["user"]
            assert sum(1 for d in held if d["owner"] == urn) <= limit, (who, asks)
        for authority in (AUTHORITY, PEER):
            in_lab = [d for d in held if f"{authority}:lab+slice+" in d["slice"]]
            assert len(in_lab) <= LIMITS["project"], (authority, asks)
        assert len(refusals) + len({d["slice"] for d in held}) == len(asks)
    finally:
        for w in workers:
            w.store.close()
        if kind == "redis":
            RedisStore(url).flush()
