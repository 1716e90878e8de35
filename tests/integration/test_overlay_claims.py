"""Overlay address claims against a real Redis (SLICEX_REDIS_URL, default db 6; each test under its own key
prefix, removed afterwards).

* A hypothesis state machine runs random claims, renewals and releases from several nodes and checks every
  answer against the reference put-if-absent semantics of test_overlay_core.py.
* Leases expire (an expired claim is free again) and a keeper renewing at a quarter of the lease keeps its
  address for many leases while others keep trying.
* The stress test: 4 processes × 8 threads claim, renew, release and abandon addresses of a 13-address pool
  with a 0.4 s lease for 3 s. Each worker logs when it believed it held an address (from the WON reply to
  the earlier of its release and its last successful claim's send time + lease); no two workers' intervals
  for one address overlap, and abandoned addresses are won again by others after they expire."""

from __future__ import annotations

import multiprocessing
import os
import random
import threading
import time
import uuid
from ipaddress import IPv4Address

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from federation.overlay.claims import RedisClaims
from federation.overlay.core import Holder, NamespaceConfig, Outcome, Phase
from federation.overlay.keeper import LeaseKeeper
from slicex.errors import BadArgs, Refused, SearchFailed, Unavailable

REDIS_URL = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/6")
A = IPv4Address


def open_claims(prefix: str | None = None) -> RedisClaims:
    c = RedisClaims(REDIS_URL, prefix=prefix or f"test-ov-{uuid.uuid4().hex[:8]}")
    try:
        c.ping()
    except Unavailable as exc:
        pytest.fail(f"Redis is required for these tests and is not answering ({exc}); run `make redis`")
    return c


def holder(i: int, endpoint: str = "127.0.0.1:4000") -> Holder:
    return Holder(f"n{i}", endpoint, "c1", f"02:00:00:00:{i >> 8:02x}:{i & 0xFF:02x}")


@pytest.fixture
def claims():
    c = open_claims()
    yield c
    for key in c._r.scan_iter(match=f"{c.prefix}:*"):
        c._r.delete(key)
    c.close()


# ---- namespaces ------------------------------------------------------------------------------------------------
def test_a_namespace_is_defined_once_and_redefining_it_differently_is_refused(claims):
    cfg = NamespaceConfig.build("urn:publicid:IDN+a.test+slice+s1", "10.5.0.0/24", 30)
    assert claims.define(cfg) == cfg and claims.define(cfg) == cfg
    assert claims.namespace(cfg.name) == cfg
    with pytest.raises(BadArgs, match="already defined as 10.5.0.0/24"):
        claims.define(NamespaceConfig.build(cfg.name, "10.6.0.0/24", 30))
    with pytest.raises(SearchFailed, match="namespace nope does not exist"):
        claims.namespace("nope")
    claims.claim(cfg.name, A("10.5.0.9"), holder(1), 30)
    assert claims.undefine(cfg.name) == 2
    assert claims.lookup(cfg.name, A("10.5.0.9")) is None


# ---- claims match the reference semantics ----------------------------------------------------------------------
class ClaimsMachine(RuleBasedStateMachine):
    """Leases are long (60 s) so nothing expires during an example: this checks who wins, renewals and
    releases; expiry is checked with real time below."""

    def __init__(self):
        super().__init__()
        self.c = open_claims()
        self.model: dict[IPv4Address, int] = {}

    @rule(node=st.integers(0, 3), last=st.integers(2, 6))
    def claim(self, node, last):
        address = A(f"10.7.0.{last}")
        outcome, now = self.c.claim("s", address, holder(node), 60)
        owner = self.model.get(address)
        expected = Outcome.WON if owner is None else Outcome.RENEWED if owner == node else Outcome.TAKEN
        assert outcome is expected
        assert now == holder(self.model.setdefault(address, node))

    @rule(node=st.integers(0, 3), last=st.integers(2, 6))
    def release(self, node, last):
        address = A(f"10.7.0.{last}")
        freed = self.c.release("s", address, holder(node))
        assert freed is (self.model.get(address) == node)
        if freed:
            del self.model[address]

    @invariant()
    def store_holds_what_the_model_holds(self):
        assert self.c.holders("s") == {a: holder(n) for a, n in self.model.items()}

    def teardown(self):
        self.c.undefine("s")
        self.c.close()


TestClaimsAgainstReference = ClaimsMachine.TestCase
TestClaimsAgainstReference.settings = settings(max_examples=40, stateful_step_count=25, deadline=None,
                                               suppress_health_check=[HealthCheck.too_slow])


