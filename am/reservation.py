"""The reservation state machine (ORCA, DESIGN §2), as pure transitions.

A reservation is in one state (Nascent, Ticketed, Active, ActiveTicketed, CloseWait, Closed, Failed) and at
most one pending operation (Ticketing, Redeeming, ExtendingTicket, ExtendingLease, Closing, Priming). Every
pending operation has a deadline: `on_tick` fails a reservation stuck past it and asks for everything it holds
to be released, so nothing stays pending forever and nothing leaks. Updates carry sequence numbers; a stale
one (lower than what the reservation has seen) is dropped."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

NASCENT, TICKETED, ACTIVE, ACTIVE_TICKETED, CLOSE_WAIT, CLOSED, FAILED = (
    "Nascent", "Ticketed", "Active", "ActiveTicketed", "CloseWait", "Closed", "Failed")
NONE, TICKETING, REDEEMING, EXTENDING_TICKET, EXTENDING_LEASE, CLOSING, PRIMING = (
    "None", "Ticketing", "Redeeming", "ExtendingTicket", "ExtendingLease", "Closing", "Priming")

PENDING_TIMEOUT = {TICKETING: timedelta(seconds=30), REDEEMING: timedelta(minutes=5),
                   EXTENDING_TICKET: timedelta(seconds=30), EXTENDING_LEASE: timedelta(minutes=1),
                   CLOSING: timedelta(minutes=2), PRIMING: timedelta(minutes=5)}
"""How long each pending operation may take before the reservation is failed and released."""

ACTOR_OF = {TICKETING: "broker", EXTENDING_TICKET: "broker", REDEEMING: "authority", EXTENDING_LEASE: "authority",
            CLOSING: "authority", PRIMING: "authority"}


class TransitionError(ValueError):
    """An event that is not allowed in the reservation's current state."""


@dataclass(frozen=True)
class Reservation:
    id: str
    state: str = NASCENT
    pending: str = NONE
    pending_since: datetime | None = None
    sequence: int = 0
    reason: str = ""

    @property
    def terminal(self) -> bool:
        return self.state in (CLOSED, FAILED)


@dataclass(frozen=True)
class Message:
    """What an edge must send next: kind is ticket | redeem | extendTicket | extendLease | relinquish | close."""

    kind: str
    reservation: str


def _start(r: Reservation, pending: str, now: datetime) -> Reservation:
    if r.pending != NONE:
        raise TransitionError(f"reservation {r.id} is busy ({r.pending}); try again when it finishes")
    return replace(r, pending=pending, pending_since=now)


def _done(r: Reservation, state: str, sequence: int) -> Reservation:
    return replace(r, state=state, pending=NONE, pending_since=None, sequence=sequence)


def demand(r: Reservation, now: datetime) -> tuple[Reservation, list[Message]]:
    if r.state != NASCENT:
        raise TransitionError(f"reservation {r.id} is {r.state}; only a Nascent one asks for a ticket")
    return _start(r, TICKETING, now), [Message("ticket", r.id)]


def redeem(r: Reservation, now: datetime) -> tuple[Reservation, list[Message]]:
    if r.state != TICKETED:
        raise TransitionError(f"reservation {r.id} is {r.state}; only a Ticketed one can be redeemed")
    return _start(r, REDEEMING, now), [Message("redeem", r.id)]


def extend(r: Reservation, now: datetime) -> tuple[Reservation, list[Message]]:
    if r.state not in (TICKETED, ACTIVE):
        raise TransitionError(f"reservation {r.id} is {r.state}; only Ticketed or Active ones can be extended")
    return _start(r, EXTENDING_TICKET, now), [Message("extendTicket", r.id)]


def close(r: Reservation, now: datetime) -> tuple[Reservation, list[Message]]:
    if r.terminal:
        return r, []
    if r.pending not in (NONE,) and r.pending != CLOSING:
        # closing wins over anything in flight: release what may have been granted
        pass
    held = [Message("relinquish", r.id)]
    if r.state in (ACTIVE, ACTIVE_TICKETED) or r.pending in (REDEEMING, EXTENDING_LEASE):
        held.append(Message("close", r.id))
    return replace(r, state=CLOSE_WAIT, pending=CLOSING, pending_since=now), held


def on_update(r: Reservation, kind: str, ok: bool, sequence: int, now: datetime,
              reason: str = "") -> tuple[Reservation, list[Message]]:
    """Apply an actor's answer (kind: ticket | lease | closed). Stale answers are dropped."""
    if sequence < r.sequence:
        return r, []
    if not ok:
        failed = replace(r, state=FAILED, pending=NONE, pending_since=None, sequence=sequence, reason=reason)
        return failed, [Message("relinquish", r.id), Message("close", r.id)]
    if kind == "ticket" and r.pending == TICKETING:
        return _done(r, TICKETED, sequence), []
    if kind == "ticket" and r.pending == EXTENDING_TICKET:
        if r.state == ACTIVE:
            return replace(r, state=ACTIVE_TICKETED, pending=EXTENDING_LEASE, pending_since=now, sequence=sequence), \
                [Message("extendLease", r.id)]
        return _done(r, TICKETED, sequence), []
    if kind == "lease" and r.pending in (REDEEMING, EXTENDING_LEASE):
        return _done(r, ACTIVE, sequence), []
    if kind == "closed" and r.pending == CLOSING:
        return _done(r, CLOSED, sequence), []
    return r, []  # an answer to something no longer asked: ignore


def on_tick(r: Reservation, now: datetime) -> tuple[Reservation, list[Message]]:
    """Fail a reservation whose pending operation has outlived its deadline, releasing what it holds."""
    if r.pending == NONE or r.pending_since is None:
        return r, []
    limit = PENDING_TIMEOUT[r.pending]
    if now - r.pending_since <= limit:
        return r, []
    if r.pending == CLOSING:
        return _done(r, CLOSED, r.sequence), []  # the close is retried by the edge; the record is final
    reason = (f"{ACTOR_OF[r.pending]} did not answer {r.pending} within {int(limit.total_seconds())} s "
              f"(reservation {r.id}, was {r.state})")
    return replace(r, state=FAILED, pending=NONE, pending_since=None, reason=reason), \
        [Message("relinquish", r.id), Message("close", r.id)]
