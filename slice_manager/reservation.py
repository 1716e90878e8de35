"""The reservation state machine (ORCA, DESIGN §2), as pure transitions.

A reservation is in one state (Nascent, Ticketed, Active, ActiveTicketed, CloseWait, Closed, Failed) and has
at most one pending operation (Ticketing, Redeeming, ExtendingTicket, ExtendingLease, Closing, Priming).
Every transition is a function `(reservation, event, now) -> (reservation, [messages])`: it returns the new
value and what an edge must send next; it never sends, stores or reads a clock itself.

* **Sequence numbers.** `request` counts the requests sent for the reservation; every message carries it and
  every answer echoes it, so an answer to an older request is stale and dropped. `sequence` is the version of
  the ticket/lease last accepted (the broker numbers a ticket 1 and +1 per extension); an older copy is
  dropped too.
* **Timeouts.** Every pending operation has a deadline; `on_tick` ends a reservation stuck past it. Ticketing,
  Redeeming and Priming fail (reason: which actor did not answer what, for which resource) and ask for
  everything that may have been granted to be given back; a timed-out extension falls back to what is still
  held (the sliver keeps running until its old end); a close that is not confirmed is final anyway (the
  actors' own expiry releases what they hold at the term's end) and its messages are sent once more.
* **Nothing leaks.** An answer that grants something to a reservation that has failed, is closing or is
  closed is answered with relinquish/close.
* **Dependencies.** A reservation may depend on others: a consumer's ticket waits until its producers hold
  tickets (it needs the VLAN tag the producer chose), and its redeem until they are active; with
  `gate="redeem"` only the redeem waits (a node after the links it attaches to). While a dependency is not
  far enough along, the operation waits in Priming (with its timeout); when it is, the operation starts with
  the producers' labels as inputs; if a dependency fails, so does the dependant, saying why.
* **Expiry.** A reservation whose term has ended closes itself on the next tick."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

import msgspec
from msgspec.structs import replace

from protocol.reservations import (
    ACTIVE,
    ACTIVE_TICKETED,
    CLOSE_WAIT,
    CLOSED,
    CLOSING,
    EXTENDING_LEASE,
    EXTENDING_TICKET,
    FAILED,
    HOLDS_LEASE,
    HOLDS_TICKET,
    NASCENT,
    NONE,
    PRIMING,
    REDEEMING,
    TICKETED,
    TICKETING,
)

PENDING_TIMEOUT = {TICKETING: timedelta(seconds=30), REDEEMING: timedelta(minutes=5),
                   EXTENDING_TICKET: timedelta(seconds=30), EXTENDING_LEASE: timedelta(minutes=1),
                   CLOSING: timedelta(minutes=2), PRIMING: timedelta(minutes=5)}
"""How long each pending operation may take before the reservation gives up on it."""

ACTOR_OF = {TICKETING: "broker", EXTENDING_TICKET: "broker", REDEEMING: "authority", EXTENDING_LEASE: "authority",
            CLOSING: "broker and authority", PRIMING: "dependencies"}

Labels = tuple[tuple[str, int], ...]


class TransitionError(ValueError):
    """An operation that is not allowed in the reservation's current state."""


class Reservation(msgspec.Struct, frozen=True, omit_defaults=True):
    """One reservation's state (what the slice manager stores of it inside its record: its defaults left out)."""

    id: str
    state: str = NASCENT
    pending: str = NONE
    pending_since: datetime | None = None
    sequence: int = 0  # version of the ticket/lease last accepted
    reason: str = ""  # why it failed (or why the last operation was refused), in words a user can act on
    request: int = 0  # number of the latest request sent; answers echo it
    resource: str = ""  # what it is for, in words: "node n1 (XOSmall VM on pc2)"
    depends_on: tuple[str, ...] = ()
    gate: str = "ticket"  # the first operation that waits for depends_on: "ticket" (and then redeem) or "redeem"
    blocked: str = ""  # the operation waiting in Priming for dependencies: "ticket" | "redeem"
    labels: Labels = ()  # labels its ticket carries (e.g. the VLAN tag the broker chose)
    start: datetime | None = None  # term asked for / held
    end: datetime | None = None
    want_end: datetime | None = None  # end asked for by the operation in flight
    deadline: datetime | None = None  # when the pending operation times out
    awaiting: tuple[str, ...] = ()  # what a close still waits to hear back about: "relinquish", "close"

    @property
    def terminal(self) -> bool:
        return self.state in (CLOSED, FAILED)


