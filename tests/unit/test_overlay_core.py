"""The overlay's pure core: namespace pool, lease state machine, routing and proxy-ARP decisions, frame
codecs. The property test drives many nodes' lease machines against a reference put-if-absent store with
expiry (the semantics the Redis script implements; test_overlay_claims.py checks Redis against the same
reference) through random interleavings and clock advances: no two nodes ever believe they hold one
address at the same moment."""

from __future__ import annotations

import random
import struct
import zlib
from dataclasses import dataclass, field
from ipaddress import IPv4Address

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federation.overlay import core, frames
from federation.overlay.core import (
    Holder,
    Lease,
    LookupCache,
    NamespaceConfig,
    Outcome,
    Phase,
    Where,
)
from slicex.errors import BadArgs

A = IPv4Address


def holder(node: str, endpoint: str = "127.0.0.1:4000", cluster: str = "c1") -> Holder:
    return Holder(node, endpoint, cluster, "02:00:00:00:00:%02x" % (zlib.crc32(node.encode()) & 0xFF))


@dataclass
class ReferenceStore:
    """Put-if-absent with expiry, as IPOP's DHT Create and our Redis script behave: an expired entry is
    gone; the same value renews; another value is refused."""

    entries: dict[IPv4Address, tuple[str, float]] = field(default_factory=dict)

    def claim(self, address: IPv4Address, value: str, lease: float, now: float) -> Outcome:
        cur = self.entries.get(address)
        if cur is not None and cur[1] <= now:
            cur = None
        if cur is None:
            self.entries[address] = (value, now + lease)
            return Outcome.WON
        if cur[0] == value:
            self.entries[address] = (value, now + lease)
            return Outcome.RENEWED
        return Outcome.TAKEN

    def release(self, address: IPv4Address, value: str, now: float) -> bool:
        cur = self.entries.get(address)
        if cur is not None and cur[0] == value and cur[1] > now:
            del self.entries[address]
            return True
        return False


# ---- namespace configuration -----------------------------------------------------------------------------------
def test_pool_excludes_network_broadcast_lowest_host_and_reserved():
    cfg = NamespaceConfig.build("s1", "10.0.0.0/29", 30, ["10.0.0.5"])
    assert cfg.candidates() == [A("10.0.0.2"), A("10.0.0.3"), A("10.0.0.4"), A("10.0.0.6")]
    assert not cfg.claimable(A("10.0.0.1")) and not cfg.claimable(A("10.0.1.2"))
    assert cfg.renew_after == 7.5


@pytest.mark.parametrize("args, words", [
    (("bad name", "10.0.0.0/24", 30), "namespace name"),
    (("s1", "10.0.0.1/24", 30), "not an IPv4 network"),
    (("s1", "10.0.0.0/31", 30), "too small"),
    (("s1", "10.0.0.0/24", 0), "lease"),
    (("s1", "10.0.0.0/24", 30, ["10.0.1.9"]), "outside"),
    (("s1", "10.0.0.0/24", 30, ["x"]), "not an IPv4 address"),
])
def test_bad_namespace_configuration_is_bad_args_saying_why(args, words):
    with pytest.raises(BadArgs, match=words):
        NamespaceConfig.build(*args)


def test_namespace_and_holder_round_trip_through_their_stored_text():
    cfg = NamespaceConfig.build("urn:publicid:IDN+a.test+slice+s1", "10.9.0.0/16", 12.5, ["10.9.0.7"])
    assert NamespaceConfig.from_json(cfg.name, cfg.to_json()) == cfg
    h = holder("n1")
    assert Holder.decode(h.encode()) == h and h.udp == ("127.0.0.1", 4000)
    with pytest.raises(BadArgs, match="not an overlay holder"):
        Holder.decode('{"node": "x"}')
    with pytest.raises(BadArgs, match="host:port"):
        Holder("n1", "127.0.0.1", "c", "02:00:00:00:00:01")
    with pytest.raises(BadArgs, match="MAC"):
        Holder("n1", "127.0.0.1:1", "c", "02-00-00-00-00-01")


def test_candidate_order_tries_the_preferred_address_first_then_every_other_once():
    cfg = NamespaceConfig.build("s1", "10.0.0.0/27", 30)
    order = list(core.candidate_order(cfg, random.Random(3), preferred=A("10.0.0.9")))
    assert order[0] == A("10.0.0.9")
    assert sorted(order) == cfg.candidates()
    with pytest.raises(BadArgs, match="cannot be claimed"):
        list(core.candidate_order(cfg, random.Random(3), preferred=A("10.0.0.1")))


