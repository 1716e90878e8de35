"""Per-slice measurement: what the Describe option `slicex_measurement` answers, built from the slivers the
caller was authorised to describe (so only the slice's members ever see it). Pure: plain data in and out.

Nodes: the container's CPU time and memory (cgroups) and the switch's counters of each interface's port;
links: the counters of the ports of their endpoints (rx: what the switch received from the node)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

MEASURED = ("cpu_ns", "memory_bytes")


def slice_measurement(slivers: Iterable[Any]) -> dict[str, Any]:
    """{"nodes": {client_id: {cpu_ns, memory_bytes, interfaces: {iface: counters}}}, "links": {client_id:
    {interfaces: {iface: counters}, rx_packets, tx_packets, rx_bytes, tx_bytes}}} of these slivers (each with
    `kind`, `client_id` and `details`, as the slice manager reports them)."""
    slivers = list(slivers)
    nodes: dict[str, Any] = {}
    ports: dict[str, Mapping[str, int]] = {}
    for s in slivers:
        if s.kind != "node":
            continue
        d = s.details
        machine = d.get("container") or {}
        counters = dict(d.get("counters") or {})
        ports.update(counters)
        nodes[s.client_id] = {**{k: int(machine[k]) for k in MEASURED if k in machine}, "interfaces": counters}
    links: dict[str, Any] = {}
    for s in slivers:
        if s.kind != "link":
            continue
        ends = {ref: dict(ports[ref]) for ref in s.details.get("interface_refs") or () if ref in ports}
        totals = {k: sum(int(c.get(k, 0)) for c in ends.values())
                  for k in ("rx_packets", "tx_packets", "rx_bytes", "tx_bytes")}
        links[s.client_id] = {"interfaces": ends, **totals}
    return {"nodes": nodes, "links": links}