class Message(msgspec.Struct, frozen=True, omit_defaults=True):
    """What an edge must send next. kind: ticket | extendTicket | relinquish | redeem | extendLease | close."""

    kind: str
    reservation: str
    request: int = 0
    start: datetime | None = None
    end: datetime | None = None
    inputs: Labels = ()  # labels of the producers this reservation depends on


# ---- events (answers from actors) ------------------------------------------------------------------------------
@dataclass(frozen=True)
class TicketUpdate:
    """The broker's answer to ticket / extendTicket (ORCA updateTicket)."""

    request: int
    ok: bool
    sequence: int = 0
    end: datetime | None = None
    labels: Labels = ()
    reason: str = ""


@dataclass(frozen=True)
class LeaseUpdate:
    """The authority's answer to redeem / extendLease (ORCA updateLease)."""

    request: int
    ok: bool
    sequence: int = 0
    end: datetime | None = None
    reason: str = ""


@dataclass(frozen=True)
class CloseAck:
    """A broker's answer to relinquish or an authority's to close."""

    request: int
    what: str  # "relinquish" | "close"


@dataclass(frozen=True)
class FailedRpc:
    """A message could not be delivered or the actor could not process it (ORCA failedRPC)."""

    request: int
    kind: str  # the message kind that failed
    reason: str


# ---- helpers ----------------------------------------------------------------------------------------------------
def _span(when: datetime | None) -> str:
    return f"{when:%Y-%m-%dT%H:%M:%SZ}" if when else "?"


def _name(r: Reservation) -> str:
    return r.resource or r.id


def _send(r: Reservation, pending: str, now: datetime, kind: str, **msg) -> tuple[Reservation, list[Message]]:
    n = r.request + 1
    r = replace(r, pending=pending, pending_since=now, deadline=now + PENDING_TIMEOUT[pending], request=n,
                blocked="")
    return r, [Message(kind, r.id, n, **msg)]


def _idle(r: Reservation, state: str, **changes) -> Reservation:
    return replace(r, state=state, pending=NONE, pending_since=None, deadline=None, blocked="", want_end=None,
                   **changes)


def releases(r: Reservation, request: int | None = None) -> list[Message]:
    """The messages that give back whatever `r` may hold (or may have been granted while an answer was lost)."""
    n = r.request if request is None else request
    out = []
    if r.state in HOLDS_TICKET or r.pending in (TICKETING, EXTENDING_TICKET) or "relinquish" in r.awaiting:
        out.append(Message("relinquish", r.id, n))
    if r.state in HOLDS_LEASE or r.pending in (REDEEMING, EXTENDING_LEASE) or "close" in r.awaiting:
        out.append(Message("close", r.id, n))
    return out


def _fail(r: Reservation, reason: str, now: datetime) -> tuple[Reservation, list[Message]]:
    msgs = releases(r)
    return _idle(r, FAILED, reason=reason), msgs


def _dependencies(r: Reservation, producers: Mapping[str, Reservation] | None, need: str) -> tuple[str, str, Labels]:
    """("ready" | "waiting" | "failed", reason, producers' labels)."""
    if not r.depends_on or (need == "ticket" and r.gate == "redeem"):
        return "ready", "", ()
    producers = producers or {}
    ok_states = HOLDS_TICKET if need == "ticket" else HOLDS_LEASE
    labels: list[tuple[str, int]] = []
    waiting = False
    for pid in r.depends_on:
        p = producers.get(pid)
        if p is None:
            waiting = True
            continue
        if p.state in (FAILED, CLOSED, CLOSE_WAIT):
            why = f"failed: {p.reason}" if p.state == FAILED else "was closed"
            return "failed", f"{_name(r)} depends on {_name(p)}, which {why}", ()
        if p.state not in ok_states:
            waiting = True
            continue
        labels.extend(p.labels)
    return ("waiting" if waiting else "ready"), "", tuple(labels)


