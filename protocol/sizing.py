"""How a demanded node is sized, the same for the broker's placement, the slice manager's peer gate and the
quotas: bare metal (a whole host) or a VM of one of the substrate's sizes."""

from __future__ import annotations

from rspec.request import RequestNode
from rspec.substrate import Substrate, VmSize
from slicex.errors import BadArgs

BARE_METAL_TYPES = {"raw-pc", "raw", "bare-metal", "baremetal"}
VM_ALIASES = {"emulab-xen", "emulab-openvz", "xen-vm", "default-vm", "XOSmall", "vm", "docker-container"}


def asks_bare_metal(substrate: Substrate, node: RequestNode) -> bool:
    """A node that takes a whole host: a bare-metal type, exclusive without a type, or bound to an exclusive
    host."""
    host = substrate.host(node.component_id) if node.component_id else None
    return (node.sliver_type in BARE_METAL_TYPES or (node.exclusive is True and node.sliver_type is None)
            or (host is not None and host.exclusive))


def vm_size_for(substrate: Substrate, node: RequestNode) -> VmSize:
    """The VM size a node asks for (the substrate's default for the generic VM types); BADARGS for a type
    this substrate does not offer."""
    if node.sliver_type is None or node.sliver_type in VM_ALIASES:
        return substrate.default_vm_size
    size = substrate.vm_size(node.sliver_type)
    if size is None:
        offered = ", ".join([s.name for s in substrate.vm_sizes] + sorted(BARE_METAL_TYPES)[:1])
        raise BadArgs(f"node {node.client_id}: sliver type {node.sliver_type!r} is not offered here "
                      f"(offered: {offered})")
    return size