# ---- the lease state machine -----------------------------------------------------------------------------------
CFG = NamespaceConfig.build("s1", "10.0.0.0/28", 8)


def test_a_won_claim_is_bound_for_a_lease_from_when_it_was_sent_and_renews_at_a_quarter():
    lease = core.on_claim(Lease(), CFG, A("10.0.0.4"), Outcome.WON, sent_at=100.0)
    assert lease.phase is Phase.BOUND and lease.expires_at == 108.0 and lease.renew_at == 102.0
    assert not core.renew_due(lease, 101.9) and core.renew_due(lease, 102.0)
    renewed = core.on_claim(lease, CFG, A("10.0.0.4"), Outcome.RENEWED, sent_at=102.5)
    assert renewed.expires_at == 110.5 and renewed.renew_at == 104.5


def test_a_taken_address_is_remembered_and_a_bound_one_taken_is_lost():
    lease = core.on_claim(Lease(), CFG, A("10.0.0.4"), Outcome.TAKEN, sent_at=1.0)
    assert lease.phase is Phase.UNBOUND and lease.tried == (A("10.0.0.4"),)
    bound = core.on_claim(lease, CFG, A("10.0.0.5"), Outcome.WON, sent_at=2.0)
    lost = core.on_claim(bound, CFG, A("10.0.0.5"), Outcome.TAKEN, sent_at=11.0)
    assert lost.phase is Phase.LOST and "held by another node" in lost.reason


def test_a_lease_runs_out_without_renewal_and_store_errors_do_not_extend_it():
    bound = core.on_claim(Lease(), CFG, A("10.0.0.4"), Outcome.WON, sent_at=0.0)
    assert core.on_store_error(bound, 7.9, "down").phase is Phase.BOUND
    assert core.on_store_error(bound, 8.0, "down").phase is Phase.LOST
    assert core.on_tick(bound, 7.99).usable(7.99) and core.on_tick(bound, 8.0).phase is Phase.LOST
    gone = core.on_release(bound)
    assert gone.phase is Phase.RELEASED
    assert core.on_claim(gone, CFG, A("10.0.0.4"), Outcome.WON, 9.0).phase is Phase.RELEASED


ops = st.lists(st.tuples(st.sampled_from(["join", "renew", "release", "tick", "crash"]),
                         st.integers(0, 5), st.floats(0, 6, allow_nan=False)), min_size=1, max_size=120)


@settings(max_examples=300, deadline=None)
@given(ops=ops, seed=st.integers(0, 2**32 - 1))
def test_no_two_nodes_ever_hold_one_address_at_once(ops, seed):
    """Six nodes in a 5-address namespace (8 s lease) join, renew on time or late, release, crash (stop
    renewing silently) and let time pass, in any order; the store's replies are the reference semantics.
    At every step, the addresses usable by nodes are distinct."""
    cfg = NamespaceConfig.build("s1", "10.0.0.0/29", 8)
    rng = random.Random(seed)
    store = ReferenceStore()
    nodes = [holder(f"n{i}") for i in range(6)]
    leases = [Lease() for _ in nodes]
    now = 0.0
    for op, i, dt in ops:
        now += dt
        h, lease = nodes[i], core.on_tick(leases[i], now)
        if op == "join" and lease.phase is not Phase.BOUND:
            lease = Lease()
            for address in core.candidate_order(cfg, rng):
                lease = core.on_claim(lease, cfg, address, store.claim(address, h.encode(), cfg.lease, now), now)
                if lease.phase is Phase.BOUND:
                    break
        elif op == "renew" and lease.phase is Phase.BOUND:
            assert lease.address is not None
            lease = core.on_claim(lease, cfg, lease.address,
                                  store.claim(lease.address, h.encode(), cfg.lease, now), now)
        elif op == "release" and lease.phase is Phase.BOUND:
            assert lease.address is not None
            store.release(lease.address, h.encode(), now)
            lease = core.on_release(lease)
        elif op == "crash":
            lease = Lease()  # forgets its claim; the store frees it when the lease runs out
        leases[i] = lease
        held = [lz.address for lz in leases if lz.usable(now)]
        assert len(held) == len(set(held)), (now, leases)
        for lz, n in zip(leases, nodes, strict=True):
            if lz.usable(now):  # what a node believes it holds, the store says it holds
                value, until = store.entries[lz.address]
                assert value == n.encode() and until >= lz.expires_at > now