def _start_or_wait(r: Reservation, op: str, producers: Mapping[str, Reservation] | None,
                   now: datetime) -> tuple[Reservation, list[Message]]:
    status, reason, inputs = _dependencies(r, producers, op)
    if status == "failed":
        return _fail(r, reason, now)
    if status == "waiting":
        return replace(r, pending=PRIMING, pending_since=now, deadline=now + PENDING_TIMEOUT[PRIMING], blocked=op), []
    if op == "ticket":
        return _send(r, TICKETING, now, "ticket", start=r.start, end=r.want_end, inputs=inputs)
    return _send(r, REDEEMING, now, "redeem", end=r.end, inputs=inputs)


def _require_idle(r: Reservation) -> None:
    if r.pending != NONE:
        raise TransitionError(f"reservation {r.id} is busy ({r.pending}); try again when it finishes")


# ---- operations the slice manager starts -----------------------------------------------------------------------
def demand(r: Reservation, now: datetime, end: datetime | None = None, producers: Mapping[str, Reservation] | None = None,
           start: datetime | None = None) -> tuple[Reservation, list[Message]]:
    """Ask the broker for a ticket (after the producers this depends on hold theirs)."""
    if r.state != NASCENT:
        raise TransitionError(f"reservation {r.id} is {r.state}; only a Nascent one asks for a ticket")
    _require_idle(r)
    return _start_or_wait(replace(r, want_end=end or r.want_end, start=start or r.start), "ticket", producers, now)


def redeem(r: Reservation, now: datetime, producers: Mapping[str, Reservation] | None = None
           ) -> tuple[Reservation, list[Message]]:
    """Redeem the ticket at the authority (after the producers this depends on are active)."""
    if r.state != TICKETED:
        raise TransitionError(f"reservation {r.id} is {r.state}; only a Ticketed one can be redeemed")
    _require_idle(r)
    return _start_or_wait(r, "redeem", producers, now)


def extend(r: Reservation, now: datetime, end: datetime | None = None) -> tuple[Reservation, list[Message]]:
    """Extend the ticket (and then, if active, the lease) to `end`."""
    if r.state not in (TICKETED, ACTIVE):
        raise TransitionError(f"reservation {r.id} is {r.state}; only Ticketed or Active ones can be extended")
    _require_idle(r)
    r = replace(r, want_end=end)
    return _send(r, EXTENDING_TICKET, now, "extendTicket", end=end)


def close(r: Reservation, now: datetime) -> tuple[Reservation, list[Message]]:
    """Close: give back the ticket and the lease. Closing wins over anything in flight; closing twice, or a
    terminal reservation, does nothing."""
    if r.terminal or r.state == CLOSE_WAIT:
        return r, []
    msgs = releases(replace(r, request=r.request + 1))
    if not msgs:
        return _idle(r, CLOSED), []
    n = r.request + 1
    r = replace(r, state=CLOSE_WAIT, pending=CLOSING, pending_since=now, deadline=now + PENDING_TIMEOUT[CLOSING],
                request=n, blocked="", awaiting=tuple(m.kind for m in msgs))
    return r, msgs


# ---- answers ----------------------------------------------------------------------------------------------------
def _gone(r: Reservation) -> bool:
    return r.terminal or r.state == CLOSE_WAIT


