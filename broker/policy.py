"""Broker allocation policies behind one small interface, label (VLAN tag) choice, and the FIFO queue.

A policy ranks *bins* (hosts, boards) that can hold a demand, best first: first-fit keeps inventory order,
best-fit takes the bin left fullest (packs, keeps big holes for big requests), worst-fit the bin left
emptiest (spreads load). The same ranking orders hosts for the embedding planner (`order`, used by
broker.placement.plan). Pure: the caller says what is free."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from rspec.substrate import Host


@dataclass(frozen=True)
class BinView:
    """One bin as a policy sees it: free and total units per resource type over the asked term."""

    name: str
    free: Mapping[str, int]
    total: Mapping[str, int]
    index: int = 0  # position in inventory order (first-fit)

    def fits(self, demand: Mapping[str, int]) -> bool:
        return all(self.free.get(t, 0) >= n for t, n in demand.items())

    def leftover(self, demand: Mapping[str, int]) -> float:
        """Fraction of the bin still free after placing `demand`, averaged over the demanded types."""
        types = list(demand) or list(self.total)
        if not types:
            return 0.0
        return sum((self.free.get(t, 0) - demand.get(t, 0)) / max(1, self.total.get(t, 1)) for t in types) / len(types)


class Policy(Protocol):
    name: str

    def key(self, b: BinView, demand: Mapping[str, int]) -> tuple: ...


class _Ranking:
    name = ""

    def key(self, b: BinView, demand: Mapping[str, int]) -> tuple:
        raise NotImplementedError

    def order(self, hosts: Sequence[Host], used: Set[str]) -> list[Host]:
        """The planner's entry point (broker.placement.plan): every host, in the order to try them."""
        return order(self, hosts, used)


class FirstFit(_Ranking):
    name = "first-fit"

    def key(self, b: BinView, demand: Mapping[str, int]) -> tuple:
        return (b.index,)


class BestFit(_Ranking):
    name = "best-fit"

    def key(self, b: BinView, demand: Mapping[str, int]) -> tuple:
        return (b.leftover(demand), b.index)


class WorstFit(_Ranking):
    name = "worst-fit"

    def key(self, b: BinView, demand: Mapping[str, int]) -> tuple:
        return (-b.leftover(demand), b.index)


def rank(policy: Policy, bins: Sequence[BinView], demand: Mapping[str, int]) -> list[BinView]:
    """The bins that can hold `demand`, best first under `policy`."""
    return sorted((b for b in bins if b.fits(demand)), key=lambda b: policy.key(b, demand))


def free_cores(host: Host, used: Set[str]) -> int:
    return sum(1 for i in range(host.cores) if f"core:{host.component_id}:{i}" not in used)


def order(policy: Policy, hosts: Sequence[Host], used: Set[str]) -> list[Host]:
    """Hosts in the order the planner should try them (all of them, fitting or not) under `policy`."""
    views = [BinView(h.component_id, {"core": free_cores(h, used)}, {"core": h.cores}, i) for i, h in enumerate(hosts)]
    ranked = sorted(views, key=lambda b: policy.key(b, {"core": 0}))
    return [hosts[b.index] for b in ranked]


POLICIES: dict[str, type] = {"first-fit": FirstFit, "best-fit": BestFit, "worst-fit": WorstFit}


def policy_named(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown broker policy {name!r}; choose one of {', '.join(POLICIES)}") from None


# ---- labels ----------------------------------------------------------------------------------------------------
def choose_label(free: Sequence[int], suggested: int | None = None, avoid: Set[int] = frozenset()) -> int | None:
    """A label (VLAN tag) from the free ones: the suggested one if it is free, else the lowest free one not
    in `avoid` (tags a peer already refused); None when nothing is free."""
    ok = [v for v in free if v not in avoid]
    if suggested is not None:
        return suggested if suggested in ok else None
    return min(ok) if ok else None


# ---- the FIFO queue --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Waiting:
    id: str
    request: Any
    deadline: datetime


@dataclass
class FifoQueue:
    """Requests that may wait: served strictly in arrival order when capacity frees up; each waits at most
    until its deadline."""

    waiting: deque = field(default_factory=deque)

    def push(self, item, deadline: datetime | None = None, id: str = "") -> None:
        self.waiting.append(item if deadline is None else Waiting(id, item, deadline))

    def serve(self, try_grant: Callable[[Any], bool]) -> list:
        """Grant from the head while `try_grant(item)` succeeds; stop at the first that cannot be served, so
        a large request is never overtaken forever by small ones."""
        granted = []
        while self.waiting and try_grant(self.waiting[0]):
            granted.append(self.waiting.popleft())
        return granted

    def expire(self, now: datetime) -> list[Waiting]:
        """Remove and return the requests whose deadline has passed (they fail, with their place in line)."""
        gone = [w for w in self.waiting if isinstance(w, Waiting) and w.deadline <= now]
        for w in gone:
            self.waiting.remove(w)
        return gone

    def position(self, id: str) -> int | None:
        return next((i for i, w in enumerate(self.waiting) if isinstance(w, Waiting) and w.id == id), None)

    def __len__(self) -> int:
        return len(self.waiting)
