"""Operators' views cost nothing until something changes: the broker's dashboard snapshot is built again only
when its version changes (a heartbeat republishes the last one), and its delegation records (the whole
substrate and the signed documents) are decoded once per change, not at every tick."""

from __future__ import annotations

from datetime import timedelta

from cryptography.hazmat.primitives.asymmetric import rsa

from broker.broker import DELEGATIONS, Broker
from operations.snapshot import SNAPSHOTS, publishers_for, read_snapshots
from protocol.messages import demands_of
from resources import export_substrate
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slicex.clock import ManualClock
from slicex.store.sqlite_store import SqliteStore
from slicex.term import Term
from slicex.ticket import SignedDelegation, SignedReclaim, sign_delegation, sign_reclaim
from tests.factories import request_rspec, vm

SUB = default_substrate("t.org")
AUTH = "urn:publicid:IDN+t.org+authority+am"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
AUTH_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
MIN = timedelta(minutes=1)
T0 = ManualClock().now()


def granted(sequence: int) -> SignedDelegation:
    body = export_substrate(SUB, AUTH, "broker").to_doc()
    return sign_delegation(SignedDelegation(AUTH, "broker", T0, body, sequence), AUTH_KEY)


class Counting:
    """A store that counts scans per table (and forwards everything)."""

    def __init__(self, store):
        self._store, self.scans = store, {}

    def scan(self, table, prefix=""):
        self.scans[table] = self.scans.get(table, 0) + 1
        return self._store.scan(table, prefix)

    def __getattr__(self, name):
        return getattr(self._store, name)


def place_one(broker: Broker, name: str, now):
    request = parse_request(request_rspec([vm(name)]))
    return broker.place("sm", demands_of(request, {name: f"r-{name}"}), Term(now, now + 10 * MIN), now)


def test_the_brokers_snapshot_is_built_only_when_its_version_changes(tmp_path):
    store = SqliteStore(str(tmp_path / "s.db"))
    broker = Broker("broker", store, KEY, authority=AUTH)
    broker.accept(export_substrate(SUB, AUTH, "broker"))
    now = ManualClock().now()
    built: list[int] = []
    real = broker.tickets
    broker.tickets = lambda: (built.append(1), real())[1]  # type: ignore[method-assign]
    mono = [0.0]
    publisher = publishers_for(store, broker=broker, heartbeat=5.0)[0]
    publisher.monotonic = lambda: mono[0]
    assert publisher.publish(now) and len(built) == 1
    for k in range(1, 4):  # ticks with nothing changed: nothing built, nothing written
        mono[0] = k
        assert not publisher.publish(now + k * timedelta(seconds=1))
    assert len(built) == 1
    place_one(broker, "a", now)  # a promise: the version changes, the state is built again
    mono[0] = 4
    assert publisher.publish(now + 4 * timedelta(seconds=1)) and len(built) == 2
    assert store.get(SNAPSHOTS, "broker:broker")["state"]["ticket_states"] == {"active": 1}
    mono[0] = 10  # the heartbeat: the last state with the time of the heartbeat, still not built
    writes = counted(store, "put", every=True)
    assert publisher.publish(now + 10 * timedelta(seconds=1)) and len(built) == 2
    doc = read_snapshots(store)[0]
    assert doc["state"]["ticket_states"] == {"active": 1} and doc["published_at"].endswith(":10Z")
    assert len(writes) == 1 and store.get(SNAPSHOTS, "broker:broker")["published_at"].endswith(":04Z")


def test_the_delegation_records_are_decoded_once_per_change(tmp_path):
    store = SqliteStore(str(tmp_path / "s.db"))
    broker = Broker("broker", store, KEY, authority=AUTH, authority_keys={AUTH: AUTH_KEY.public_key()})
    broker.accept(granted(1))
    counting = Counting(broker.store)
    broker.store = counting
    first = (broker.delegations(), broker.delegated())
    for _ in range(5):  # ticks of the dashboard's publisher: the small copy is read, the record is not
        assert (broker.delegations(), broker.delegated()) == first
    assert counting.scans.get(DELEGATIONS, 0) == 1
    host = SUB.hosts[1].component_id
    names = [p for p in first[1] if host in p]
    broker.reclaim(sign_reclaim(SignedReclaim(AUTH, "broker", T0, tuple(names), 2), AUTH_KEY), T0)  # the record changes: read again, once
    after = broker.delegated()
    assert not set(names) & set(after) and set(after) < set(first[1])
    assert broker.delegated() == after and counting.scans[DELEGATIONS] == 2


