"""The reservation state machine: every pending state times out, stale answers are dropped, nothing granted
to a reservation that gave up is kept, dependencies gate tickets and redeems."""

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from protocol.reservations import PENDING, STATES
from slice_manager import reservation as rs
from slice_manager.reservation import CloseAck, FailedRpc, LeaseUpdate, TicketUpdate

NOW = datetime(2030, 1, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)


def kinds(msgs):
    return [m.kind for m in msgs]


def ticketed(end=NOW + HOUR, **kw):
    r, (m,) = rs.demand(rs.Reservation("r", **kw), NOW, end)
    r, _ = rs.on_update_ticket(r, TicketUpdate(m.request, True, 1, end), NOW)
    return r


def active(end=NOW + HOUR):
    r, (m,) = rs.redeem(ticketed(end), NOW)
    r, _ = rs.on_update_lease(r, LeaseUpdate(m.request, True, 1, end), NOW)
    return r


def test_ticket_redeem_extend_close():
    r, msgs = rs.demand(rs.Reservation("r1"), NOW, NOW + HOUR)
    assert (r.pending, kinds(msgs), msgs[0].request, msgs[0].end) == (rs.TICKETING, ["ticket"], 1, NOW + HOUR)
    r, _ = rs.on_update_ticket(r, TicketUpdate(1, True, 1, NOW + HOUR, (("vlan", 1042),)), NOW)
    assert (r.state, r.pending, r.labels, r.end) == (rs.TICKETED, rs.NONE, (("vlan", 1042),), NOW + HOUR)
    r, (m,) = rs.redeem(r, NOW)
    r, _ = rs.on_update_lease(r, LeaseUpdate(m.request, True, 1, NOW + HOUR), NOW)
    assert r.state == rs.ACTIVE
    r, (m,) = rs.extend(r, NOW, NOW + 3 * HOUR)
    assert (m.kind, m.end) == ("extendTicket", NOW + 3 * HOUR)
    r, msgs = rs.on_update_ticket(r, TicketUpdate(m.request, True, 2, NOW + 3 * HOUR), NOW)
    assert (r.state, r.pending, kinds(msgs)) == (rs.ACTIVE_TICKETED, rs.EXTENDING_LEASE, ["extendLease"])
    r, _ = rs.on_update_lease(r, LeaseUpdate(msgs[0].request, True, 2, NOW + 3 * HOUR), NOW)
    assert (r.state, r.end, r.sequence) == (rs.ACTIVE, NOW + 3 * HOUR, 2)
    r, msgs = rs.close(r, NOW)
    assert kinds(msgs) == ["relinquish", "close"] and r.state == rs.CLOSE_WAIT
    r, _ = rs.on_closed(r, CloseAck(msgs[0].request, "relinquish"), NOW)
    assert r.pending == rs.CLOSING  # still waiting for the authority
    r, _ = rs.on_closed(r, CloseAck(msgs[1].request, "close"), NOW)
    assert (r.state, r.pending) == (rs.CLOSED, rs.NONE)


def test_every_message_carries_a_new_request_number_and_older_answers_are_dropped():
    r = ticketed()
    r, (m1,) = rs.extend(r, NOW, NOW + 2 * HOUR)
    r, _ = rs.on_update_ticket(r, TicketUpdate(m1.request, False, reason="no"), NOW)
    r, (m2,) = rs.extend(r, NOW, NOW + 3 * HOUR)
    assert m2.request == m1.request + 1
    late, msgs = rs.on_update_ticket(r, TicketUpdate(m1.request, True, 2, NOW + 2 * HOUR), NOW)
    assert late == r and msgs == []
    older_copy, _ = rs.on_update_ticket(replace(r, sequence=5), TicketUpdate(m2.request, True, 4), NOW)
    assert older_copy.pending == rs.EXTENDING_TICKET  # ticket version 4 is older than the 5 held


