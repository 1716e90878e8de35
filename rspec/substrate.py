"""The operator's substrate: what an aggregate offers (sites, hosts, VM sizes, images, bare-metal nodes,
switches and VLAN ranges, links to other aggregates, FPGA boards).

Operators write it as YAML (docs/operator-guide.md); `load_substrate` reads it into these frozen
dataclasses, and `rspec.ndl` turns it into an NDL-OWL graph. Component ids follow GENI URN conventions:
node `urn:publicid:IDN+<auth>+node+<name>`, interface `...+interface+<node>:<iface>`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class SubstrateError(ValueError):
    """A mistake in a substrate file, with where it is and how to fix it."""


def _urn(authority: str, kind: str, name: str) -> str:
    return f"urn:publicid:IDN+{authority}+{kind}+{name}"


@dataclass(frozen=True)
class VmSize:
    name: str
    cores: int
    memory_mb: int
    disk_gb: int = 10


@dataclass(frozen=True)
class Image:
    name: str
    urn: str
    os: str = "Linux"
    version: str = ""
    description: str = ""


@dataclass(frozen=True)
class Interface:
    name: str
    component_id: str
    bandwidth_kbps: int = 1_000_000
    switch_port: str | None = None  # component id of the switch port it is cabled to


@dataclass(frozen=True)
class Host:
    """A VM host (shared, exclusive=false) or a bare-metal node (exclusive=true)."""

    name: str
    component_id: str
    cores: int
    memory_mb: int
    hardware_type: str = "pc"
    exclusive: bool = False
    interfaces: tuple[Interface, ...] = ()
    site: str = ""


@dataclass(frozen=True)
class Port:
    name: str
    component_id: str
    bandwidth_kbps: int = 10_000_000


@dataclass(frozen=True)
class Switch:
    name: str
    component_id: str
    ports: tuple[Port, ...] = ()
    vlan_range: tuple[tuple[int, int], ...] = ((1000, 1099),)
    site: str = ""


@dataclass(frozen=True)
class ExternalLink:
    """A port that leads to another aggregate or a transit network (stitching)."""

    name: str
    component_id: str
    local_port: str
    remote_aggregate: str
    remote_port: str
    vlan_range: tuple[tuple[int, int], ...]
    capacity_kbps: int = 1_000_000
    vlan_translation: bool = False
    qinq: bool = False


@dataclass(frozen=True)
class Substrate:
    authority: str
    hosts: tuple[Host, ...]
    switches: tuple[Switch, ...] = ()
    vm_sizes: tuple[VmSize, ...] = ()
    images: tuple[Image, ...] = ()
    external_links: tuple[ExternalLink, ...] = ()
    fpga_boards: tuple[dict[str, Any], ...] = ()
    provisioning_seconds: float = 2.0
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def component_manager_id(self) -> str:
        return _urn(self.authority, "authority", "cm")

    def host(self, component_id_or_name: str) -> Host | None:
        for h in self.hosts:
            if h.component_id.lower() == component_id_or_name.lower() or h.name == component_id_or_name:
                return h
        return None

    def vm_size(self, name: str) -> VmSize | None:
        return next((s for s in self.vm_sizes if s.name == name), None)

    def image(self, name_or_urn: str) -> Image | None:
        return next((i for i in self.images if name_or_urn in (i.name, i.urn)), None)

    @property
    def default_vm_size(self) -> VmSize:
        return self.vm_sizes[0]


def default_substrate(authority: str = "slicex.local") -> Substrate:
    """The demo's emulated rack: 3 VM hosts, 2 bare-metal nodes, one switch with VLANs 1000–1099."""
    switch_id = _urn(authority, "node", "sw1")
    hosts = []
    for i in range(1, 4):
        name = f"pc{i}"
        hosts.append(Host(name, _urn(authority, "node", name), cores=16, memory_mb=65536, hardware_type="pc",
                          exclusive=False,
                          interfaces=tuple(Interface(f"eth{j}", _urn(authority, "interface", f"{name}:eth{j}"),
                                                     10_000_000, _urn(authority, "interface", f"sw1:{name}-eth{j}"))
                                           for j in range(2)),
                          site="rack1"))
    for i in range(1, 3):
        name = f"bm{i}"
        hosts.append(Host(name, _urn(authority, "node", name), cores=8, memory_mb=32768, hardware_type="raw-pc",
                          exclusive=True,
                          interfaces=(Interface("eth0", _urn(authority, "interface", f"{name}:eth0"), 10_000_000,
                                                _urn(authority, "interface", f"sw1:{name}-eth0")),),
                          site="rack1"))
    ports = tuple(Port(iface.switch_port.split("+")[-1].split(":", 1)[1], iface.switch_port)
                  for h in hosts for iface in h.interfaces if iface.switch_port)
    return Substrate(
        authority=authority,
        hosts=tuple(hosts),
        switches=(Switch("sw1", switch_id, ports, ((1000, 1099),), "rack1"),),
        vm_sizes=(VmSize("default-vm", 1, 1024, 10), VmSize("m1.small", 1, 2048, 20),
                  VmSize("m1.medium", 2, 4096, 40), VmSize("m1.large", 4, 8192, 80)),
        images=(Image("ubuntu-22.04", _urn(authority, "image", "ubuntu-22.04"), "Linux", "22.04", "Ubuntu 22.04 LTS"),
                Image("debian-12", _urn(authority, "image", "debian-12"), "Linux", "12", "Debian 12")),
        description="emulated rack (slicex demo substrate)",
    )


