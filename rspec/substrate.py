"""The operator's substrate: what an aggregate offers (sites, hosts, VM sizes, images, bare-metal nodes,
switches, trunks and VLAN ranges, static and shared VLANs, links to other aggregates, FPGA boards).

Operators write it as YAML (docs/operator-guide.md); `load_substrate` reads it into these frozen
dataclasses and reports every mistake with file, line and the fix; `rspec.ndl` turns it into an NDL-OWL
graph and back. Component ids follow GENI URN conventions: node `urn:publicid:IDN+<auth>+node+<name>`,
interface `...+interface+<node>:<iface>`, link `...+link+<name>`."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml


class SubstrateError(ValueError):
    """A mistake in a substrate file, with where it is and how to fix it."""


def _urn(authority: str, kind: str, name: str) -> str:
    return f"urn:publicid:IDN+{authority}+{kind}+{name}"


def urn_name(urn: str) -> str:
    """The last field of a GENI URN (`...+interface+tor-a:uplink` -> `tor-a:uplink`)."""
    return urn.rsplit("+", 1)[-1]


@dataclass(frozen=True)
class Site:
    """A place (rack, machine room). Nodes in it share a location in the advertisement."""

    name: str
    description: str = ""
    country: str = ""
    latitude: float | None = None
    longitude: float | None = None


@dataclass(frozen=True)
class VmSize:
    name: str
    cores: int
    memory_mb: int
    disk_gb: int = 10
    machine: str = "container"  # what a node of this size is on the netns substrate: a container, or "qemu" (a VM)


QEMU_VM = VmSize("qemu-vm", 1, 512, 10, "qemu")  # the netns substrate's VM type where the substrate file has none


@dataclass(frozen=True)
class Image:
    name: str
    urn: str
    os: str = "Linux"
    version: str = ""
    description: str = ""
    url: str = ""


@dataclass(frozen=True)
class Interface:
    name: str
    component_id: str
    bandwidth_kbps: int = 1_000_000
    switch_port: str | None = None  # component id of the switch port it is cabled to
    role: str = "experimental"       # or "control": not offered for slice links


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
    disk_gb: int = 0  # what its VMs' disks may take together (0: disk is not booked on this host)


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
class Trunk:
    """A cable between two switch ports of this aggregate (e.g. rack A's and rack B's top-of-rack switches)."""

    name: str
    component_id: str
    port_a: str  # component ids of the two switch ports
    port_b: str
    bandwidth_kbps: int = 10_000_000
    vlan_range: tuple[tuple[int, int], ...] = ()  # tags its wire carries (empty: those either switch hands out)
    translation: tuple[str, ...] = ()  # its ports (component ids) whose switch may change a link's tag there
    qinq: tuple[str, ...] = ()  # its ports that can push/pop an 802.1ad S-tag toward the other end
    s_vlan_range: tuple[tuple[int, int], ...] = ()  # S-tags its Q-in-Q ports push (empty: its wire's tags)


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
    remote_aggregate_url: str = ""
    mtu: int = 9000
    min_capacity_kbps: int = 1
    granularity_kbps: int = 1
    te_metric: int = 10
    s_vlan_range: tuple[tuple[int, int], ...] = ()  # S-tags a Q-in-Q port pushes (empty: its vlan_range)

    @property
    def switch_id(self) -> str:
        """Component id of the switch the port belongs to (`...+interface+tor-a:uplink` -> `...+node+tor-a`)."""
        prefix, _, name = self.local_port.rpartition("+")
        return prefix.rsplit("+", 1)[0] + "+node+" + name.split(":", 1)[0]

    @property
    def stitch_port_id(self) -> str:
        """The port's id in the stitching extension (`...+stitchport+tor-a:uplink`, as InstaGENI racks write it)."""
        prefix, _, name = self.local_port.rpartition("+")
        return prefix.rsplit("+", 1)[0] + "+stitchport+" + name