def test_a_record_written_before_serials_gets_one_when_its_delegation_is_sent_again(tmp_path):
    store = SqliteStore(str(tmp_path / "s.db"))
    broker = Broker("broker", store, KEY, authority=AUTH, authority_keys={AUTH: AUTH_KEY.public_key()})
    signed = granted(1)
    broker.accept(signed)
    for table in (DELEGATIONS, "broker-out-of-service"):  # as an older version wrote them
        doc = store.get(table, f"broker|{AUTH}")
        del doc["serial"]
        store.put(table, f"broker|{AUTH}", doc)
    broker.accept(signed)  # the authority's resend at start: changes nothing, and gives the record a serial
    counting = Counting(broker.store)
    broker.store = counting
    broker.delegated()
    broker.delegated()
    assert counting.scans.get(DELEGATIONS, 0) == 1


def test_the_reaper_settles_usage_every_tick_and_sweeps_a_page_only_slowly(monkeypatch):
    """Every tick runs `settle` with the slivers that tick ended; one page of the ledger's rotating check runs
    every LEDGER_SWEEP_SECONDS, never at start."""
    from types import SimpleNamespace

    from deployment import service

    mono = [100.0]
    monkeypatch.setattr(service.time, "monotonic", lambda: mono[0])
    ended: list[list[str]] = [[], [], ["s1"], [], []]
    swept: list[tuple[float, int]] = []
    settled: list[list[str]] = []
    deployment = SimpleNamespace(
        _checked_at=mono[0], _swept_at=None, publishers=[], clock=ManualClock(),
        store=SimpleNamespace(fault=None), _check_store=lambda: None,
        sm=SimpleNamespace(reap=lambda now: ended.pop(0), holds=lambda urn: False),
        ledger=SimpleNamespace(sweep=lambda held, now, page: swept.append((mono[0], page)),
                               settle=lambda gone, held, now: settled.append(list(gone))))
    for _ in range(5):
        mono[0] += 0.5
        service.EmbeddedDeployment._tick(deployment)
    assert swept == [] and settled == [[], [], ["s1"], [], []]  # no sweep at start
    mono[0] += service.LEDGER_SWEEP_SECONDS
    ended.append([])
    service.EmbeddedDeployment._tick(deployment)
    assert swept == [(mono[0], service.LEDGER_SWEEP_PAGE)] and len(settled) == 6  # one page, slowly


def counted(obj, name: str, every: bool = False) -> list[int]:
    """Count the calls of `obj.name` without arguments (every record or lease; a slice's own are not counted),
    or with `every`, all of them."""
    calls: list[int] = []
    real = getattr(obj, name)

    def wrapper(*a, **k):
        if every or (not a and not k):
            calls.append(1)
        return real(*a, **k)
    setattr(obj, name, wrapper)
    return calls


def embedded(tmp_path):
    from authority.substrate.emulated import EmulatedDriver
    from deployment.actors import ActorKeys, embedded_slice_manager

    store = SqliteStore(str(tmp_path / "s.db"))
    return store, embedded_slice_manager(store, SUB, EmulatedDriver(SUB), keys=ActorKeys.given(KEY))


