"""Compute: VMs on shared hosts (cores and memory chunks) and bare-metal nodes (a whole host).

Units: `core:<host>:<i>` one core of a VM host, `mem:<host>:<i>` one MEM_CHUNK_MB of its memory,
`disk:<host>:<i>` one DISK_CHUNK_GB of the disk its VMs share (only on hosts whose substrate entry gives
`disk_gb`), `node:<host>` a whole bare-metal host. A demand is sized here (bare metal, or one of the substrate's VM
sizes) the same for the broker's placement, the quotas and the federation peer gate."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from typing import Any

from protocol.delegation import Pool
from resources.kind import Amounts, Constraints, Offer, Placement
from rspec.request import RequestNode
from rspec.substrate import Host, Substrate, VmSize
from slicex.errors import BadArgs, InsufficientNodes

MEM_CHUNK_MB = 512
DISK_CHUNK_GB = 10  # a VM size's disk is booked in these (rounded up)
BARE_METAL_TYPES = {"raw-pc", "raw", "bare-metal", "baremetal"}
VM_ALIASES = {"emulab-xen", "emulab-openvz", "xen-vm", "default-vm", "XOSmall", "vm", "docker-container"}


def core(host: str, i: int) -> str:
    return f"core:{host}:{i}"


def mem(host: str, i: int) -> str:
    return f"mem:{host}:{i}"


def disk(host: str, i: int) -> str:
    return f"disk:{host}:{i}"


def disk_chunks(disk_gb: int) -> int:
    return -(-disk_gb // DISK_CHUNK_GB)


def whole(host: str) -> str:
    return f"node:{host}"


# ---- sizing -------------------------------------------------------------------------------------------------------
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


def bare_metal_for(substrate: Substrate, node: RequestNode) -> Host | None:
    """The host a bare-metal node is counted as before placement: the one it names, else the smallest."""
    if node.component_id:
        return substrate.host(node.component_id)
    return min((h for h in substrate.hosts if h.exclusive), key=lambda h: (h.cores, h.memory_mb), default=None)


def _first_free(keys: Iterable[str], used: Set[str], need: int) -> list[str] | None:
    """The first `need` of `keys` not in `used` (None if fewer are free); stops as soon as it has them."""
    out: list[str] = []
    if need <= 0:
        return out
    for key in keys:
        if key not in used:
            out.append(key)
            if len(out) == need:
                return out
    return None


def host_keys(host: Host, size: VmSize, used: Set[str]) -> tuple[str, ...] | None:
    """Free core, memory and disk keys for one VM of `size` on `host`, or None if it does not fit (disk only
    where the host books it)."""
    cid = host.component_id
    cores = _first_free((core(cid, i) for i in range(host.cores)), used, size.cores)
    if cores is None:
        return None
    chunks = -(-size.memory_mb // MEM_CHUNK_MB)
    mems = _first_free((mem(cid, i) for i in range(host.memory_mb // MEM_CHUNK_MB)), used, chunks)
    if mems is None:
        return None
    disks: list[str] = []
    if host.disk_gb:
        found = _first_free((disk(cid, i) for i in range(host.disk_gb // DISK_CHUNK_GB)), used,
                            disk_chunks(size.disk_gb))
        if found is None:
            return None
        disks = found
    return tuple(cores + mems + disks)


def free_cores(host: Host, taken: Set[str]) -> int:
    return sum(1 for i in range(host.cores) if core(host.component_id, i) not in taken)


def free_disk_gb(host: Host, taken: Set[str]) -> int:
    return DISK_CHUNK_GB * sum(1 for i in range(host.disk_gb // DISK_CHUNK_GB) if disk(host.component_id, i) not in taken)


def free_mb(host: Host, taken: Set[str]) -> int:
    return MEM_CHUNK_MB * sum(1 for i in range(host.memory_mb // MEM_CHUNK_MB) if mem(host.component_id, i) not in taken)


def bind_interface(host: Host, iface: str, component_id: str | None, n: int) -> Any:
    """The host interface a node's n-th request interface goes on: the one it names, else round robin (a new
    node's interfaces, and one an Update adds to a kept node, are bound alike)."""
    if not host.interfaces:
        raise BadArgs(f"host {host.name} has no interfaces for {iface}")
    if not component_id:
        return host.interfaces[n % len(host.interfaces)]
    hi = next((i for i in host.interfaces if i.component_id.lower() == component_id.lower()), None)
    if hi is None:
        raise BadArgs(f"interface {iface}: component_id {component_id} is not an interface of {host.component_id}")
    return hi


