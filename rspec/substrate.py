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
        return _urn(self.authority, "authority", "am")

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


class _LineLoader(yaml.SafeLoader):
    """A YAML loader that remembers the line of every mapping, so mistakes are reported where they are."""

    def construct_mapping(self, node, deep=False):
        mapping = super().construct_mapping(node, deep=True)
        mapping["__line__"] = node.start_mark.line + 1
        return mapping


TOP_KEYS = {"authority", "description", "provisioning_seconds", "sites", "hosts", "switches", "vm_sizes", "images",
            "external_links", "fpga_boards"}
HOST_KEYS = {"name", "cores", "memory_mb", "hardware_type", "exclusive", "interfaces", "site", "count"}
IFACE_KEYS = {"name", "bandwidth_kbps", "switch_port"}
SWITCH_KEYS = {"name", "ports", "vlan_range", "site"}
PORT_KEYS = {"name", "bandwidth_kbps"}
SIZE_KEYS = {"name", "cores", "memory_mb", "disk_gb"}
IMAGE_KEYS = {"name", "os", "version", "description"}
EXT_KEYS = {"name", "switch", "port", "remote_aggregate", "remote_port", "vlan_range", "capacity_kbps",
            "vlan_translation", "qinq"}


def load_substrate(path: str | Path) -> Substrate:
    """Read an operator's YAML substrate file; mistakes raise SubstrateError with file, line and fix."""
    p = Path(path)
    try:
        data = yaml.load(p.read_text(), Loader=_LineLoader)  # noqa: S506 - SafeLoader subclass
    except OSError as exc:
        raise SubstrateError(f"{p}: cannot read substrate file: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark else str(p)
        raise SubstrateError(f"{where}: not valid YAML ({getattr(exc, 'problem', exc)}); fix the syntax there") from None
    return substrate_from_dict(data, str(p))


class _Reader:
    def __init__(self, source: str):
        self.source = source

    def fail(self, item: Any, message: str, fix: str) -> SubstrateError:
        line = item.get("__line__", "?") if isinstance(item, dict) else "?"
        return SubstrateError(f"{self.source}:{line}: {message}; fix: {fix}")

    def keys(self, item: Any, allowed: set[str], what: str) -> dict[str, Any]:
        if not isinstance(item, dict):
            raise SubstrateError(f"{self.source}: each {what} must be a mapping (key: value lines), got {item!r}")
        for key in item:
            if key != "__line__" and key not in allowed:
                import difflib

                close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"allowed keys are {', '.join(sorted(allowed))}"
                raise self.fail(item, f"unknown key {key!r} in {what}", hint)
        return item

    def need(self, item: dict[str, Any], key: str, what: str) -> Any:
        if key not in item or item[key] in (None, ""):
            raise self.fail(item, f"{what} has no {key!r}", f"add '{key}: ...' to it")
        return item[key]

    def number(self, item: dict[str, Any], key: str, default: int, what: str, minimum: int = 1) -> int:
        value = item.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise self.fail(item, f"{what}: {key} is {value!r}", f"give a whole number of at least {minimum}")
        return value

    def name(self, item: dict[str, Any], what: str) -> str:
        value = str(self.need(item, "name", what))
        if not value.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise self.fail(item, f"{what} name {value!r} has characters URNs cannot carry",
                            "use letters, digits, '-', '_' and '.'")
        return value

    def vlan_ranges(self, item: dict[str, Any], what: str, default: list[str]) -> tuple[tuple[int, int], ...]:
        raw = item.get("vlan_range", default)
        raw = raw if isinstance(raw, list) else [raw]
        out = []
        for r in raw:
            try:
                lo, hi = _parse_range(r)
            except ValueError:
                raise self.fail(item, f"{what}: VLAN range {r!r} is not a number or LOW-HIGH", "write e.g. 1000-1099")\
                    from None
            if not (1 <= lo <= hi <= 4094):
                raise self.fail(item, f"{what}: VLAN range {r!r} is outside 1-4094 or reversed",
                                "VLAN tags are 1-4094, low first")
            out.append((lo, hi))
        return tuple(out)


def substrate_from_dict(data: Any, source: str = "<substrate>") -> Substrate:
    r = _Reader(source)
    if not isinstance(data, dict) or "authority" not in data:
        raise SubstrateError(f"{source}:1: expected a mapping with at least 'authority:' and 'hosts:'; fix: start the "
                             f"file with 'authority: your.site.org'")
    r.keys(data, TOP_KEYS, "substrate")
    auth = str(data["authority"])
    switches: list[Switch] = []
    port_ids: set[str] = set()
    for s in data.get("switches") or []:
        r.keys(s, SWITCH_KEYS, "switch")
        name = r.name(s, "switch")
        ports = []
        for pt in s.get("ports") or []:
            r.keys(pt, PORT_KEYS, f"port of switch {name}")
            pname = r.name(pt, f"port of switch {name}")
            cid = _urn(auth, "interface", f"{name}:{pname}")
            if cid in port_ids:
                raise r.fail(pt, f"switch {name} has two ports named {pname}", "give each port its own name")
            port_ids.add(cid)
            ports.append(Port(pname, cid, r.number(pt, "bandwidth_kbps", 10_000_000, f"port {name}:{pname}")))
        switches.append(Switch(name, _urn(auth, "node", name), tuple(ports),
                               r.vlan_ranges(s, f"switch {name}", ["1000-1099"]), str(s.get("site", ""))))
    hosts: list[Host] = []
    names: set[str] = set()
    for h in data.get("hosts") or []:
        r.keys(h, HOST_KEYS, "host")
        base = r.name(h, "host")
        count = r.number(h, "count", 1, f"host {base}")
        for k in range(1, count + 1):
            name = base if count == 1 else f"{base}{k}"
            if name in names:
                raise r.fail(h, f"two hosts are named {name}", "give each host its own name")
            names.add(name)
            ifaces = []
            for i in h.get("interfaces") or []:
                r.keys(i, IFACE_KEYS, f"interface of host {base}")
                iname = r.name(i, f"interface of host {base}")
                port = None
                if i.get("switch_port"):
                    port = _urn(auth, "interface", str(i["switch_port"]).replace("{n}", str(k)))
                    if port not in port_ids:
                        raise r.fail(i, f"host {name} interface {iname} is cabled to {i['switch_port']!r}, which no "
                                        f"switch declares", "name it SWITCH:PORT as listed under switches")
                ifaces.append(Interface(iname, _urn(auth, "interface", f"{name}:{iname}"),
                                        r.number(i, "bandwidth_kbps", 10_000_000, f"interface {name}:{iname}"), port))
            exclusive = bool(h.get("exclusive", False))
            hosts.append(Host(name, _urn(auth, "node", name), r.number(h, "cores", 8, f"host {name}"),
                              r.number(h, "memory_mb", 16384, f"host {name}"),
                              str(h.get("hardware_type", "raw-pc" if exclusive else "pc")), exclusive, tuple(ifaces),
                              str(h.get("site", ""))))
    if not hosts:
        raise SubstrateError(f"{source}:{data.get('__line__', 1)}: no hosts; fix: list at least one under 'hosts:'")
    sizes = []
    for v in data.get("vm_sizes") or []:
        r.keys(v, SIZE_KEYS, "VM size")
        sizes.append(VmSize(r.name(v, "VM size"), r.number(v, "cores", 1, "VM size"),
                            r.number(v, "memory_mb", 1024, "VM size"), r.number(v, "disk_gb", 10, "VM size")))
    images = []
    for i in data.get("images") or []:
        r.keys(i, IMAGE_KEYS, "image")
        n = r.name(i, "image")
        images.append(Image(n, _urn(auth, "image", n), str(i.get("os", "Linux")), str(i.get("version", "")),
                            str(i.get("description", ""))))
    externals = []
    for e in data.get("external_links") or []:
        r.keys(e, EXT_KEYS, "external link")
        n = r.name(e, "external link")
        local = _urn(auth, "interface", f"{r.need(e, 'switch', 'external link')}:{r.need(e, 'port', 'external link')}")
        if local not in port_ids:
            raise r.fail(e, f"external link {n} leaves from {e['switch']}:{e['port']}, which no switch declares",
                         "add that port under the switch's ports")
        remote_agg = str(r.need(e, "remote_aggregate", f"external link {n}"))
        remote_port = str(r.need(e, "remote_port", f"external link {n}"))
        for value, what in ((remote_agg, "remote_aggregate"), (remote_port, "remote_port")):
            if not value.startswith("urn:publicid:IDN+"):
                raise r.fail(e, f"external link {n}: {what} {value!r} is not a GENI URN",
                             "write urn:publicid:IDN+<authority>+<type>+<name>")
        externals.append(ExternalLink(n, _urn(auth, "link", n), local, remote_agg, remote_port,
                                      r.vlan_ranges(e, f"external link {n}", ["3000-3099"]),
                                      r.number(e, "capacity_kbps", 1_000_000, f"external link {n}"),
                                      bool(e.get("vlan_translation", False)), bool(e.get("qinq", False))))
    boards = tuple({k: v for k, v in b.items() if k != "__line__"} for b in data.get("fpga_boards") or [])
    defaults = default_substrate(auth)
    return Substrate(auth, tuple(hosts), tuple(switches), tuple(sizes) or defaults.vm_sizes,
                     tuple(images) or defaults.images, tuple(externals), boards,
                     float(data.get("provisioning_seconds", 2.0)), str(data.get("description", "")))


def _parse_range(text: Any) -> tuple[int, int]:
    if isinstance(text, int):
        return (text, text)
    lo, _, hi = str(text).partition("-")
    return (int(lo), int(hi or lo))