def test_the_slice_managers_snapshot_is_built_only_when_its_records_change(tmp_path):
    """No record written and no unit taken: the records are not read again, however many ticks pass; an
    Allocate (its records and the broker's claims) and an operator's Shutdown each build it once more."""
    store, asm = embedded(tmp_path)
    now = ManualClock().now()
    slivers = asm.allocate("urn:publicid:IDN+t.org+slice+s1", "urn:o", parse_request(request_rspec([vm("a")])),
                           now + 10 * MIN, now)
    reads = counted(asm, "records")
    mono = [0.0]
    publisher = publishers_for(store, asm, asm.broker, heartbeat=5.0)[0]
    publisher.monotonic = lambda: mono[0]
    assert publisher.publish(now) and len(reads) == 1
    for k in range(1, 12):  # ticks, and two heartbeats, with nothing changed
        mono[0] = k
        publisher.publish(now + k * timedelta(seconds=1))
    assert len(reads) == 1
    asm.allocate("urn:publicid:IDN+t.org+slice+s2", "urn:o", parse_request(request_rspec([vm("b")])),
                 now + 10 * MIN, now)
    mono[0] = 12
    assert publisher.publish(now) and len(reads) == 2
    assert set(store.get(SNAPSHOTS, asm.name)["state"]["slices"]) == {"urn:publicid:IDN+t.org+slice+s1",
                                                                       "urn:publicid:IDN+t.org+slice+s2"}
    mono[0] = 13
    assert not publisher.publish(now) and len(reads) == 2
    asm.shutdown(slivers[0].slice_urn, now)
    mono[0] = 14
    assert publisher.publish(now) and len(reads) == 3
    assert store.get(SNAPSHOTS, asm.name)["state"]["slices"]["urn:publicid:IDN+t.org+slice+s1"]["shut_down"]


def test_a_slice_managers_snapshot_with_operations_pending_is_built_every_tick(tmp_path):
    """The ages of pending operations move on their own: such a state is built again until none is pending."""
    store, asm = embedded(tmp_path)
    now = ManualClock().now()
    pending = [{"state": "Nascent", "pending": "Ticketing", "count": 1, "oldest_seconds": 0.0}]
    states = iter([pending, pending, [], []])
    publisher = publishers_for(store, asm, asm.broker, heartbeat=5.0)[0]
    real = publisher.build
    publisher.build = lambda when: {**real(when), "pending": next(states)}
    reads = counted(asm, "records")
    mono = [0.0]
    publisher.monotonic = lambda: mono[0]
    for k in range(4):
        mono[0] = k
        publisher.publish(now)
    assert len(reads) == 3  # built while pending, and once more to see that none is; then no more


def test_the_authoritys_snapshot_is_built_when_its_leases_change_or_at_the_driver_refresh(tmp_path):
    from operations.snapshot import DRIVER_REFRESH_SECONDS

    store, asm = embedded(tmp_path)
    now = ManualClock().now()
    emulated = publishers_for(store, authority=asm.authority, heartbeat=5.0)[0]
    assert emulated.refresh is None  # its slivers change only by their records' timed transitions
    asm.authority.substrate.changes_on_its_own = True  # as a driver of real hosts says
    publisher = publishers_for(store, authority=asm.authority, heartbeat=5.0)[0]
    reads = counted(asm.authority, "leases")
    mono = [0.0]
    publisher.monotonic = lambda: mono[0]
    assert publisher.publish(now) and len(reads) == 1
    for k in range(1, 10):
        mono[0] = k
        publisher.publish(now)
    assert len(reads) == 1  # no lease written: not built again
    slivers = asm.allocate("urn:publicid:IDN+t.org+slice+s1", "urn:o", parse_request(request_rspec([vm("a")])),
                           now + 10 * MIN, now)
    asm.provision([s.urn for s in slivers], now + 60 * MIN, [], now)
    mono[0] = 10
    assert publisher.publish(now) and len(reads) == 2
    assert len(store.get(SNAPSHOTS, f"authority:{asm.authority.name}")["state"]["leases"]) == 1
    settled = len(reads)
    for k in range(11, 40):  # a booting sliver is asked about until it settles; then nothing is built
        mono[0] = k
        publisher.publish(now + k * timedelta(seconds=1))
    quiet = len(reads)
    mono[0] = 40 + DRIVER_REFRESH_SECONDS  # what the driver sees is looked at again at the refresh
    publisher.publish(now + 100 * timedelta(seconds=1))
    assert len(reads) == quiet + 1 and quiet >= settled
    asm.delete([s.urn for s in slivers], now + 101 * timedelta(seconds=1))
    mono[0] += 1
    assert publisher.publish(now + 101 * timedelta(seconds=1)) and len(reads) == quiet + 2
    assert store.get(SNAPSHOTS, f"authority:{asm.authority.name}")["state"]["leases"] == []