# ---- expiry and renewal with real time -------------------------------------------------------------------------
def test_an_expired_claim_is_free_again(claims):
    assert claims.claim("s", A("10.7.0.9"), holder(1), 0.15)[0] is Outcome.WON
    outcome, now = claims.claim("s", A("10.7.0.9"), holder(2), 0.15)
    assert outcome is Outcome.TAKEN and now == holder(1)
    assert 0 < claims.remaining("s", A("10.7.0.9")) <= 0.15
    time.sleep(0.2)
    assert claims.remaining("s", A("10.7.0.9")) is None
    assert claims.claim("s", A("10.7.0.9"), holder(2), 0.15)[0] is Outcome.WON
    assert not claims.release("s", A("10.7.0.9"), holder(1))  # compare-and-delete: not 1's to release


def test_a_keeper_renewing_at_a_quarter_lease_keeps_its_address_and_frees_it_on_leave(claims):
    cfg = claims.define(NamespaceConfig.build("s", "10.7.0.0/29", 0.4))
    keeper = LeaseKeeper(claims, cfg, holder(1), rng=random.Random(1))
    address = keeper.acquire(A("10.7.0.4"))
    assert address == A("10.7.0.4")
    keeper.start()
    taken = 0
    deadline = time.monotonic() + 1.6  # four leases
    while time.monotonic() < deadline:
        assert claims.claim("s", address, holder(2), cfg.lease)[0] is Outcome.TAKEN
        taken += 1
        time.sleep(0.02)
    assert keeper.lease.phase is Phase.BOUND and keeper.renewals >= 10  # ~ one per 0.1 s
    assert claims.remaining("s", address) > cfg.lease / 4  # renewed within the last three quarters of a lease
    assert keeper.leave()
    assert claims.claim("s", address, holder(2), cfg.lease)[0] is Outcome.WON


def test_a_keeper_that_misses_its_renewals_loses_the_address_to_another_node(claims):
    cfg = claims.define(NamespaceConfig.build("s", "10.7.0.0/29", 0.2))
    lost: list = []
    keeper = LeaseKeeper(claims, cfg, holder(1), on_change=lambda lz: lost.append(lz.phase))
    address = keeper.acquire(A("10.7.0.4"))
    time.sleep(0.25)  # no renewal thread: the lease runs out in the store
    assert claims.claim("s", address, holder(2), cfg.lease)[0] is Outcome.WON
    assert keeper.renew().phase is Phase.LOST and lost[-1] is Phase.LOST
    assert not keeper.leave()  # nothing of ours to release
    assert claims.lookup("s", address) == holder(2)


def test_a_full_namespace_refuses_a_joiner_naming_it(claims):
    cfg = claims.define(NamespaceConfig.build("s", "10.7.0.0/29", 30))
    for i, address in enumerate(cfg.candidates()):
        claims.claim("s", address, holder(10 + i), cfg.lease)
    with pytest.raises(Refused, match=r"no free address in namespace s \(10.7.0.0/29\) after 5 claims"):
        LeaseKeeper(claims, cfg, holder(1)).acquire()


# ---- stress: many processes and threads at once ----------------------------------------------------------------
POOL = "10.8.0.0/28"  # 13 claimable addresses
LEASE = 0.4
RUN = 3.0