def on_update_ticket(r: Reservation, u: TicketUpdate, now: datetime) -> tuple[Reservation, list[Message]]:
    """Apply the broker's answer; return the new reservation and the messages to send next."""
    if _gone(r):
        return r, ([Message("relinquish", r.id, r.request)] if u.ok else [])
    if u.request < r.request or (u.ok and u.sequence and u.sequence < r.sequence):
        return r, []
    if r.pending == TICKETING:
        if not u.ok:
            return _fail(r, u.reason, now)
        return _idle(r, TICKETED, sequence=u.sequence, end=u.end or r.want_end, labels=u.labels or r.labels,
                     reason=""), []
    if r.pending == EXTENDING_TICKET:
        back = ACTIVE if r.state == ACTIVE else TICKETED
        if not u.ok:
            return _idle(r, back, reason=f"extension to {_span(r.want_end)} refused: {u.reason}"), []
        end = u.end or r.want_end
        if back == ACTIVE:
            r = replace(r, state=ACTIVE_TICKETED, sequence=u.sequence, want_end=end)
            return _send(r, EXTENDING_LEASE, now, "extendLease", end=end)
        return _idle(r, TICKETED, sequence=u.sequence, end=end, reason=""), []
    if u.ok and r.state not in HOLDS_TICKET:
        return r, [Message("relinquish", r.id, r.request)]  # a grant nobody asked for: give it back
    return r, []  # an answer to something no longer asked


def on_update_lease(r: Reservation, u: LeaseUpdate, now: datetime) -> tuple[Reservation, list[Message]]:
    """Apply the authority's answer to redeem / extendLease."""
    if _gone(r):
        return r, ([Message("close", r.id, r.request)] if u.ok else [])
    if u.request < r.request or (u.ok and u.sequence and u.sequence < r.sequence):
        return r, []
    if r.pending == REDEEMING:
        if not u.ok:
            return _fail(r, u.reason, now)
        return _idle(r, ACTIVE, sequence=max(r.sequence, u.sequence), end=u.end or r.end, reason=""), []
    if r.pending == EXTENDING_LEASE:
        if not u.ok:
            return _idle(r, ACTIVE, reason=f"lease extension to {_span(r.want_end)} refused: {u.reason}; "
                                           f"it still ends {_span(r.end)}"), []
        return _idle(r, ACTIVE, sequence=max(r.sequence, u.sequence), end=u.end or r.want_end, reason=""), []
    if u.ok and r.state not in HOLDS_LEASE:
        return r, [Message("close", r.id, r.request)]  # a lease nobody asked for: close it
    return r, []


def on_closed(r: Reservation, ack: CloseAck, now: datetime) -> tuple[Reservation, list[Message]]:
    """A relinquish or close was confirmed; the close is done when both are."""
    if r.pending != CLOSING or ack.request < r.request:
        return r, []
    left = tuple(a for a in r.awaiting if a != ack.what)
    if left:
        return replace(r, awaiting=left), []
    return _idle(r, CLOSED, awaiting=()), []


def on_failed_rpc(r: Reservation, f: FailedRpc, now: datetime) -> tuple[Reservation, list[Message]]:
    """A message could not be delivered or processed. Getting a ticket or a lease fails (giving back what
    may have been granted); an extension falls back to what is held; a close keeps waiting for its
    deadline (the edge retries)."""
    if f.request < r.request or r.terminal:
        return r, []
    if r.pending in (TICKETING, REDEEMING, PRIMING):
        return _fail(r, f.reason, now)
    if r.pending in (EXTENDING_TICKET, EXTENDING_LEASE):
        back = ACTIVE if r.state in (ACTIVE, ACTIVE_TICKETED) else TICKETED
        return _idle(r, back, reason=f"extension to {_span(r.want_end)} failed: {f.reason}"), []
    return r, []


def on_dependencies(r: Reservation, producers: Mapping[str, Reservation],
                    now: datetime) -> tuple[Reservation, list[Message]]:
    """Producers changed: start the operation waiting in Priming if they are far enough along, or fail."""
    if r.pending != PRIMING:
        return r, []
    op = r.blocked or "ticket"
    if _dependencies(r, producers, op)[0] == "waiting":
        return r, []
    return _start_or_wait(replace(r, pending=NONE, pending_since=None, deadline=None), op, producers, now)