def test_a_refused_ticket_fails_with_the_brokers_reason_and_gives_back_what_may_be_held():
    r, (m,) = rs.demand(rs.Reservation("r", resource="node n1"), NOW, NOW + HOUR)
    reason = "broker b: node n1: asked for 4 core on one host; most free: 2 core on pc1"
    r, msgs = rs.on_update_ticket(r, TicketUpdate(m.request, False, reason=reason), NOW)
    assert r.state == rs.FAILED and r.reason == reason and kinds(msgs) == ["relinquish"]


def test_a_failed_redeem_releases_ticket_and_lease():
    r, (m,) = rs.redeem(ticketed(), NOW)
    r, msgs = rs.on_update_lease(r, LeaseUpdate(m.request, False, reason="authority a: pc1 is down"), NOW)
    assert r.state == rs.FAILED and kinds(msgs) == ["relinquish", "close"]


def test_a_refused_extension_keeps_what_is_held():
    r, (m,) = rs.extend(active(), NOW, NOW + 5 * HOUR)
    r, msgs = rs.on_update_ticket(r, TicketUpdate(m.request, False, reason="promised to someone else"), NOW)
    assert (r.state, r.pending, r.end, msgs) == (rs.ACTIVE, rs.NONE, NOW + HOUR, [])
    assert "refused" in r.reason and "someone else" in r.reason


def test_a_refused_lease_extension_keeps_the_lease():
    r, (m,) = rs.extend(active(), NOW, NOW + 5 * HOUR)
    r, (m,) = rs.on_update_ticket(r, TicketUpdate(m.request, True, 2, NOW + 5 * HOUR), NOW)
    r, _ = rs.on_update_lease(r, LeaseUpdate(m.request, False, reason="site policy"), NOW)
    assert (r.state, r.end) == (rs.ACTIVE, NOW + HOUR) and "still ends" in r.reason


def test_grants_arriving_after_giving_up_are_given_back():
    r, (m,) = rs.demand(rs.Reservation("r"), NOW, NOW + HOUR)
    failed, _ = rs.on_tick(r, NOW + rs.PENDING_TIMEOUT[rs.TICKETING] + timedelta(seconds=1))
    assert failed.state == rs.FAILED
    _, msgs = rs.on_update_ticket(failed, TicketUpdate(m.request, True, 1, NOW + HOUR), NOW)
    assert kinds(msgs) == ["relinquish"]
    r, (m,) = rs.redeem(ticketed(), NOW)
    closing, _ = rs.close(r, NOW)
    _, msgs = rs.on_update_lease(closing, LeaseUpdate(m.request, True, 1, NOW + HOUR), NOW)
    assert kinds(msgs) == ["close"]


def test_close_wins_over_an_operation_in_flight_and_twice_is_once():
    r, _ = rs.redeem(ticketed(), NOW)
    r, msgs = rs.close(r, NOW)
    assert kinds(msgs) == ["relinquish", "close"] and r.pending == rs.CLOSING
    again, more = rs.close(r, NOW)
    assert again == r and more == []
    nascent, msgs = rs.close(rs.Reservation("n"), NOW)
    assert nascent.state == rs.CLOSED and msgs == []


def test_busy_reservation_refuses_a_second_operation():
    r, _ = rs.redeem(ticketed(), NOW)
    with pytest.raises(rs.TransitionError, match="busy"):
        rs.extend(replace(r, state=rs.ACTIVE), NOW, NOW + HOUR)
    with pytest.raises(rs.TransitionError, match="Nascent"):
        rs.demand(r, NOW)


def test_failed_rpc_fails_gets_but_not_extensions():
    r, (m,) = rs.demand(rs.Reservation("r"), NOW, NOW + HOUR)
    r, msgs = rs.on_failed_rpc(r, FailedRpc(m.request, "ticket", "broker at https://b:8002 is not answering"), NOW)
    assert r.state == rs.FAILED and "not answering" in r.reason and kinds(msgs) == ["relinquish"]
    r, (m,) = rs.extend(active(), NOW, NOW + 2 * HOUR)
    r, msgs = rs.on_failed_rpc(r, FailedRpc(m.request, "extendTicket", "timed out"), NOW)
    assert (r.state, r.pending, msgs) == (rs.ACTIVE, rs.NONE, [])