@dataclass(frozen=True)
class StaticVlan:
    """A VLAN configured on a switch outside slicex's allocator. Shared ones are offered by name (shared-VLAN
    extension) for slices to join; the others (management, pre-provisioned circuits) are only reserved."""

    name: str
    tag: int
    switch: str  # component id
    shared: bool = False
    description: str = ""


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
    sites: tuple[Site, ...] = ()
    trunks: tuple[Trunk, ...] = ()
    static_vlans: tuple[StaticVlan, ...] = ()
    am_url: str = ""
    # the gateway's TCP ports the broker hands out as nodes' public ports (resources/public_port.py); none: no
    # public access is offered
    public_ports: tuple[tuple[int, int], ...] = ()

    @property
    def component_manager_id(self) -> str:
        return _urn(self.authority, "authority", "am")

    def host(self, component_id_or_name: str) -> Host | None:
        """The first host whose component id (any case) or name is this: two dictionary look-ups, not a walk
        of every host (a placement asks it for the host it chose: issue 33, first-fit's host moves further in as
        slices fill the hosts before it)."""
        by_id, by_name = self._host_index
        found = [i for i in (by_id.get(component_id_or_name.lower()), by_name.get(component_id_or_name))
                 if i is not None]
        return self.hosts[min(found)] if found else None

    @cached_property
    def _host_index(self) -> tuple[dict[str, int], dict[str, int]]:
        """Lower-cased component id → position of the first host with it, and name → the same (built once per
        substrate, which is immutable)."""
        by_id: dict[str, int] = {}
        by_name: dict[str, int] = {}
        for i, h in enumerate(self.hosts):
            by_id.setdefault(h.component_id.lower(), i)
            by_name.setdefault(h.name, i)
        return by_id, by_name

    def switch(self, component_id_or_name: str) -> Switch | None:
        return next((s for s in self.switches
                     if s.component_id.lower() == component_id_or_name.lower() or s.name == component_id_or_name),
                    None)

    def site(self, name: str) -> Site | None:
        return next((s for s in self.sites if s.name == name), None)

    def external_link(self, component_id_or_name: str) -> ExternalLink | None:
        return next((e for e in self.external_links if component_id_or_name in (e.component_id, e.name)), None)

    def vm_size(self, name: str) -> VmSize | None:
        return next((s for s in self.vm_sizes if s.name == name), None)

    def image(self, name_or_urn: str) -> Image | None:
        return next((i for i in self.images if name_or_urn in (i.name, i.urn)), None)

    @property
    def default_vm_size(self) -> VmSize:
        return self.vm_sizes[0]

    @property
    def all_sites(self) -> tuple[Site, ...]:
        """Declared sites, then any site a host or switch names without declaring it."""
        declared = {s.name for s in self.sites}
        extra = dict.fromkeys(x.site for x in (*self.hosts, *self.switches) if x.site and x.site not in declared)
        return self.sites + tuple(Site(name) for name in extra)

    @property
    def shared_vlans(self) -> tuple[StaticVlan, ...]:
        return tuple(v for v in self.static_vlans if v.shared)

    def fpga_board_id(self, board: dict[str, Any]) -> str:
        return _urn(self.authority, "node", str(board.get("name")))


