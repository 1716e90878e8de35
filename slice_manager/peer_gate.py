"""What federation peers' policies need to know of this aggregate (slicex/peers.py stays independent of
am/): the live slivers held, as the quotas count them, and the nodes a request asks for, with the sliver type
and cores the planner would give them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from resources.compute import asks_bare_metal, bare_metal_for, vm_size_for
from rspec.request import Request
from rspec.substrate import Substrate
from slice_manager import reservation as rs
from slicex.peers import Held, Wanted

ENDED = (rs.CLOSE_WAIT, rs.CLOSED, rs.FAILED)


def held_slivers(records: Callable[[], list[Any]]) -> Callable[[], list[Held]]:
    """Live slivers from the slice manager's records (ActorSliceManager.records): neither ended, failed nor
    being discarded. A staged Update's replacing link is not one more: its commit releases the one it
    replaces, its revert the replacing one."""
    def held() -> list[Held]:
        return [Held(rec.owner_urn, rec.slice_urn, rec.kind, int(rec.details.get("cores", 0) or 0))
                for rec in records() if rec.r.state not in ENDED and not rec.discard and rec.update != "replacing"]
    return held


def wanted_nodes(substrate: Substrate) -> Callable[[Request], list[Wanted]]:
    """A request's nodes as the policy sees them: the sliver type asked for ("raw-pc" for bare metal asked by
    exclusive="true", the default VM size's name when none is named) and the cores it will hold. Bare metal
    counts the named host's cores, or the smallest bare-metal host's when any may be chosen."""
    def wanted(request: Request) -> list[Wanted]:
        out = []
        for node in request.nodes:
            if asks_bare_metal(substrate, node):  # as resources/compute.py places it
                host = bare_metal_for(substrate, node)
                cores = host.cores if host is not None else 0
                out.append(Wanted(node.client_id, node.sliver_type or "raw-pc", cores))
            else:
                size = vm_size_for(substrate, node)
                out.append(Wanted(node.client_id, node.sliver_type or size.name, size.cores))
        return out
    return wanted
