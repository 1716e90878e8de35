"""What federation peers' policies need to know of this aggregate (slicex/peers.py stays independent of
am/): the live slivers held, as the quotas count them, and the nodes a request asks for, with the sliver type
and cores the planner would give them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from resources.compute import asks_bare_metal, bare_metal_for, vm_size_for
from rspec.request import Request
from rspec.substrate import Substrate
from slice_manager.held import ENDED
from slicex.peers import Held, Peer, Wanted

__all__ = ["ENDED", "held_slivers", "wanted_nodes"]


def held_slivers(sm: Any) -> Callable[[Peer], list[Held]]:
    """A peer's live slivers, from the slice manager's held index (ActorSliceManager.held_in,
    slice_manager/held.py): only the slivers of the peer's namespaces are read, however many others the
    aggregate holds. A staged Update's replacing link is not one more: its commit releases the one it
    replaces, its revert the replacing one."""
    def held(peer: Peer) -> list[Held]:
        return [Held(h["owner_urn"], h["slice_urn"], h["kind"], int(h["cores"]))
                for h in sm.held_in(list(peer.namespaces), peer.covers)]
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