def default_substrate(authority: str = "slicex.local") -> Substrate:
    """The demo's emulated rack: 3 VM hosts, 2 bare-metal nodes, one switch with VLANs 1000–1099."""
    switch_id = _urn(authority, "node", "sw1")
    hosts = []
    for i in range(1, 4):
        name = f"pc{i}"
        hosts.append(Host(name, _urn(authority, "node", name), cores=16, memory_mb=65536, hardware_type="pc",
                          exclusive=False, disk_gb=1000,
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
        sites=(Site("rack1", "the emulated rack"),),
    )


# ---- reading the operator's file ------------------------------------------------------------------------------

class _LineLoader(yaml.SafeLoader):
    """A YAML loader that remembers the line of every mapping, so mistakes are reported where they are."""

    def construct_mapping(self, node, deep=False):
        mapping = super().construct_mapping(node, deep=True)
        mapping["__line__"] = node.start_mark.line + 1
        return mapping


TOP_KEYS = {"authority", "description", "provisioning_seconds", "am_url", "sites", "hosts", "switches", "trunks",
            "vm_sizes", "images", "external_links", "static_vlans", "fpga_boards", "public_ports"}
SITE_KEYS = {"name", "description", "country", "latitude", "longitude"}
HOST_KEYS = {"name", "cores", "memory_mb", "disk_gb", "hardware_type", "exclusive", "interfaces", "site", "count"}
IFACE_KEYS = {"name", "bandwidth_kbps", "switch_port", "role"}
SWITCH_KEYS = {"name", "ports", "vlan_range", "site"}
PORT_KEYS = {"name", "bandwidth_kbps"}
TRUNK_KEYS = {"name", "between", "bandwidth_kbps", "vlan_range", "vlan_translation", "qinq", "s_vlan_range"}
SIZE_KEYS = {"name", "cores", "memory_mb", "disk_gb", "machine"}
MACHINES = ("container", "qemu")
IMAGE_KEYS = {"name", "urn", "os", "version", "description", "url"}
EXT_KEYS = {"name", "switch", "port", "remote_aggregate", "remote_aggregate_url", "remote_port", "vlan_range",
            "capacity_kbps", "min_capacity_kbps", "granularity_kbps", "mtu", "te_metric", "vlan_translation", "qinq",
            "s_vlan_range"}
STATIC_KEYS = {"name", "tag", "switch", "shared", "description"}
ROLES = ("experimental", "control")


def load_substrate(path: str | Path) -> Substrate:
    """Read an operator's substrate file (YAML; or NDL-OWL Turtle/RDF-XML written by `slicex substrate ndl`);
    mistakes raise SubstrateError with file, line and fix."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SubstrateError(f"{p}: cannot read substrate file: {exc.strerror or exc}; fix: check the path") from None
    if p.suffix.lower() in (".ttl", ".rdf", ".owl", ".n3", ".nt"):
        from rspec.ndl import load_graph, substrate_from_graph

        return substrate_from_graph(load_graph(text, str(p)), str(p))
    try:
        data = yaml.load(text, Loader=_LineLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark else str(p)
        raise SubstrateError(f"{where}: not valid YAML ({getattr(exc, 'problem', exc)}); fix: correct the syntax "
                             f"there (indentation, a missing ':' or an unclosed bracket)") from None
    return substrate_from_dict(data, str(p))


def _strip_lines(value: Any) -> Any:
    """The document without the loader's line marks (FPGA boards are passed on as plain data)."""
    if isinstance(value, dict):
        return {k: _strip_lines(v) for k, v in value.items() if k != "__line__"}
    if isinstance(value, list):
        return [_strip_lines(v) for v in value]
    return value


class _Reader:
    """Checks one substrate document, remembering the source name for messages."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, item: Any, message: str, fix: str) -> SubstrateError:
        line = item.get("__line__", "?") if isinstance(item, dict) else "?"
        return SubstrateError(f"{self.source}:{line}: {message}; fix: {fix}")

    def items(self, parent: dict[str, Any], key: str, what: str) -> list[dict[str, Any]]:
        """The list under `key`, each entry a mapping."""
        raw = parent.get(key)
        if raw is None:
            return []
        if not isinstance(raw, list):
            raise self.fail(parent, f"'{key}' must be a list of {what}s", f"write each {what} on a line starting "
                                                                           f"with '- '")
        for entry in raw:
            if not isinstance(entry, dict):
                raise self.fail(parent, f"an entry under '{key}' is {entry!r}, not a {what}",
                                f"write each {what} as key: value pairs, e.g. '- name: ...'")
        return raw

    def keys(self, item: dict[str, Any], allowed: set[str], what: str) -> dict[str, Any]:
        for key in item:
            if key != "__line__" and key not in allowed:
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

    def real(self, item: dict[str, Any], key: str, what: str, low: float, high: float) -> float | None:
        value = item.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise self.fail(item, f"{what}: {key} is {value!r}", f"give a number from {low} to {high}")
        return float(value)

    def flag(self, item: dict[str, Any], key: str, what: str, default: bool = False) -> bool:
        value = item.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(item, f"{what}: {key} is {value!r}", "write true or false")
        return value

    def text(self, item: dict[str, Any], key: str, default: str = "") -> str:
        value = item.get(key, default)
        if isinstance(value, (dict, list)):
            raise self.fail(item, f"{key} is a {type(value).__name__}", f"give {key} as plain text")
        return "" if value is None else str(value)

    def name(self, item: dict[str, Any], what: str, key: str = "name") -> str:
        value = str(self.need(item, key, what))
        if not value.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise self.fail(item, f"{what} {key} {value!r} has characters URNs cannot carry",
                            "use letters, digits, '-', '_' and '.'")
        return value

    def urn(self, item: dict[str, Any], key: str, what: str) -> str:
        value = str(self.need(item, key, what))
        parts = value.split("+")
        if not value.startswith("urn:publicid:IDN+") or len(parts) < 4 or not all(parts[1:]):
            raise self.fail(item, f"{what}: {key} {value!r} is not a GENI URN",
                            "write urn:publicid:IDN+<authority>+<type>+<name>")
        return value

    def vlan_ranges(self, item: dict[str, Any], what: str, default: list[str]) -> tuple[tuple[int, int], ...]:
        return self.ranges(item, "vlan_range", what, default, "VLAN", 4094, "1000-1099", "tag")

    def ranges(self, item: dict[str, Any], key: str, what: str, default: list[str], unit: str, top: int,
               example: str, noun: str) -> tuple[tuple[int, int], ...]:
        """Sorted, disjoint LOW-HIGH ranges of numbers 1..`top` (VLAN tags, TCP ports) under `key`."""
        raw = item.get(key, default)
        raw = raw if isinstance(raw, list) else [raw]
        out: list[tuple[int, int]] = []
        for r in raw:
            try:
                lo, hi = parse_range(r)
            except ValueError:
                raise self.fail(item, f"{what}: {unit} range {r!r} is not a number or LOW-HIGH",
                                f"write e.g. {example}") from None
            if not (1 <= lo <= hi <= top):
                raise self.fail(item, f"{what}: {unit} range {r!r} is outside 1-{top} or reversed",
                                f"{unit} {noun}s are 1-{top}, low first")
            for a, b in out:
                if lo <= b and a <= hi:
                    raise self.fail(item, f"{what}: {unit} ranges {a}-{b} and {lo}-{hi} overlap",
                                    f"list each {noun} once")
            out.append((lo, hi))
        if not out and default:
            raise self.fail(item, f"{what}: the {unit} range list is empty", f"give at least one range, e.g. {example}")
        return tuple(sorted(out))


def substrate_from_dict(data: Any, source: str = "<substrate>") -> Substrate:
    """Build a Substrate from a parsed document (YAML mapping), checking it as `load_substrate` does."""
    r = _Reader(source)
    if not isinstance(data, dict) or "authority" not in data:
        raise SubstrateError(f"{source}:1: expected a mapping with at least 'authority:' and 'hosts:'; fix: start the "
                             f"file with 'authority: your.site.org'")
    r.keys(data, TOP_KEYS, "substrate")
    auth = str(data["authority"])
    if not auth or any(c in auth for c in "+ \t/") or auth.startswith("urn:"):
        raise r.fail(data, f"authority {auth!r} is not a GENI authority name",
                     "write the bare name, e.g. 'authority: instageni.example.edu' (no URN, spaces or '+')")

    sites = _sites(r, data)
    site_names = {s.name for s in sites}

    def check_site(item: dict[str, Any], what: str) -> str:
        name = r.text(item, "site")
        if name and sites and name not in site_names:
            raise r.fail(item, f"{what} is in site {name!r}, which 'sites:' does not declare",
                         f"use one of {', '.join(sorted(site_names))} or add it under sites")
        return name

    switches, port_ids = _switches(r, data, auth, check_site)
    hosts = _hosts(r, data, auth, port_ids, check_site)
    if not hosts:
        raise SubstrateError(f"{source}:{data.get('__line__', 1)}: no hosts; fix: list at least one under 'hosts:'")
    cabled = {i.switch_port: f"host {h.name} interface {i.name}" for h in hosts for i in h.interfaces if i.switch_port}
    trunks = _trunks(r, data, auth, port_ids, cabled)
    sizes = []
    for v in r.items(data, "vm_sizes", "VM size"):
        r.keys(v, SIZE_KEYS, "VM size")
        n = r.name(v, "VM size")
        if any(s.name == n for s in sizes):
            raise r.fail(v, f"two VM sizes are named {n}", "give each size its own name")
        machine = r.text(v, "machine", "container")
        if machine not in MACHINES:
            raise r.fail(v, f"VM size {n}: machine {machine!r} is not one of {', '.join(MACHINES)}",
                         "write machine: qemu for a VM with its own kernel, or leave it out (a container)")
        sizes.append(VmSize(n, r.number(v, "cores", 1, f"VM size {n}"), r.number(v, "memory_mb", 1024, f"VM size {n}"),
                            r.number(v, "disk_gb", 10, f"VM size {n}"), machine))
    images = []
    for i in r.items(data, "images", "image"):
        r.keys(i, IMAGE_KEYS, "image")
        n = r.name(i, "image")
        urn = r.urn(i, "urn", f"image {n}") if i.get("urn") else _urn(auth, "image", n)
        if any(im.name == n or im.urn == urn for im in images):
            raise r.fail(i, f"two images are named {n}", "give each image its own name")
        images.append(Image(n, urn, r.text(i, "os", "Linux"), r.text(i, "version"), r.text(i, "description"),
                            r.text(i, "url")))
    externals = _externals(r, data, auth, port_ids, cabled, trunks)
    statics = _static_vlans(r, data, auth, switches, externals)
    boards = tuple(_strip_lines(b) for b in r.items(data, "fpga_boards", "FPGA board"))
    defaults = default_substrate(auth)
    sub = Substrate(auth, tuple(hosts), tuple(switches), tuple(sizes) or defaults.vm_sizes,
                    tuple(images) or defaults.images, tuple(externals), boards,
                    _seconds(r, data), r.text(data, "description"), {}, tuple(sites), tuple(trunks),
                    tuple(statics), r.text(data, "am_url"),
                    r.ranges(data, "public_ports", "public_ports", [], "TCP", 65535, "25100-25199", "port"))
    return replace(sub, sites=sub.all_sites)


def _seconds(r: _Reader, data: dict[str, Any]) -> float:
    value = data.get("provisioning_seconds", 2.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise r.fail(data, f"provisioning_seconds is {value!r}", "give a number of seconds, 0 or more")
    return float(value)


def _sites(r: _Reader, data: dict[str, Any]) -> list[Site]:
    sites: list[Site] = []
    for s in r.items(data, "sites", "site"):
        r.keys(s, SITE_KEYS, "site")
        n = r.name(s, "site")
        if any(x.name == n for x in sites):
            raise r.fail(s, f"two sites are named {n}", "give each site its own name")
        country = r.text(s, "country")
        lat = r.real(s, "latitude", f"site {n}", -90, 90)
        lon = r.real(s, "longitude", f"site {n}", -180, 180)
        if (lat is None) != (lon is None):
            raise r.fail(s, f"site {n} has only one of latitude and longitude", "give both or neither")
        if lat is not None and not country:
            raise r.fail(s, f"site {n} has coordinates but no country", "add e.g. 'country: US' (GENI locations "
                                                                        "need a country)")
        sites.append(Site(n, r.text(s, "description"), country, lat, lon))
    return sites


def _switches(r: _Reader, data: dict[str, Any], auth: str, check_site) -> tuple[list[Switch], set[str]]:
    switches: list[Switch] = []
    port_ids: set[str] = set()
    for s in r.items(data, "switches", "switch"):
        r.keys(s, SWITCH_KEYS, "switch")
        name = r.name(s, "switch")
        if any(x.name == name for x in switches):
            raise r.fail(s, f"two switches are named {name}", "give each switch its own name")
        ports = []
        for pt in r.items(s, "ports", "port"):
            r.keys(pt, PORT_KEYS, f"port of switch {name}")
            pname = r.name(pt, f"port of switch {name}")
            cid = _urn(auth, "interface", f"{name}:{pname}")
            if cid in port_ids:
                raise r.fail(pt, f"switch {name} has two ports named {pname}", "give each port its own name")
            port_ids.add(cid)
            ports.append(Port(pname, cid, r.number(pt, "bandwidth_kbps", 10_000_000, f"port {name}:{pname}")))
        switches.append(Switch(name, _urn(auth, "node", name), tuple(ports),
                               r.vlan_ranges(s, f"switch {name}", ["1000-1099"]), check_site(s, f"switch {name}")))
    return switches, port_ids


def _port(r: _Reader, item: dict[str, Any], auth: str, text: str, port_ids: set[str], what: str) -> str:
    if ":" not in text:
        raise r.fail(item, f"{what} names port {text!r} without its switch", "write SWITCH:PORT, e.g. tor-a:uplink")
    cid = _urn(auth, "interface", text)
    if cid not in port_ids:
        raise r.fail(item, f"{what} names port {text!r}, which no switch declares",
                     "name it SWITCH:PORT as listed under switches (or add the port there)")
    return cid


def _hosts(r: _Reader, data: dict[str, Any], auth: str, port_ids: set[str], check_site) -> list[Host]:
    hosts: list[Host] = []
    names: set[str] = set()
    cabled: dict[str, str] = {}
    for h in r.items(data, "hosts", "host"):
        r.keys(h, HOST_KEYS, "host")
        base = r.name(h, "host")
        count = r.number(h, "count", 1, f"host {base}")
        exclusive = r.flag(h, "exclusive", f"host {base}")
        site = check_site(h, f"host {base}")
        for k in range(1, count + 1):
            name = base if count == 1 else f"{base}{k}"
            if name in names:
                raise r.fail(h, f"two hosts are named {name}", "give each host its own name")
            names.add(name)
            ifaces: list[Interface] = []
            for i in r.items(h, "interfaces", "interface"):
                r.keys(i, IFACE_KEYS, f"interface of host {base}")
                iname = r.name(i, f"interface of host {base}")
                if any(x.name == iname for x in ifaces):
                    raise r.fail(i, f"host {name} has two interfaces named {iname}", "give each its own name")
                role = r.text(i, "role", "experimental")
                if role not in ROLES:
                    raise r.fail(i, f"interface {name}:{iname} has role {role!r}", f"use one of {', '.join(ROLES)}")
                port = None
                if i.get("switch_port"):
                    text = str(i["switch_port"]).replace("{n}", str(k))
                    port = _port(r, i, auth, text, port_ids, f"host {name} interface {iname}")
                    if port in cabled:
                        raise r.fail(i, f"switch port {text} is cabled to both {cabled[port]} and host {name} "
                                        f"interface {iname}", "cable each switch port to one interface")
                    cabled[port] = f"host {name} interface {iname}"
                ifaces.append(Interface(iname, _urn(auth, "interface", f"{name}:{iname}"),
                                        r.number(i, "bandwidth_kbps", 10_000_000, f"interface {name}:{iname}"), port,
                                        role))
            hosts.append(Host(name, _urn(auth, "node", name), r.number(h, "cores", 8, f"host {name}"),
                              r.number(h, "memory_mb", 16384, f"host {name}"),
                              r.text(h, "hardware_type", "raw-pc" if exclusive else "pc"), exclusive, tuple(ifaces),
                              site, r.number(h, "disk_gb", 0, f"host {name}", minimum=0)))
    return hosts


def _trunks(r: _Reader, data: dict[str, Any], auth: str, port_ids: set[str], cabled: dict[str, str]) -> list[Trunk]:
    trunks: list[Trunk] = []
    for t in r.items(data, "trunks", "trunk"):
        r.keys(t, TRUNK_KEYS, "trunk")
        n = r.name(t, "trunk")
        ends = t.get("between")
        if not isinstance(ends, list) or len(ends) != 2:
            raise r.fail(t, f"trunk {n}: 'between' must list two switch ports", "write between: [tor-a:x, tor-b:y]")
        a, b = (_port(r, t, auth, str(e), port_ids, f"trunk {n}") for e in ends)
        if a.split("+")[-1].split(":")[0] == b.split("+")[-1].split(":")[0]:
            raise r.fail(t, f"trunk {n} joins two ports of the same switch", "a trunk joins two switches")
        for p in (a, b):
            if p in cabled:
                raise r.fail(t, f"trunk {n} uses port {urn_name(p)}, already cabled to {cabled[p]}",
                             "give the trunk its own ports")
            cabled[p] = f"trunk {n}"
        if any(x.name == n for x in trunks):
            raise r.fail(t, f"two trunks are named {n}", "give each trunk its own name")
        what = f"trunk {n}"
        wire = r.vlan_ranges(t, what, []) if "vlan_range" in t else ()
        translation, qinq = (_trunk_ends(r, t, key, (a, b), what) for key in ("vlan_translation", "qinq"))
        if "s_vlan_range" in t and not qinq:
            raise r.fail(t, f"{what}: s_vlan_range is given but no end does Q-in-Q", "add 'qinq: true' or drop it")
        s_range = r.vlan_ranges({"vlan_range": t["s_vlan_range"], "__line__": t.get("__line__")}, what + " S-tags",
                                []) if "s_vlan_range" in t else ()
        trunks.append(Trunk(n, _urn(auth, "link", n), a, b, r.number(t, "bandwidth_kbps", 10_000_000, what), wire,
                            translation, qinq, s_range))
    return trunks


def _trunk_ends(r: _Reader, t: dict[str, Any], key: str, ends: tuple[str, str], what: str) -> tuple[str, ...]:
    """Which ends of a trunk have a capability: `true` (both), `false` (none) or a list of its SWITCH:PORTs."""
    raw = t.get(key, False)
    if isinstance(raw, bool):
        return ends if raw else ()
    names = {urn_name(e): e for e in ends}
    if not isinstance(raw, list) or not all(str(x) in names for x in raw):
        raise r.fail(t, f"{what}: {key} {raw!r} is not true, false or a list of its ends",
                     f"write {key}: true, or {key}: [{next(iter(names))}]")
    return tuple(e for e in ends if urn_name(e) in {str(x) for x in raw})


def _externals(r: _Reader, data: dict[str, Any], auth: str, port_ids: set[str], cabled: dict[str, str],
               trunks: list[Trunk]) -> list[ExternalLink]:
    externals: list[ExternalLink] = []
    for e in r.items(data, "external_links", "external link"):
        r.keys(e, EXT_KEYS, "external link")
        n = r.name(e, "external link")
        if any(x.name == n for x in externals):
            raise r.fail(e, f"two external links are named {n}", "give each its own name")
        what = f"external link {n}"
        local = _port(r, e, auth, f"{r.need(e, 'switch', what)}:{r.need(e, 'port', what)}", port_ids, what)
        if local in cabled:
            raise r.fail(e, f"{what} leaves from {urn_name(local)}, which is cabled to {cabled[local]}",
                         "give the external link a port of its own")
        cabled[local] = what
        remote_agg = r.urn(e, "remote_aggregate", what)
        remote_port = r.urn(e, "remote_port", what)
        if remote_agg.split("+")[1] == auth:
            raise r.fail(e, f"{what}: remote_aggregate {remote_agg} is this aggregate",
                         "name the aggregate or transit network at the other end")
        capacity = r.number(e, "capacity_kbps", 1_000_000, what)
        minimum = r.number(e, "min_capacity_kbps", 1, what)
        if minimum > capacity:
            raise r.fail(e, f"{what}: min_capacity_kbps {minimum} exceeds capacity_kbps {capacity}",
                         "lower min_capacity_kbps")
        qinq = r.flag(e, "qinq", what)
        if "s_vlan_range" in e and not qinq:
            raise r.fail(e, f"{what}: s_vlan_range is given but qinq is not true", "add 'qinq: true' or drop it")
        s_range = r.vlan_ranges({"vlan_range": e["s_vlan_range"], "__line__": e.get("__line__")}, what + " S-tags",
                                []) if "s_vlan_range" in e else ()
        url = r.text(e, "remote_aggregate_url")
        if url and not url.startswith(("https://", "http://")):
            raise r.fail(e, f"{what}: remote_aggregate_url {url!r} is not a URL", "write https://host:port/path")
        externals.append(ExternalLink(n, _urn(auth, "link", n), local, remote_agg, remote_port,
                                      r.vlan_ranges(e, what, ["3000-3099"]), capacity,
                                      r.flag(e, "vlan_translation", what), r.flag(e, "qinq", what), url,
                                      r.number(e, "mtu", 9000, what, 576), minimum,
                                      r.number(e, "granularity_kbps", 1, what), r.number(e, "te_metric", 10, what),
                                      s_range))
    return externals


def _static_vlans(r: _Reader, data: dict[str, Any], auth: str, switches: list[Switch],
                  externals: list[ExternalLink]) -> list[StaticVlan]:
    out: list[StaticVlan] = []
    for v in r.items(data, "static_vlans", "static VLAN"):
        r.keys(v, STATIC_KEYS, "static VLAN")
        n = r.name(v, "static VLAN")
        what = f"static VLAN {n}"
        tag = r.number(v, "tag", 0, what)
        if tag > 4094:
            raise r.fail(v, f"{what}: tag {tag} is above 4094", "VLAN tags are 1-4094")
        sw_name = str(r.need(v, "switch", what))
        sw = next((s for s in switches if s.name == sw_name), None)
        if sw is None:
            raise r.fail(v, f"{what} is on switch {sw_name!r}, which 'switches:' does not declare",
                         f"use one of {', '.join(s.name for s in switches) or '(declare a switch first)'}")
        for lo, hi in sw.vlan_range:
            if lo <= tag <= hi:
                raise r.fail(v, f"{what}: tag {tag} lies in switch {sw.name}'s dynamic range {lo}-{hi}, so slicex "
                                f"could hand it to a slice", "pick a tag outside the range or narrow the range")
        for e in externals:
            if e.switch_id == sw.component_id and any(lo <= tag <= hi for lo, hi in e.vlan_range):
                raise r.fail(v, f"{what}: tag {tag} lies in external link {e.name}'s range",
                             "pick a tag outside it or narrow that range")
        for o in out:
            if o.name == n:
                raise r.fail(v, f"two static VLANs are named {n}", "give each its own name")
            if o.tag == tag and o.switch == sw.component_id:
                raise r.fail(v, f"{what} and {o.name} both use tag {tag} on {sw.name}", "give each its own tag")
        out.append(StaticVlan(n, tag, sw.component_id, r.flag(v, "shared", what), r.text(v, "description")))
    position = {s.component_id: k for k, s in enumerate(switches)}
    return sorted(out, key=lambda v: (position[v.switch], v.tag))  # one canonical order (NDL has no other)


def check_substrate(sub: Substrate) -> list[str]:
    """Warnings about a substrate that loads but will surprise its operator (nothing here stops it running)."""
    out = []
    vm_hosts = [h for h in sub.hosts if not h.exclusive]
    for s in sub.vm_sizes if vm_hosts else ():
        if not any(h.cores >= s.cores and h.memory_mb >= s.memory_mb for h in vm_hosts):
            out.append(f"VM size {s.name} ({s.cores} cores, {s.memory_mb} MB) fits on no VM host; the biggest has "
                       f"{max(h.cores for h in vm_hosts)} cores and {max(h.memory_mb for h in vm_hosts)} MB")
    for h in sub.hosts:
        if not any(i.switch_port and i.role == "experimental" for i in h.interfaces):
            out.append(f"host {h.name} has no experimental interface cabled to a switch; it cannot join links")
    used = {i.switch_port for h in sub.hosts for i in h.interfaces} | {e.local_port for e in sub.external_links}
    used |= {p for t in sub.trunks for p in (t.port_a, t.port_b)}
    for sw in sub.switches:
        idle = [p.name for p in sw.ports if p.component_id not in used]
        if idle:
            out.append(f"switch {sw.name}: port{'s' if len(idle) > 1 else ''} {', '.join(idle)} "
                       f"cabled to nothing")
    for t in sub.trunks:
        a, b = (next(sw for sw in sub.switches if any(p.component_id == end for p in sw.ports))
                for end in (t.port_a, t.port_b))
        shared = _tags(a.vlan_range) & _tags(b.vlan_range) & (_tags(t.vlan_range) if t.vlan_range else _tags([(1, 4094)]))
        if not shared and not t.translation and not t.qinq:
            out.append(f"trunk {t.name}: switches {a.name} and {b.name} share no tag on it and neither end "
                       f"translates or does Q-in-Q, so links between them are refused; give an end "
                       f"vlan_translation (or qinq, with a tag range both switches share)")
    if len(sub.switches) > 1 and not sub.trunks:
        out.append(f"{len(sub.switches)} switches and no trunks: links between hosts on different switches "
                   f"cannot be carried")
    return out


def _tags(ranges: Any) -> set[int]:
    return {t for lo, hi in ranges for t in range(lo, hi + 1)}


def parse_range(text: Any) -> tuple[int, int]:
    """`1000-1099` -> (1000, 1099); `7` -> (7, 7). Raises ValueError."""
    if isinstance(text, bool):
        raise ValueError(text)
    if isinstance(text, int):
        return (text, text)
    lo, _, hi = str(text).strip().partition("-")
    return (int(lo), int(hi or lo))


_parse_range = parse_range