# ---- routing and proxy ARP -------------------------------------------------------------------------------------
ME, THEM = "127.0.0.1:5000", "127.0.0.1:6000"
NS = NamespaceConfig.build("s1", "10.1.0.0/24", 30)


def test_route_sends_local_claims_to_the_segment_remote_ones_to_their_router_and_drops_the_rest():
    assert core.route(NS, A("10.1.0.9"), holder("a", ME), ME).where is Where.LOCAL
    r = core.route(NS, A("10.1.0.9"), holder("b", THEM), ME)
    assert r.where is Where.REMOTE and r.holder.udp == ("127.0.0.1", 6000)
    assert "not claimed" in core.route(NS, A("10.1.0.9"), None, ME).reason
    assert "outside" in core.route(NS, A("10.2.0.9"), holder("b", THEM), ME).reason


@pytest.mark.parametrize("sender, target, owner, segment, answer", [
    ("10.1.0.5", "10.1.0.9", THEM, [], True),                # remote claim: the router answers
    ("10.1.0.5", "10.1.0.9", ME, [], False),                 # claimed on this segment: the host answers
    ("10.1.0.5", "10.1.0.9", THEM, ["10.1.0.9"], False),     # seen on this segment (migrated here)
    ("10.1.0.5", "10.1.0.9", None, [], False),               # unclaimed
    ("10.1.0.5", "10.2.0.9", THEM, [], False),               # outside the namespace
    ("10.1.0.5", "10.1.0.1", THEM, [], False),               # reserved
    ("0.0.0.0", "10.1.0.9", THEM, [], False),                # an address probe (RFC 5227)
    ("10.1.0.9", "10.1.0.9", THEM, [], False),               # gratuitous ARP
])
def test_proxy_arp_answers_only_for_remote_claimed_addresses(sender, target, owner, segment, answer):
    h = holder("x", owner) if owner else None
    assert core.answer_arp(NS, A(sender), A(target), h, ME, [A(s) for s in segment]) is answer


def test_lookup_cache_keeps_positive_answers_longer_than_negative_ones():
    cache = LookupCache(positive=2.0, negative=0.2)
    cache.put(A("10.1.0.2"), holder("a"), 10.0)
    cache.put(A("10.1.0.3"), None, 10.0)
    assert cache.get(A("10.1.0.3"), 10.1) == (True, None)
    assert cache.get(A("10.1.0.3"), 10.25) == (False, None)
    assert cache.get(A("10.1.0.2"), 11.9)[0] and not cache.get(A("10.1.0.2"), 12.0)[0]


# ---- frames ----------------------------------------------------------------------------------------------------
def test_arp_reply_answers_the_asker_with_the_given_mac():
    me = bytes.fromhex("020000000001")
    req = frames.parse_arp(frames.arp_request(me, A("10.1.0.5"), A("10.1.0.9")))
    assert req is not None and req.op == frames.ARP_REQUEST
    reply = frames.arp_reply(req, frames.ROUTER_MAC)
    got = frames.parse_arp(reply)
    assert reply[:6] == me and got.op == frames.ARP_REPLY
    assert (got.sender_mac, got.sender_ip, got.target_ip) == (frames.ROUTER_MAC, A("10.1.0.9"), A("10.1.0.5"))


@given(ns=st.binary(min_size=0, max_size=200), body=st.binary(min_size=14, max_size=1600))
def test_encapsulation_round_trips_and_rejects_foreign_datagrams(ns, body):
    assert frames.decapsulate(frames.encapsulate(ns, body)) == (ns, body, frames.NO_OFFLOAD)
    assert frames.decapsulate(b"XXXX" + frames.encapsulate(ns, body)[4:]) is None
    offload = frames.OFFLOAD.pack(frames.NEEDS_CSUM, frames.GSO_TCPV4, 66, 1448, 34, 16)
    assert frames.decapsulate(frames.encapsulate(ns, body, offload)) == (ns, body, offload)


