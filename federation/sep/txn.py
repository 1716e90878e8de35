"""The two-phase fan-out (pure): allocate at every domain, and only when all hold their part, provision at
every domain; a failure, a timeout or a crash anywhere undoes what the others took. Transitions return a new
`Txn` and the steps to run next; the edge (federation/sep/service.py) runs the steps, records the `Txn`
durably before and after each, and after a crash replays `recover` against the record.

A part's states: `pending` (sent, no answer yet), `done` (the domain answered with its slivers),
`refused` (the domain answered with an error: a domain's Allocate is itself all-or-nothing, so it holds
nothing of the part), `lost` (no answer: timeout, connection cut, or the exchange point crashed while
waiting: the domain may hold the part, or some of it), `undone` (rolled back there)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

ALLOCATE, PROVISION = "allocate", "provision"
RUNNING, COMMITTED, ROLLING_BACK, ROLLED_BACK = "running", "committed", "rolling_back", "rolled_back"
PENDING, DONE, REFUSED, LOST, UNDONE = "pending", "done", "refused", "lost", "undone"


class TxnError(ValueError):
    """A transition that does not apply to the transaction's state (a bug at the edge, never user input)."""


@dataclass(frozen=True)
class Part:
    domain: str
    client_ids: tuple[str, ...]          # the request's slivers at this domain (found again by Status if lost)
    state: str = PENDING
    slivers: tuple[str, ...] = ()         # sliver URNs the domain answered with (or, for provision, was sent)
    code: int = 0
    error: str = ""


@dataclass(frozen=True)
class Step:
    """Something the edge must do at a domain to undo a part: `delete` these sliver URNs, or `sweep`: find
    the part's slivers by client id (Status) and delete those, because the domain never answered."""

    kind: str
    domain: str
    slivers: tuple[str, ...] = ()
    client_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Txn:
    id: str
    slice_urn: str
    op: str
    parts: tuple[Part, ...]
    status: str = RUNNING
    started: str = ""
    reason: str = ""

    def part(self, domain: str) -> Part:
        for p in self.parts:
            if p.domain == domain:
                return p
        raise TxnError(f"transaction {self.id} has no part at {domain}")

    @property
    def open(self) -> bool:
        return self.status in (RUNNING, ROLLING_BACK)


def begin(txn_id: str, slice_urn: str, op: str, parts: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]],
          started: str) -> Txn:
    """A transaction over `parts`: domain -> (client ids, sliver URNs: those to provision, or () to allocate)."""
    if op not in (ALLOCATE, PROVISION):
        raise TxnError(f"unknown operation {op!r}")
    if not parts:
        raise TxnError("a transaction needs at least one domain")
    return Txn(txn_id, slice_urn, op, tuple(Part(d, tuple(c), PENDING, tuple(s)) for d, (c, s) in sorted(parts.items())),
               RUNNING, started)


def _set(txn: Txn, domain: str, **changes: Any) -> Txn:
    part = txn.part(domain)
    if txn.status != RUNNING or part.state != PENDING:
        raise TxnError(f"transaction {txn.id}: {domain} is {part.state} in a {txn.status} transaction")
    return replace(txn, parts=tuple(replace(p, **changes) if p.domain == domain else p for p in txn.parts))


def answered(txn: Txn, domain: str, slivers: tuple[str, ...]) -> Txn:
    """The domain did its part; `slivers` are the sliver URNs it answered with."""
    return _set(txn, domain, state=DONE, slivers=tuple(slivers) or txn.part(domain).slivers)


def refused(txn: Txn, domain: str, code: int, error: str) -> Txn:
    """The domain answered with a GENI error: it took nothing of this part."""
    return _set(txn, domain, state=REFUSED, code=code, error=error)


def lost(txn: Txn, domain: str, code: int, error: str) -> Txn:
    """No answer from the domain (timeout, connection cut): it may hold the part."""
    return _set(txn, domain, state=LOST, code=code, error=error)


def _undo_steps(txn: Txn) -> list[Step]:
    steps = []
    for p in txn.parts:
        if p.state == UNDONE:
            continue
        if txn.op == PROVISION:
            # all or nothing across domains: every domain's slivers go, provisioned or merely allocated
            if p.slivers:
                steps.append(Step("delete", p.domain, p.slivers))
        elif p.state == DONE:
            steps.append(Step("delete", p.domain, p.slivers))
        elif p.state in (LOST, PENDING):
            steps.append(Step("sweep", p.domain, (), p.client_ids))
    return steps


def decide(txn: Txn) -> tuple[Txn, list[Step]]:
    """Once every domain has answered (or not): commit when all did their part, else roll back and return the
    steps that undo what was taken. Raises TxnError while a part is still pending."""
    if txn.status != RUNNING:
        raise TxnError(f"transaction {txn.id} is {txn.status}, not running")
    if any(p.state == PENDING for p in txn.parts):
        raise TxnError(f"transaction {txn.id}: {', '.join(p.domain for p in txn.parts if p.state == PENDING)} "
                       f"has not answered")
    if all(p.state == DONE for p in txn.parts):
        return replace(txn, status=COMMITTED), []
    bad = [p for p in txn.parts if p.state != DONE]
    reason = "; ".join(f"{p.domain}: {'no answer: ' if p.state == LOST else ''}{p.error}" for p in bad)
    return _rolling_back(replace(txn, reason=reason))


def _rolling_back(txn: Txn) -> tuple[Txn, list[Step]]:
    steps = _undo_steps(txn)
    if not steps:
        return replace(txn, status=ROLLED_BACK, parts=tuple(
            replace(p, state=UNDONE) if p.state != REFUSED else p for p in txn.parts)), []
    return replace(txn, status=ROLLING_BACK), steps


def undone(txn: Txn, domain: str) -> tuple[Txn, list[Step]]:
    """A rollback step at `domain` succeeded; returns the transaction and the steps still to run."""
    if txn.status != ROLLING_BACK:
        raise TxnError(f"transaction {txn.id} is {txn.status}, not rolling back")
    txn = replace(txn, parts=tuple(replace(p, state=UNDONE) if p.domain == domain else p for p in txn.parts))
    steps = _undo_steps(txn)
    if not steps:
        return replace(txn, status=ROLLED_BACK), []
    return txn, steps


def recover(txn: Txn, reason: str = "the exchange point stopped before the operation finished") -> tuple[Txn, list[Step]]:
    """What to do with a transaction found in the record at start-up. A running one is rolled back whole:
    its caller never got an answer, so even parts that were done are undone (pending ones count as lost);
    a rolling-back one continues. Finished ones need nothing."""
    if txn.status == ROLLING_BACK:
        return txn, _undo_steps(txn)
    if txn.status != RUNNING:
        return txn, []
    parts = tuple(replace(p, state=LOST, error=reason) if p.state == PENDING else p for p in txn.parts)
    return _rolling_back(replace(txn, parts=parts, reason=txn.reason or reason))