def load_substrate(path: str | Path) -> Substrate:
    """Read an operator's YAML substrate file."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SubstrateError(f"{p}: cannot read substrate file: {exc}") from None
    return substrate_from_dict(data, str(p))


def substrate_from_dict(data: Any, source: str = "<substrate>") -> Substrate:
    if not isinstance(data, dict) or "authority" not in data:
        raise SubstrateError(f"{source}: expected a mapping with at least 'authority:' and 'hosts:'")
    auth = str(data["authority"])
    hosts = []
    for h in data.get("hosts", []):
        name = h["name"]
        ifaces = tuple(Interface(i["name"], _urn(auth, "interface", f"{name}:{i['name']}"),
                                 int(i.get("bandwidth_kbps", 10_000_000)),
                                 _urn(auth, "interface", i["switch_port"]) if i.get("switch_port") else None)
                       for i in h.get("interfaces", []))
        hosts.append(Host(name, _urn(auth, "node", name), int(h.get("cores", 8)), int(h.get("memory_mb", 16384)),
                          h.get("hardware_type", "raw-pc" if h.get("exclusive") else "pc"),
                          bool(h.get("exclusive", False)), ifaces, h.get("site", "")))
    switches = []
    for s in data.get("switches", []):
        ports = tuple(Port(pt["name"], _urn(auth, "interface", f"{s['name']}:{pt['name']}"),
                           int(pt.get("bandwidth_kbps", 10_000_000))) for pt in s.get("ports", []))
        switches.append(Switch(s["name"], _urn(auth, "node", s["name"]), ports,
                               tuple(_parse_range(r) for r in s.get("vlan_range", ["1000-1099"])), s.get("site", "")))
    sizes = tuple(VmSize(v["name"], int(v["cores"]), int(v["memory_mb"]), int(v.get("disk_gb", 10)))
                  for v in data.get("vm_sizes", [])) or default_substrate(auth).vm_sizes
    images = tuple(Image(i["name"], _urn(auth, "image", i["name"]), i.get("os", "Linux"), str(i.get("version", "")),
                         i.get("description", "")) for i in data.get("images", [])) or default_substrate(auth).images
    return Substrate(auth, tuple(hosts), tuple(switches), sizes, images, (),
                     tuple(data.get("fpga_boards", [])), float(data.get("provisioning_seconds", 2.0)),
                     str(data.get("description", "")))


def _parse_range(text: Any) -> tuple[int, int]:
    if isinstance(text, int):
        return (text, text)
    lo, _, hi = str(text).partition("-")
    return (int(lo), int(hi or lo))
