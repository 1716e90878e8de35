"""What the slice manager and the substrate drivers keep of placement: interface MAC addresses.

Placement itself is the broker's policy (broker/placement.py): the slice manager sends demands and the broker
chooses hosts, units and labels from its own calendar. Unit naming and sizes are in slicex/inventory.py. The
names below are re-exported so planner tests and benchmarks that call the policy directly keep one import."""

from __future__ import annotations

import hashlib

from broker.placement import (  # noqa: F401 - re-exported
    BARE_METAL_TYPES,
    SHORT,
    VM_ALIASES,
    Placement,
    Shortfall,
    host_keys,
    place_fpga,
    plan,
    vm_size_for,
)
from slicex.inventory import (  # noqa: F401 - re-exported
    BW_CHUNK_KBPS,
    MEM_CHUNK_MB,
    SOFTWARE_PLANES_PER_BOARD,
    keys_under,
    usage_counts,
)


def mac_for(sliver_urn: str, iface: str) -> str:
    """A stable locally administered MAC for an interface of a sliver (manifest and drivers agree on it)."""
    digest = hashlib.sha256(f"{sliver_urn}/{iface}".encode()).digest()
    return "02:" + ":".join(f"{b:02x}" for b in digest[:5])
