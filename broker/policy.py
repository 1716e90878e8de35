"""Broker allocation policies behind one small interface, and label (VLAN tag) choice.

A policy ranks *bins* (hosts), best first: first-fit keeps inventory order, best-fit takes the bin left
fullest (packs, keeps big holes for big requests), worst-fit the bin left emptiest (spreads load). The
ranking orders hosts for the embedding planner (`order`, used by broker.placement.plan), which takes the
first that fits. Pure: the caller says what is free."""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Protocol

from resources.compute import core, free_cores
from rspec.substrate import Host
from slicex.store import counter_of


@dataclass(frozen=True)
class BinView:
    """One bin as a policy sees it: free and total units per resource type over the asked term."""

    name: str
    free: Mapping[str, int]
    total: Mapping[str, int]
    index: int = 0  # position in inventory order (first-fit)

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

    def order(self, hosts: Sequence[Host], used: Set[str]) -> Sequence[Host]:
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


def _free_of(host: Host, used: Set[str]) -> int:
    """A host's free cores: from the broker's counters when `used` keeps them (broker/placement.py `Taken`),
    else counted unit by unit."""
    free_in = getattr(used, "free_in", None)
    free = free_in(counter_of(core(host.component_id, 0)), host.cores) if free_in is not None else None
    return free_cores(host, used) if free is None else free


class _Ordered(Sequence[Host]):
    """Hosts in a policy's order, produced as the planner walks them: it stops at the first that fits, so
    only the hosts it tries are weighed. First-fit walks inventory order, trying last the hosts the counters
    say are full (they cannot fit; the planner's refusal still names them), starting after the leading hosts the
broker's claim copy knows full (`leading_full`, broker/claims.py); the other policies pop a heap of
    (policy key, host) built from the counters. Walked again (a refusal lists every host), it answers the
    same order."""

    def __init__(self, policy: Policy, hosts: Sequence[Host], used: Set[str]):
        self.policy, self.hosts, self.used = policy, hosts, used
        self._walked: list[Host] | None = None

    def _walk(self) -> Iterator[Host]:
        if isinstance(self.policy, FirstFit):
            # the leading hosts whose cores the claims fill (the broker's copy keeps the run): full, not weighed
            leading_full = getattr(self.used, "leading_full", None)
            leading = leading_full(self.hosts) if leading_full is not None else None
            start = leading.n if leading is not None else 0
            full: list[Host] = list(self.hosts[:start])
            for i in range(start, len(self.hosts)):
                h = self.hosts[i]
                if _free_of(h, self.used) <= 0:
                    full.append(h)
                    if leading is not None:
                        leading.passed(i)
                else:
                    yield h
            yield from full
            return
        heap = [(self.policy.key(BinView(h.component_id, {"core": _free_of(h, self.used)}, {"core": h.cores}, i),
                                 {"core": 0}), i) for i, h in enumerate(self.hosts)]
        heapq.heapify(heap)
        while heap:
            yield self.hosts[heapq.heappop(heap)[1]]

    def __iter__(self) -> Iterator[Host]:
        if self._walked is not None:
            yield from self._walked
            return
        walked: list[Host] = []
        for h in self._walk():
            walked.append(h)
            yield h
        self._walked = walked

    def __len__(self) -> int:
        return len(self.hosts)

    def __getitem__(self, i):  # type: ignore[override]
        return list(self)[i]


def order(policy: Policy, hosts: Sequence[Host], used: Set[str]) -> Sequence[Host]:
    """Hosts in the order the planner should try them (all of them, fitting or not) under `policy`."""
    return _Ordered(policy, hosts, used)


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
