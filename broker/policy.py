"""Broker allocation policies behind one small interface: the order in which candidate hosts are tried.

First-fit tries hosts in substrate order; best-fit the fullest host that still fits (packs, keeps big
holes); worst-fit the emptiest (spreads load). The embedding (am.embed.plan) asks the policy for the order."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence, Set
from dataclasses import dataclass, field
from typing import Protocol

from rspec.substrate import Host


def free_cores(host: Host, used: Set[str]) -> int:
    return sum(1 for i in range(host.cores) if f"core:{host.component_id}:{i}" not in used)


class Policy(Protocol):
    name: str

    def order(self, hosts: Sequence[Host], used: Set[str]) -> list[Host]: ...


class FirstFit:
    name = "first-fit"

    def order(self, hosts: Sequence[Host], used: Set[str]) -> list[Host]:
        return list(hosts)


class BestFit:
    name = "best-fit"

    def order(self, hosts: Sequence[Host], used: Set[str]) -> list[Host]:
        return sorted(hosts, key=lambda h: (free_cores(h, used), h.name))


class WorstFit:
    name = "worst-fit"

    def order(self, hosts: Sequence[Host], used: Set[str]) -> list[Host]:
        return sorted(hosts, key=lambda h: (-free_cores(h, used), h.name))


POLICIES: dict[str, type] = {"first-fit": FirstFit, "best-fit": BestFit, "worst-fit": WorstFit}


def policy_named(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown broker policy {name!r}; choose one of {', '.join(POLICIES)}") from None


@dataclass
class FifoQueue:
    """Requests that may wait: served strictly in arrival order when capacity frees up."""

    waiting: deque = field(default_factory=deque)

    def push(self, item) -> None:
        self.waiting.append(item)

    def serve(self, try_grant) -> list:
        """Grant from the head while `try_grant(item)` succeeds; stop at the first that cannot be served, so
        a large request is never overtaken forever by small ones."""
        granted = []
        while self.waiting and try_grant(self.waiting[0]):
            granted.append(self.waiting.popleft())
        return granted
