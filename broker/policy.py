"""Broker allocation policies behind one small interface, and label (VLAN tag) choice.

A policy ranks *bins* (hosts), best first: first-fit keeps inventory order, best-fit takes the bin left
fullest (packs, keeps big holes for big requests), worst-fit the bin left emptiest (spreads load). The
ranking orders hosts for the embedding planner (`order`, used by broker.placement.plan), which takes the
first that fits. Pure: the caller says what is free."""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Protocol

from resources.compute import free_cores
from rspec.substrate import Host


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