def _worker(prefix: str, namespace: str, proc: int, threads: int, seconds: float, out) -> None:
    c = RedisClaims(REDIS_URL, prefix=prefix)
    cfg = c.namespace(namespace)
    pool = cfg.candidates()
    log: list[tuple] = []
    lock = threading.Lock()

    def one(t: int) -> None:
        rng = random.Random(proc * 1000 + t)
        me = holder(proc * 100 + t, f"127.0.0.1:{5000 + proc}")
        spans: list[list] = []  # [address, start, end, plan, renewals, lost]: when this thread believed it held
        last: dict[IPv4Address, list] = {}
        refused = 0
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            address = rng.choice(pool)
            sent = time.monotonic()
            outcome, _ = c.claim(namespace, address, me, LEASE)
            got = time.monotonic()
            if outcome is Outcome.TAKEN:
                refused += 1
                continue
            if outcome is Outcome.RENEWED:
                # only possible for an address this thread abandoned and whose lease has not run out yet: the
                # same hold goes on
                span = last[address]
                assert span[2] > sent or span[2] >= got - LEASE, (address, span, sent)
                span[2] = sent + LEASE
            else:
                span = [str(address), got, sent + LEASE, None, 0, False]
                spans.append(span)
                last[address] = span
            plan = span[3] = rng.choice(["release", "abandon", "abandon", "renew"])
            hold_until = time.monotonic() + rng.uniform(0, 2 * LEASE)
            while plan != "abandon" and time.monotonic() < hold_until:
                time.sleep(LEASE / 4)
                s2 = time.monotonic()
                if s2 >= span[2]:
                    break  # our own lease ran out (the host was slow): stop using it
                o2, _ = c.claim(namespace, address, me, LEASE)
                if o2 is Outcome.TAKEN:
                    span[5] = True
                    break
                span[2], span[4] = s2 + LEASE, span[4] + 1
            if plan == "release" and not span[5]:
                span[2] = min(span[2], time.monotonic())
                c.release(namespace, address, me)
            if plan == "abandon":
                time.sleep(rng.uniform(0, LEASE))
        with lock:
            log.append(("refused", refused))
            log.extend(("held", a, me.node, s, e, p, n, lost) for a, s, e, p, n, lost in spans)

    def guarded(t: int) -> None:
        try:
            one(t)
        except Exception as exc:  # reported to the parent, which fails the test
            with lock:
                log.append(("error", repr(exc)))

    ts = [threading.Thread(target=guarded, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.put(log)
    c.close()


def _stress_round(claims, namespace: str) -> tuple[list[tuple], dict[str, list[tuple]]]:
    """One run of 4 processes x 8 threads on one namespace; asserts no two nodes ever held one address at once."""
    claims.define(NamespaceConfig.build(namespace, POOL, LEASE))
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(claims.prefix, namespace, p, 8, RUN, out)) for p in range(4)]
    for p in procs:
        p.start()
    logs = [out.get(timeout=RUN + 30) for _ in procs]
    for p in procs:
        p.join(10)
        assert p.exitcode == 0
    entries = [e for log in logs for e in log]
    assert [e for e in entries if e[0] == "error"] == []
    by_address: dict[str, list[tuple]] = {}
    for _, address, node, start, end, plan, _, _ in (e for e in entries if e[0] == "held"):
        by_address.setdefault(address, []).append((start, end, node, plan))
    for address, spans in by_address.items():
        spans.sort()
        for i, (s1, e1, n1, _) in enumerate(spans):
            for s2, _e2, n2, _ in spans[i + 1:]:
                if s2 >= e1:
                    break
                assert n1 == n2, f"{address}: {n1} held it {s1:.4f}..{e1:.4f}, {n2} from {s2:.4f}"
    return entries, by_address


def _rewon_after_expiry(by_address: dict[str, list[tuple]]) -> int:
    """Abandoned holds (never released, only expired) whose address was next won by another node."""
    count = 0
    for spans in by_address.values():
        for i, (_, end, node, plan) in enumerate(spans):
            later = [n for s, _, n, _ in spans[i + 1:] if s >= end]
            count += plan == "abandon" and bool(later) and later[0] != node
    return count


def test_concurrent_claims_from_many_processes_and_threads_never_collide(claims):
    """No collision in any round; further rounds (at most 4) only until the run covered what it claims to.

    Coverage depends on how much CPU the host gives the 32 threads: a loaded CI host once got 39 holds and no
    abandoned address re-won in one round, so a round that covers too little is followed by another instead of
    failing; every round is checked for collisions.
    """
    held: list[tuple] = []
    taken = rewon = 0
    for round_no in range(4):
        entries, by_address = _stress_round(claims, f"stress{round_no}")
        held += [e for e in entries if e[0] == "held"]
        taken += sum(e[1] for e in entries if e[0] == "refused")
        rewon += _rewon_after_expiry(by_address)
        covered = (taken > 100 and len(held) > 20 and {e[5] for e in held} == {"release", "abandon", "renew"}
                   and sum(e[6] for e in held) > 20 and rewon >= 1)
        if covered:
            break
    print(f"{round_no + 1} rounds: {len(held)} holds, {taken} refused claims, {rewon} re-won after expiry")
    # the run exercised what it claims to: contention, all three endings, renewals, re-wins after expiry
    assert taken > 100 and len(held) > 20, (taken, len(held))
    assert {e[5] for e in held} == {"release", "abandon", "renew"}
    assert sum(e[6] for e in held) > 20
    assert rewon >= 1