class Compute:
    """VMs and bare-metal nodes (every node that is not another kind's)."""

    name = "compute"
    unit_kinds = ("core", "mem", "disk", "node")

    def claims(self, node: RequestNode) -> bool:
        return node.fpga is None

    def placed(self, details: Mapping[str, Any]) -> bool:
        return True  # every node no other kind placed

    def offer(self, substrate: Substrate) -> Offer:
        pools: list[Pool] = []
        for h in substrate.hosts:
            cid = h.component_id
            if h.exclusive:
                pools.append(Pool(whole(cid), "node", (whole(cid),), cid))
            else:
                pools.append(Pool(f"core:{cid}", "core", tuple(core(cid, i) for i in range(h.cores)), cid))
                pools.append(Pool(f"mem:{cid}", "mem", tuple(mem(cid, i) for i in range(h.memory_mb // MEM_CHUNK_MB)),
                                  cid))
                if h.disk_gb >= DISK_CHUNK_GB:
                    pools.append(Pool(f"disk:{cid}", "disk",
                                      tuple(disk(cid, i) for i in range(h.disk_gb // DISK_CHUNK_GB)), cid))
        return Offer(tuple(pools))

    def place(self, substrate: Substrate, node: RequestNode, taken: Set[str], given: Constraints) -> Placement:
        p = self._host_for(substrate, node, taken, given)
        host = substrate.host(p.component_id)
        assert host is not None
        ifaces = {}
        for n, ri in enumerate(node.interfaces):
            hi = bind_interface(host, ri.client_id, ri.component_id, n)
            ifaces[ri.client_id] = {"component_id": hi.component_id, "ip": ri.ip or "", "netmask": ri.netmask or ""}
        execute = {"execute": [{"shell": sh, "command": c} for sh, c in node.execute]} if node.execute else {}
        return Placement(p.client_id, "node", p.component_id, p.keys, {**p.details, "interfaces": ifaces, **execute})

    def _host_for(self, substrate: Substrate, node: RequestNode, taken: Set[str], given: Constraints) -> Placement:
        image = None
        if node.disk_image:
            img = substrate.image(node.disk_image)
            if img is None and given.image_policy == "reject":
                offered = ", ".join(i.urn for i in substrate.images)
                raise BadArgs(f"node {node.client_id}: disk image {node.disk_image} is not offered here "
                              f"(offered: {offered})")
            image = img.urn if img else node.disk_image
        bare = (node.sliver_type in BARE_METAL_TYPES) or (node.exclusive is True and node.sliver_type is None)
        if node.component_id:
            host = substrate.host(node.component_id)
            if host is None:
                raise InsufficientNodes(f"node {node.client_id}: component {node.component_id} does not exist at "
                                        f"{substrate.component_manager_id}")
            candidates = [host]
            bare = bare or host.exclusive
            if bare and not host.exclusive:
                raise BadArgs(f"node {node.client_id}: {host.name} is a shared VM host; bare metal needs one of "
                              f"{', '.join(h.name for h in substrate.hosts if h.exclusive) or 'none offered'}")
            if not bare and host.exclusive and node.sliver_type not in (None, *VM_ALIASES):
                bare = True
        else:
            candidates = [h for h in substrate.hosts if h.exclusive == bare]
        if bare:
            for h in candidates:
                if h.exclusive and whole(h.component_id) not in taken:
                    return Placement(node.client_id, "node", h.component_id, (whole(h.component_id),),
                                     {"exclusive": True, "sliver_type": "raw-pc", "disk_image": image or "",
                                      "host": h.name, "cores": h.cores, "memory_mb": h.memory_mb})
            total = sum(1 for h in substrate.hosts if h.exclusive)
            held = sum(1 for h in substrate.hosts if h.exclusive and whole(h.component_id) in taken)
            what = candidates[0].name if node.component_id else f"any of {total} bare-metal nodes"
            raise InsufficientNodes(f"node {node.client_id}: asked for bare metal on {what}; none free "
                                    f"({held} of {total} held by slivers)")
        size = vm_size_for(substrate, node)
        if given.ranking is not None:
            candidates = given.ranking.order(candidates, taken)
        for h in candidates:
            keys = host_keys(h, size, taken)
            if keys is not None:
                return Placement(node.client_id, "node", h.component_id, keys,
                                 {"exclusive": False, "sliver_type": node.sliver_type or size.name,
                                  "vm_size": size.name,
                                  "disk_image": image or (substrate.images[0].urn if substrate.images else ""),
                                  "host": h.name, "cores": size.cores, "memory_mb": size.memory_mb,
                                  "disk_gb": size.disk_gb,
                                  **({"machine": size.machine} if size.machine != "container" else {})})
        free = ", ".join(f"{h.name}: {free_cores(h, taken)} cores free"
                         + (f", {free_disk_gb(h, taken)} GB of disk" if h.disk_gb else "") for h in candidates)
        disk_part = f", {size.disk_gb} GB of disk" if any(h.disk_gb for h in candidates) else ""
        raise InsufficientNodes(f"node {node.client_id}: asked for a {size.name} VM ({size.cores} cores, "
                                f"{size.memory_mb} MB{disk_part}) on "
                                f"{'host ' + node.component_id if node.component_id else 'any host'}; "
                                f"nothing fits ({free or 'no VM hosts'})")

    def needs(self, substrate: Substrate, node: RequestNode, taken: Set[str]) -> list[dict[str, Any]]:
        """For VMs, `available` is the most one host of the site offers (a VM cannot span hosts); for bare
        metal, the free nodes of the site."""
        host = substrate.host(node.component_id) if node.component_id else None
        bare = node.sliver_type in BARE_METAL_TYPES or (node.exclusive is True and node.sliver_type is None) or \
            (host is not None and host.exclusive and node.sliver_type not in (None, *VM_ALIASES))
        candidates = [host] if host is not None else [h for h in substrate.hosts if h.exclusive == bare]
        sites = list(dict.fromkeys(h.site for h in candidates))
        if bare:
            return [{"resource": "bare-metal nodes", "site": site, "asked": 1,
                     "available": sum(1 for h in candidates if h.site == site and whole(h.component_id) not in taken)}
                    for site in sites]
        size = vm_size_for(substrate, node)
        out: list[dict[str, Any]] = []
        for site in sites:
            here = [h for h in candidates if h.site == site]
            out.append({"resource": "cores", "site": site, "asked": size.cores,
                        "available": max((free_cores(h, taken) for h in here), default=0)})
            out.append({"resource": "memory_mb", "site": site, "asked": size.memory_mb,
                        "available": max((free_mb(h, taken) for h in here), default=0)})
            if any(h.disk_gb for h in here):
                out.append({"resource": "disk_gb", "site": site, "asked": size.disk_gb,
                            "available": max((free_disk_gb(h, taken) for h in here if h.disk_gb), default=0)})
        return out

    def asked(self, substrate: Substrate, node: RequestNode) -> Amounts:
        """VMs by their size, bare metal by the host named or else the smallest bare-metal host."""
        if asks_bare_metal(substrate, node):
            pick = bare_metal_for(substrate, node)
            return Amounts(cores=pick.cores if pick else 0, memory_mb=pick.memory_mb if pick else 0, nodes=1)
        size = vm_size_for(substrate, node)
        return Amounts(cores=size.cores, memory_mb=size.memory_mb, nodes=1, disk_gb=size.disk_gb)

    def held(self, details: Mapping[str, Any]) -> Amounts:
        """Its cores, memory and disk (a bare-metal node the whole host's cores and memory)."""
        return Amounts(cores=int(details.get("cores") or 0), memory_mb=int(details.get("memory_mb") or 0), nodes=1,
                       disk_gb=int(details.get("disk_gb") or 0))

    def bin_of(self, key: str) -> str:
        kind, _, rest = key.partition(":")
        return rest if kind == "node" else rest.rsplit(":", 1)[0]