def on_tick(r: Reservation, now: datetime) -> tuple[Reservation, list[Message]]:
    """Time passes: end a pending operation past its deadline, and close a reservation whose term ended."""
    if r.pending == NONE or r.pending_since is None:
        if r.end is not None and now >= r.end and r.state in HOLDS_TICKET:
            closed, msgs = close(r, now)
            return replace(closed, reason=f"{_name(r)}: term ended at {_span(r.end)}"), msgs
        return r, []
    limit = PENDING_TIMEOUT[r.pending]
    deadline = r.deadline or (r.pending_since + limit)
    if now <= deadline:
        return r, []
    waited = int((now - r.pending_since).total_seconds()) if r.deadline else int(limit.total_seconds())
    if r.pending == CLOSING:
        unconfirmed = " and ".join(r.awaiting) or "close"
        return _idle(r, CLOSED, reason=f"{unconfirmed} of {_name(r)} not confirmed within {waited} s; "
                                       f"the actors release it at its term end"), releases(r)
    if r.pending in (EXTENDING_TICKET, EXTENDING_LEASE):
        back = ACTIVE if r.state in (ACTIVE, ACTIVE_TICKETED) else TICKETED
        return _idle(r, back, reason=f"{ACTOR_OF[r.pending]} did not answer {r.pending} for {_name(r)} within "
                                     f"{waited} s; it still ends {_span(r.end)}"), []
    if r.pending == PRIMING:
        reason = (f"{_name(r)} waited {waited} s for {', '.join(r.depends_on)} to be ready for its "
                  f"{r.blocked or 'ticket'}; gave up")
    else:
        reason = (f"{ACTOR_OF[r.pending]} did not answer {r.pending} within {waited} s (reservation {r.id}"
                  f"{', ' + r.resource if r.resource else ''}, was {r.state})")
    return _fail(r, reason, now)


def awaiting_start(r: Reservation, now: datetime) -> bool:
    """An advance reservation (a ticket for a term that starts later) whose term has not started: it may be
    renewed or closed, not redeemed."""
    return r.state == TICKETED and r.start is not None and now < r.start


def on_term_start(r: Reservation, ok: bool, reason: str, now: datetime) -> tuple[Reservation, list[Message]]:
    """An advance reservation's term started and the broker said whether it claimed the ticket's units (ok):
    then it is an allocation like any other; if the broker lost them (someone held a unit at the start), it
    fails saying why and gives the ticket back."""
    if r.state != TICKETED or r.pending != NONE or ok:
        return r, []
    return _fail(r, f"{_name(r)}: at the start of its advance term ({_span(r.start)}) {reason}", now)


# ---- the interface the embedded slice manager uses --------------------------------------------------------------
def on_update(r: Reservation, kind: str, ok: bool, sequence: int, now: datetime,
              reason: str = "") -> tuple[Reservation, list[Message]]:
    """Apply an answer without request numbers (kind: ticket | lease | closed); an older `sequence` than
    the reservation has accepted is stale."""
    if sequence < r.sequence:
        return r, []
    if kind == "ticket":
        return on_update_ticket(r, TicketUpdate(r.request, ok, sequence, reason=reason), now)
    if kind == "lease":
        return on_update_lease(r, LeaseUpdate(r.request, ok, sequence, reason=reason), now)
    if kind == "closed" and r.pending == CLOSING:
        return _idle(r, CLOSED, sequence=sequence, awaiting=()), []
    return r, []


def apply(r: Reservation, event, now: datetime) -> tuple[Reservation, list[Message]]:
    """One entry point for every answer an edge receives."""
    if isinstance(event, TicketUpdate):
        return on_update_ticket(r, event, now)
    if isinstance(event, LeaseUpdate):
        return on_update_lease(r, event, now)
    if isinstance(event, CloseAck):
        return on_closed(r, event, now)
    if isinstance(event, FailedRpc):
        return on_failed_rpc(r, event, now)
    raise TypeError(f"not a reservation event: {event!r}")