@pytest.mark.parametrize("pending", sorted(rs.PENDING_TIMEOUT))
def test_every_pending_state_times_out(pending):
    state = rs.CLOSE_WAIT if pending == rs.CLOSING else rs.ACTIVE_TICKETED if pending == rs.EXTENDING_LEASE \
        else rs.ACTIVE if pending == rs.EXTENDING_TICKET else rs.TICKETED
    r = rs.Reservation("r", state=state, pending=pending, pending_since=NOW, end=NOW + 10 * HOUR,
                       awaiting=("relinquish", "close") if pending == rs.CLOSING else ())
    same, _ = rs.on_tick(r, NOW + rs.PENDING_TIMEOUT[pending])
    assert same.pending == pending
    later, msgs = rs.on_tick(r, NOW + rs.PENDING_TIMEOUT[pending] + timedelta(seconds=1))
    assert later.pending == rs.NONE
    if pending in (rs.TICKETING, rs.REDEEMING):
        assert later.state == rs.FAILED and "did not answer" in later.reason and "relinquish" in kinds(msgs)
    elif pending == rs.PRIMING:
        assert later.state == rs.FAILED and "gave up" in later.reason and kinds(msgs) == ["relinquish"]
    elif pending == rs.CLOSING:
        assert later.state == rs.CLOSED and "not confirmed" in later.reason
        assert kinds(msgs) == ["relinquish", "close"]  # sent once more
    else:
        assert later.state == rs.ACTIVE and "still ends" in later.reason and msgs == []


def test_expired_term_closes_itself():
    r = active(NOW + HOUR)
    assert rs.on_tick(r, NOW + HOUR - timedelta(seconds=1))[0] == r
    r, msgs = rs.on_tick(r, NOW + HOUR)
    assert r.state == rs.CLOSE_WAIT and kinds(msgs) == ["relinquish", "close"] and "term ended" in r.reason


def test_a_consumer_waits_for_its_producers_tag_then_asks_with_it():
    link = rs.Reservation("link", resource="link lan0")
    consumer = rs.Reservation("hop", resource="link lan0 at sw2", depends_on=("link",))
    consumer, msgs = rs.demand(consumer, NOW, NOW + HOUR, {"link": link})
    assert (consumer.pending, consumer.blocked, msgs) == (rs.PRIMING, "ticket", [])
    link, (m,) = rs.demand(link, NOW, NOW + HOUR)
    link, _ = rs.on_update_ticket(link, TicketUpdate(m.request, True, 1, NOW + HOUR, (("vlan", 1042),)), NOW)
    consumer, msgs = rs.on_dependencies(consumer, {"link": link}, NOW)
    assert consumer.pending == rs.TICKETING and msgs[0].inputs == (("vlan", 1042),) and msgs[0].end == NOW + HOUR


def test_a_node_redeems_only_after_its_link_is_active():
    link = ticketed()
    node = rs.Reservation("node", state=rs.TICKETED, depends_on=("link",), end=NOW + HOUR)
    waiting, msgs = rs.redeem(node, NOW, {})  # producer not known yet: wait
    assert waiting.pending == rs.PRIMING and msgs == []
    node, msgs = rs.redeem(node, NOW, {"link": link})  # producer only ticketed: wait
    assert node.pending == rs.PRIMING and node.blocked == "redeem" and msgs == []
    link_active = replace(link, state=rs.ACTIVE)
    node, msgs = rs.on_dependencies(node, {"link": link_active}, NOW)
    assert node.pending == rs.REDEEMING and kinds(msgs) == ["redeem"]


def test_a_failed_producer_fails_its_dependants_with_the_reason():
    producer = rs.Reservation("p", state=rs.FAILED, reason="VLAN 1042 unavailable", resource="link lan0")
    r, _ = rs.demand(rs.Reservation("c", resource="node n1", depends_on=("p",)), NOW, NOW + HOUR)
    r, _ = rs.on_dependencies(r, {"p": producer}, NOW)
    assert r.state == rs.FAILED and r.reason == "node n1 depends on link lan0, which failed: VLAN 1042 unavailable"