def test_an_ordinary_frame_travels_as_version_1_which_routers_without_offloads_read():
    assert frames.encapsulate(b"s1", b"\x02" * 14)[4] == frames.VERSION
    offload = frames.OFFLOAD.pack(frames.NEEDS_CSUM, frames.GSO_NONE, 0, 0, 34, 16)
    assert frames.encapsulate(b"s1", b"\x02" * 14, offload)[4] == frames.VERSION_OFFLOADED


# a checksum written apart from frames._checksum, so the two cannot share a mistake
def _ones_sum(data: bytes) -> int:
    data = data + b"\x00" * (len(data) % 2)
    total = 0
    for i in range(0, len(data), 2):
        total += data[i] << 8 | data[i + 1]
        total = (total & 0xFFFF) + (total >> 16)
    return total


def _partial_tcp_frame(payload: bytes, flags: int = 0x18) -> tuple[bytes, bytes]:
    """A TCP/IPv4 frame as a kernel hands it to a tap with offloads: checksum field holding the pseudo-header's
    sum only (CHECKSUM_PARTIAL), with its offload header for `gso_size` 1000."""
    src, dst = A("10.1.0.5").packed, A("10.1.0.9").packed
    tcp_len = 20 + len(payload)
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + tcp_len, 7, 0x4000, 64, 6, 0, src, dst))
    struct.pack_into("!H", ip, 10, ~_ones_sum(bytes(ip)) & 0xFFFF)
    seed = _ones_sum(src + dst + struct.pack("!BBH", 0, 6, tcp_len))
    tcp = struct.pack("!HHIIBBHHH", 40000, 5201, 1_000_000, 5, 5 << 4, flags, 512, seed, 0)
    frame = b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00" + bytes(ip) + tcp + payload
    gso = frames.GSO_TCPV4 if len(payload) > 1000 else frames.GSO_NONE
    return frame, frames.OFFLOAD.pack(frames.NEEDS_CSUM, gso, 54, 1000 if gso else 0, 34, 16)


def _tcp_valid(frame: bytes) -> bool:
    ip, tcp = frame[14:34], frame[34:]
    pseudo = ip[12:20] + struct.pack("!BBH", 0, 6, len(tcp))
    return _ones_sum(ip) == 0xFFFF and _ones_sum(pseudo + tcp) == 0xFFFF


def test_a_frame_with_its_checksum_left_undone_is_completed_for_a_tap_without_offloads():
    frame, offload = _partial_tcp_frame(b"hello overlay")
    assert not _tcp_valid(frame)
    [done] = frames.plain_frames(frame, offload)
    assert _tcp_valid(done) and done[:50] == frame[:50] and done[52:] == frame[52:]


def test_a_super_frame_is_cut_into_valid_segments_of_gso_size():
    payload = bytes(range(256)) * 14 + b"tail"  # 3588 bytes: three full segments and a short one
    frame, offload = _partial_tcp_frame(payload, flags=0x18 | 0x80)  # PSH, ACK, CWR
    segs = frames.plain_frames(frame, offload)
    assert [len(s) - 54 for s in segs] == [1000, 1000, 1000, 588]
    assert all(_tcp_valid(s) for s in segs)
    assert b"".join(s[54:] for s in segs) == payload
    assert [struct.unpack_from("!I", s, 38)[0] - 1_000_000 for s in segs] == [0, 1000, 2000, 3000]
    assert [struct.unpack_from("!H", s, 16)[0] for s in segs] == [1040, 1040, 1040, 628]  # IP total length
    assert [s[47] for s in segs] == [0x90, 0x10, 0x10, 0x18]  # CWR on the first, PSH on the last only


def test_an_offload_this_router_cannot_finish_drops_the_frame():
    frame, _ = _partial_tcp_frame(bytes(3000))
    assert frames.plain_frames(frame, frames.OFFLOAD.pack(1, 5, 42, 1000, 34, 6)) == []  # UDP GSO
    assert frames.plain_frames(frame, frames.NO_OFFLOAD) == [frame]


def test_ipv4_addresses_reads_source_and_destination():
    ip = bytes([0x45, 0, 0, 20]) + bytes(8) + A("10.1.0.5").packed + A("10.1.0.9").packed
    frame = b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00" + ip
    assert frames.ipv4_addresses(frame) == (A("10.1.0.5"), A("10.1.0.9"))
    assert frames.ipv4_addresses(frame[:12] + b"\x86\xdd" + ip) is None