def test_listresources_counts_the_units_in_use_once_per_change_of_the_brokers_state(monkeypatch):
    """The units in use grow with the live slices: they are counted when the broker's answer changes (a new
    answer object), not on every ListResources; an image offered since start still changes the document."""
    from dataclasses import replace
    from types import SimpleNamespace

    from deployment import service
    from resources import InUse
    from rspec.advertisement import AdvertisementCache

    counted_calls: list[int] = []
    real = service.usage_counts
    monkeypatch.setattr(service, "usage_counts", lambda *a: (counted_calls.append(1), real(*a))[1])
    host = SUB.hosts[0].component_id
    answer = [InUse({f"core:{host}": 1}, frozenset())]
    offered = [SUB]
    deployment = SimpleNamespace(sm=SimpleNamespace(in_use=lambda now, window=None: answer[0]), _usage=None,
                                 _ads=AdvertisementCache(), _advertised=SimpleNamespace(substrate=lambda: offered[0]))
    now = ManualClock().now()
    first = service.EmbeddedDeployment._advertise(deployment, False, now)
    for _ in range(4):
        assert service.EmbeddedDeployment._advertise(deployment, False, now) is first
    assert len(counted_calls) == 1
    answer[0] = InUse({f"core:{host}": 2}, frozenset())  # the broker's state changed
    second = service.EmbeddedDeployment._advertise(deployment, False, now)
    assert second is not first and len(counted_calls) == 2
    assert service.EmbeddedDeployment._advertise(deployment, False, now) is second
    offered[0] = replace(SUB, images=())  # the catalogue changed: a new substrate object
    assert service.EmbeddedDeployment._advertise(deployment, False, now) is not second and len(counted_calls) == 2


def test_a_metrics_scrape_reads_the_records_only_when_they_changed(tmp_path):
    from operations.metrics import for_slice_manager

    store, asm = embedded(tmp_path)
    now = ManualClock().now()
    asm.allocate("urn:publicid:IDN+t.org+slice+s1", "urn:o", parse_request(request_rspec([vm("a")])),
                 now + 10 * MIN, now)
    reads = counted(asm, "records")
    metrics = for_slice_manager(SUB, asm, lambda: now, interval=0.0)  # no time cache: every scrape asks
    first = metrics.exposition()
    for _ in range(3):
        metrics.exposition()
    assert len(reads) == 1 and b"slicex_leases_outstanding 0.0" in first
    slivers = asm.allocate("urn:publicid:IDN+t.org+slice+s2", "urn:o", parse_request(request_rspec([vm("b")])),
                           now + 10 * MIN, now)
    asm.provision([s.urn for s in slivers], now + 60 * MIN, [], now)
    assert b"slicex_leases_outstanding 1.0" in metrics.exposition() and len(reads) == 2


def test_without_its_broker_in_process_the_slice_managers_snapshot_follows_the_claim_counters(tmp_path):
    """An AM worker of the distributed deployment has no broker object: the units in use are watched through
    the store's claim counters (no claim read), which change when the broker claims or releases units."""
    store, asm = embedded(tmp_path)
    now = ManualClock().now()
    before = asm.usage_version()
    assert asm.usage_version() == before
    slivers = asm.allocate("urn:publicid:IDN+t.org+slice+s1", "urn:o", parse_request(request_rspec([vm("a")])),
                           now + 10 * MIN, now)
    taken = asm.usage_version()
    assert taken != before
    asm.delete([s.urn for s in slivers], now)
    assert asm.usage_version() == before
    publisher = publishers_for(store, asm, heartbeat=5.0)[0]
    reads = counted(asm, "records")
    mono = [0.0]
    publisher.monotonic = lambda: mono[0]
    assert publisher.publish(now)
    mono[0] = 1
    assert not publisher.publish(now) and len(reads) == 1