def test_the_embedded_interface_without_request_numbers():
    r, _ = rs.demand(rs.Reservation("r", sequence=5), NOW)
    same, msgs = rs.on_update(r, "ticket", True, 4, NOW)
    assert same == r and msgs == []
    r, _ = rs.on_update(r, "ticket", True, 5, NOW)
    assert r.state == rs.TICKETED
    r, _ = rs.redeem(r, NOW)
    r, _ = rs.on_update(r, "lease", True, 5, NOW)
    r, _ = rs.close(r, NOW)
    r, _ = rs.on_update(r, "closed", True, 5, NOW)
    assert r.state == rs.CLOSED


EVENTS = st.lists(st.sampled_from(["demand", "redeem", "extend", "close", "ok", "fail", "lost", "tick", "late",
                                   "stray-ticket", "stray-lease"]), max_size=40)


@settings(max_examples=300)
@given(EVENTS)
def test_no_sequence_of_events_leaves_a_reservation_pending_or_holding_after_its_term(seq):
    """Whatever happens (answers, refusals, lost messages, late answers, time), some hours after the term
    nothing is pending, nothing is held, and everything that was ever held was asked back."""
    r = rs.Reservation("r")
    t = NOW
    owes: set[str] = set()  # what was granted and not yet asked back
    end = NOW + timedelta(minutes=30)

    def track(r, msgs):
        if r.state in rs.HOLDS_TICKET:
            owes.add("relinquish")
        if r.state in rs.HOLDS_LEASE:
            owes.add("close")
        owes.difference_update(m.kind for m in msgs)

    for e in seq + ["tick"] * 4:
        msgs = []
        try:
            if e == "demand":
                r, msgs = rs.demand(r, t, end)
            elif e == "redeem":
                r, msgs = rs.redeem(r, t)
            elif e == "extend":
                end = end + timedelta(minutes=10)
                r, msgs = rs.extend(r, t, end)
            elif e == "close":
                r, msgs = rs.close(r, t)
            elif e in ("ok", "fail", "late"):
                req = r.request - (1 if e == "late" else 0)
                if r.pending in (rs.TICKETING, rs.EXTENDING_TICKET):
                    r, msgs = rs.on_update_ticket(r, TicketUpdate(req, e != "fail", r.sequence + 1, end), t)
                elif r.pending in (rs.REDEEMING, rs.EXTENDING_LEASE):
                    r, msgs = rs.on_update_lease(r, LeaseUpdate(req, e != "fail", r.sequence, end), t)
                elif r.pending == rs.CLOSING:
                    for what in r.awaiting:
                        r, more = rs.on_closed(r, CloseAck(req, what), t)
                        msgs += more
            elif e == "lost":
                r, msgs = rs.on_failed_rpc(r, FailedRpc(r.request, "x", "lost"), t)
            elif e == "stray-ticket":  # a grant whose answer was lost arrives now, whatever the state
                if r.request:
                    owes.add("relinquish")
                    r, msgs = rs.on_update_ticket(r, TicketUpdate(r.request, True, r.sequence + 1, end), t)
            elif e == "stray-lease":
                if r.request and r.state != rs.NASCENT:
                    owes.add("close")
                    r, msgs = rs.on_update_lease(r, LeaseUpdate(r.request, True, r.sequence, end), t)
            else:
                t += timedelta(minutes=45) if len(seq) else timedelta(hours=1)
                r, msgs = rs.on_tick(r, t)
        except rs.TransitionError:
            pass
        assert r.state in STATES and r.pending in PENDING
        track(r, msgs)
    for _ in range(4):
        t += timedelta(hours=1)
        r, msgs = rs.on_tick(r, t)
        track(r, msgs)
    assert r.pending == rs.NONE and r.state in (rs.NASCENT, rs.CLOSED, rs.FAILED)
    assert owes == set(), f"never asked back: {owes}"
