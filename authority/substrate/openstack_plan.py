"""The OpenStack substrate's plan, as plain data (pure: no API calls, no clock).

From a sliver spec the authority hands the driver, compute which OpenStack resources must exist: a link is a
Neutron network whose segment is a VLAN (provider:network_type vlan, provider:segmentation_id = the tag the
broker chose) on the operator's physical network, with one subnet and no DHCP or gateway (the nodes' addresses
are the manifest's); a node is a Nova server from a flavor (the sliver type / VM size) and an image (the disk
image), with one Neutron port per interface (the manifest's MAC and address), a keypair and a cloud-config
with the slice users' keys, and the slice's security group.

Every resource name starts with the deployment's prefix and derives from the sliver id, so creating twice
finds the first one, and every resource carries the deployment's tag (Neutron tags; Nova server metadata), so
`reconcile` can tell this deployment's resources from anyone else's on a shared cloud."""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from slicex.config import OpenStackOptions
from slicex.errors import BadArgs
from slicex.inventory import mac_for

NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")


def _h(*parts: str, n: int = 12) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:n]


def deployment_tag(prefix: str) -> str:
    """The tag (or server metadata value) every resource of one deployment carries."""
    return f"slicex-{prefix}"


def sliver_tag(prefix: str, sliver_id: str) -> str:
    return f"slicex-{prefix}-sliver-{_h(sliver_id)}"


def slice_tag(prefix: str, slice_key: str) -> str:
    return f"slicex-{prefix}-slice-{_h(slice_key)}"


def resource_name(prefix: str, sliver_id: str, part: str = "") -> str:
    """`<prefix>-<12 hex of the sliver id>[-<8 hex of the part>]`: one name per sliver (and interface)."""
    return f"{prefix}-{_h(sliver_id)}" + (f"-{_h(sliver_id, part, n=8)}" if part else "")


def check_prefix(prefix: str) -> str:
    if not NAME_RE.match(prefix):
        raise BadArgs(f"openstack resource prefix {prefix!r} must be 1-8 lowercase letters/digits starting with "
                      f"a letter")
    return prefix


def owned(prefix: str, name: str) -> bool:
    """Whether a resource name (keypairs have no tags) belongs to the deployment with this prefix."""
    return bool(re.fullmatch(re.escape(prefix) + r"-[0-9a-f]{12}(-[0-9a-f]{8})?", name or ""))


@dataclass(frozen=True)
class OpenStackSettings:
    """The `openstack:` section of slicex.yaml."""

    cloud: str
    physical_network: str
    flavors: Mapping[str, str] = field(default_factory=dict)  # sliver type / VM size -> Nova flavor name
    images: Mapping[str, str] = field(default_factory=dict)  # disk image URN or name -> Glance image name
    default_image: str = ""
    management_network: str = ""  # an existing network every server also joins (login), or "" for none
    prefix: str = ""

    @staticmethod
    def from_config(opts: OpenStackOptions, prefix: str) -> OpenStackSettings:
        """The driver's settings from the typed section; `prefix` (the deployment's) unless it sets one."""
        missing = [k for k in ("cloud", "physical_network") if not getattr(opts, k)]
        if missing:
            raise BadArgs(f"substrate_driver openstack needs {' and '.join(missing)} under `openstack:` in "
                          f"slicex.yaml (docs/substrate-openstack.md)")
        return OpenStackSettings(opts.cloud, opts.physical_network, dict(opts.flavors), dict(opts.images),
                                 opts.default_image, opts.management_network, check_prefix(opts.prefix or prefix))


@dataclass(frozen=True)
class NetworkPlan:
    """A link or LAN: a VLAN network on the physical network, one subnet, a QoS policy when rate-limited."""

    sliver_id: str
    client_id: str
    name: str
    vlan: int
    physical_network: str
    cidr: str  # "10.10.3.0/24"; "" when the link has no subnet
    capacity_kbps: int
    interface_refs: tuple[str, ...]
    tags: tuple[str, ...]

    def network_body(self) -> dict[str, Any]:
        """Arguments of the network create: admin state down until geni_start."""
        return {"name": self.name, "admin_state_up": False, "provider_network_type": "vlan",
                "provider_physical_network": self.physical_network, "provider_segmentation_id": self.vlan,
                "description": f"slicex link {self.client_id}"}

    def subnet_body(self, network_id: str) -> dict[str, Any]:
        return {"name": self.name, "network_id": network_id, "ip_version": 4, "cidr": self.cidr,
                "enable_dhcp": False, "gateway_ip": None}


@dataclass(frozen=True)
class PortPlan:
    client_id: str
    name: str
    network: str  # the name of the network (a NetworkPlan's, or the management network's)
    mac: str
    address: str  # "10.10.3.1", or "" (Neutron chooses)
    management: bool = False


@dataclass(frozen=True)
class NodePlan:
    sliver_id: str
    client_id: str
    name: str  # the server's and the keypair's name
    hostname: str
    flavor: str
    image: str
    keypair_key: str  # the first user's first public key ("" when the slice gave none: no keypair)
    user_data: str  # cloud-config: hostname and every user's keys
    ports: tuple[PortPlan, ...]
    security_group: str  # the slice's group (name)
    tags: tuple[str, ...]
    metadata: Mapping[str, str]


def _vlans(labels: Iterable[tuple[str, int]]) -> list[int]:
    return [int(v) for k, v in labels if k == "vlan"]


def network_plan(settings: OpenStackSettings, sliver_id: str, client_id: str, labels: Iterable[tuple[str, int]],
                 details: Mapping[str, Any]) -> NetworkPlan:
    """The plan of one link sliver. Neutron QoS limits bandwidth but has no delay or loss: a link asking for
    latency or loss is refused rather than created without them."""
    for key, what in (("latency_ms", "latency"), ("packet_loss", "packet_loss")):
        if details.get(key):
            raise BadArgs(f"link {client_id or sliver_id}: {what} {details[key]} cannot be enforced by the "
                          f"OpenStack substrate (Neutron QoS has no delay or loss rules); request it without {what}")
    tags = _vlans(labels)
    vlan = tags[0] if tags else (int(details["vlan_tag"]) if details.get("vlan_tag") is not None else None)
    if vlan is None:
        raise BadArgs(f"link {client_id or sliver_id}: no VLAN tag was leased for it; the OpenStack substrate makes "
                      f"every link a VLAN segment on {settings.physical_network}")
    if not 1 <= vlan <= 4094:
        raise BadArgs(f"link {client_id or sliver_id}: VLAN {vlan} is outside 1-4094")
    subnet = str(details.get("subnet") or "")
    cidr = ""
    if subnet:
        try:
            cidr = str(ipaddress.ip_network(f"{subnet}.0/24" if subnet.count(".") == 2 else subnet))
        except ValueError:
            raise BadArgs(f"link {client_id or sliver_id}: subnet {subnet!r} is not an IPv4 prefix") from None
    prefix = settings.prefix
    return NetworkPlan(sliver_id, client_id, resource_name(prefix, sliver_id), vlan, settings.physical_network, cidr,
                       int(details.get("capacity_kbps") or 0), tuple(details.get("interface_refs") or ()),
                       (deployment_tag(prefix), sliver_tag(prefix, sliver_id)))


def _address(iface: str, info: Mapping[str, Any], link: NetworkPlan | None) -> str:
    """The request's address if it gave one, else the manifest's (the link's subnet + position on the link)."""
    ip = str(info.get("ip") or "")
    if ip:
        try:
            return str(ipaddress.ip_address(ip))
        except ValueError:
            raise BadArgs(f"interface {iface}: address {ip} is not an IPv4/IPv6 address") from None
    if link is not None and link.cidr and iface in link.interface_refs:
        return str(ipaddress.ip_network(link.cidr)[link.interface_refs.index(iface) + 1])
    return ""


def flavor_for(settings: OpenStackSettings, details: Mapping[str, Any], client_id: str) -> str:
    """The Nova flavor of a node: the operator's mapping of its sliver type or VM size, else that name."""
    for key in (details.get("sliver_type"), details.get("vm_size")):
        if key and key in settings.flavors:
            return settings.flavors[key]
    name = details.get("vm_size") or details.get("sliver_type")
    if not name:
        raise BadArgs(f"node {client_id}: no sliver type or VM size to choose a flavor from")
    return str(name)


def image_for(settings: OpenStackSettings, details: Mapping[str, Any], client_id: str) -> str:
    """The Glance image of a node: the operator's mapping of its disk image URN (or the URN's last part),
    else that last part, else `default_image`."""
    urn = str(details.get("disk_image") or "")
    short = urn.split("+")[-1] if urn else ""
    for key in (urn, short):
        if key and key in settings.images:
            return settings.images[key]
    if short:
        return short
    if settings.default_image:
        return settings.default_image
    raise BadArgs(f"node {client_id}: no disk image was requested and `openstack.default_image` is not set")


def slice_key(details: Mapping[str, Any], sliver_id: str) -> str:
    """Which slice a node is in, for its security group: the slice URN when the slice manager passes one, else
    the slice name in the node's login host name (`<node>.<slice>.<authority>`), else the sliver alone."""
    if details.get("slice_urn"):
        return str(details["slice_urn"])
    parts = str(details.get("hostname") or "").split(".")
    return f"slice:{parts[1]}" if len(parts) >= 3 else f"sliver:{sliver_id}"


def cloud_config(hostname: str, logins: Iterable[Mapping[str, Any]]) -> str:
    """The user-data: the node's host name and one account per slice user with their keys (keys only)."""
    lines = ["#cloud-config", f"hostname: {hostname}", "ssh_pwauth: false", "users:", "  - default"]
    for lg in logins:
        name = re.sub(r"[^a-z0-9_-]", "", str(lg.get("username", "")).lower())[:32]
        if not name:
            continue
        lines += [f"  - name: {name}", "    shell: /bin/bash", "    lock_passwd: true",
                  "    sudo: ALL=(ALL) NOPASSWD:ALL", "    ssh_authorized_keys:"]
        lines += [f"      - {_yaml_str(k)}" for k in lg.get("keys", ()) if str(k).strip()]
    return "\n".join(lines) + "\n"


def _yaml_str(s: str) -> str:
    return '"' + str(s).strip().replace("\\", "\\\\").replace('"', '\\"') + '"'


def hostname_for(client_id: str) -> str:
    name = re.sub(r"[^a-zA-Z0-9-]", "-", client_id).strip("-")[:63]
    return name or "node"


def node_plan(settings: OpenStackSettings, sliver_id: str, client_id: str, labels: Iterable[tuple[str, int]],
              details: Mapping[str, Any], links: Mapping[int, NetworkPlan]) -> NodePlan:
    """The plan of one node sliver. `labels` are the VLAN tags of the links its interfaces are on; `links` maps
    live links' VLANs to their plans. An interface on none of them is refused: a port needs a network."""
    prefix = settings.prefix
    mine = [links[v] for v in _vlans(labels) if v in links]
    ports = []
    for cid, info in (details.get("interfaces") or {}).items():
        link = next((lk for lk in mine if cid in lk.interface_refs), None)
        if link is None:
            raise BadArgs(f"node {client_id}: interface {cid} is on no link of this aggregate; the OpenStack "
                          f"substrate needs a network for every port")
        ports.append(PortPlan(cid, resource_name(prefix, sliver_id, cid), link.name,
                              str(info.get("mac_address") or mac_for(sliver_id, cid)), _address(cid, info, link)))
    if settings.management_network:
        ports.append(PortPlan("", resource_name(prefix, sliver_id, "management"), settings.management_network,
                              "", "", management=True))
    logins = list(details.get("logins") or ())
    keys = [str(k) for lg in logins for k in lg.get("keys", ()) if str(k).strip()]
    key = slice_key(details, sliver_id)
    hostname = hostname_for(client_id)
    return NodePlan(sliver_id, client_id, resource_name(prefix, sliver_id), hostname,
                    flavor_for(settings, details, client_id), image_for(settings, details, client_id),
                    keys[0] if keys else "", cloud_config(hostname, logins), tuple(ports),
                    f"{prefix}-{_h(key)}", (deployment_tag(prefix), sliver_tag(prefix, sliver_id),
                                            slice_tag(prefix, key)),
                    {"slicex": deployment_tag(prefix), "slicex_sliver": sliver_tag(prefix, sliver_id),
                     "slicex_client_id": client_id[:255]})


# ---- status: OpenStack states to GENI operational states -------------------------------------------------------
READY, NOTREADY, CONFIGURING, FAILED, STOPPING = ("geni_ready", "geni_notready", "geni_configuring", "geni_failed",
                                                  "geni_stopping")
SERVER_STATES = {"ACTIVE": READY, "BUILD": CONFIGURING, "REBUILD": CONFIGURING, "REBOOT": CONFIGURING,
                 "HARD_REBOOT": CONFIGURING, "MIGRATING": READY, "RESIZE": CONFIGURING, "VERIFY_RESIZE": READY,
                 "SHUTOFF": NOTREADY, "STOPPED": NOTREADY, "SUSPENDED": NOTREADY, "PAUSED": NOTREADY,
                 "SHELVED": NOTREADY, "SHELVED_OFFLOADED": NOTREADY, "ERROR": FAILED, "DELETED": FAILED,
                 "SOFT_DELETED": FAILED, "UNKNOWN": FAILED}


def being_deleted(server: Mapping[str, Any]) -> bool:
    """Whether Nova is still deleting a server: DELETE answers at once, the compute host removes it later
    (about a second on the all-in-one cloud), and until then the server is listed."""
    return (str(server.get("task_state") or "").lower() == "deleting"
            or str(server.get("status", "")).upper() in ("DELETED", "SOFT_DELETED"))


def node_state(server: Mapping[str, Any] | None, ports: Iterable[Mapping[str, Any]], expected_ports: int,
               started: bool, name: str) -> tuple[str, str]:
    """(GENI state, error) of a node from its server (None: not created, or gone) and its ports. A node not
    started has no server yet; a started one whose server vanished, errored, or whose ports did, is failed."""
    ports = list(ports)
    if len(ports) < expected_ports:
        return FAILED, f"node {name}: {expected_ports - len(ports)} of its {expected_ports} ports are gone"
    bad = [p for p in ports if str(p.get("status", "")).upper() == "ERROR"]
    if bad:
        return FAILED, f"node {name}: port {bad[0].get('name') or bad[0].get('id')} is in ERROR"
    if server is None:
        return (FAILED, f"node {name}: its server is gone from the cloud") if started else (NOTREADY, "")
    status = str(server.get("status", "UNKNOWN")).upper()
    state = SERVER_STATES.get(status, FAILED)
    if state == FAILED:
        fault = (server.get("fault") or {}).get("message", "") if isinstance(server.get("fault"), Mapping) else ""
        return FAILED, f"node {name}: server {server.get('id')} is {status}" + (f": {fault}" if fault else "")
    if status == "ACTIVE" and (server.get("task_state") or "") == "powering-off":
        return STOPPING, ""
    if state == READY and any(str(p.get("status", "")).upper() == "BUILD" for p in ports):
        return CONFIGURING, ""  # the server runs; Neutron is still wiring a port
    return state, ""


def network_state(network: Mapping[str, Any] | None, name: str) -> tuple[str, str]:
    """(GENI state, error) of a link from its network: administratively down until geni_start."""
    if network is None:
        return FAILED, f"link {name}: its network is gone from the cloud"
    status = str(network.get("status", "")).upper()
    if status == "ERROR":
        return FAILED, f"link {name}: network {network.get('id')} is in ERROR"
    if not network.get("is_admin_state_up", network.get("admin_state_up", True)):
        return NOTREADY, ""
    return (READY, "") if status == "ACTIVE" else (CONFIGURING, "")


# ---- teardown and reconcile -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Found:
    """A resource the cloud holds: its kind, id, name and tags (server metadata included as tags)."""

    kind: str  # "server" | "port" | "network" | "security_group" | "keypair" | "qos_policy"
    id: str
    name: str
    tags: frozenset[str] = frozenset()


TEARDOWN_ORDER = ("server", "port", "network", "qos_policy", "security_group", "keypair")


def orphans(prefix: str, found: Iterable[Found], live_sliver_ids: Iterable[str],
            live_slice_keys: Iterable[str]) -> list[Found]:
    """What reconcile removes, in a teardown order that Neutron accepts (servers, then their ports, then
    networks, then the QoS policies they used, then security groups, then keypairs): resources with this deployment's tag (keypairs: name) that
    no live sliver (security groups: no live slice) holds."""
    dep = deployment_tag(prefix)
    live_tags = {sliver_tag(prefix, s) for s in live_sliver_ids}
    live_names = {resource_name(prefix, s) for s in live_sliver_ids}
    live_slices = {f"{prefix}-{_h(k)}" for k in live_slice_keys}
    out = []
    for f in found:
        if f.kind == "keypair":
            if owned(prefix, f.name) and f.name not in live_names:
                out.append(f)
        elif dep in f.tags:
            if f.kind == "security_group":
                if f.name not in live_slices:
                    out.append(f)
            elif not (f.tags & live_tags):
                out.append(f)
    return sorted(out, key=lambda f: (TEARDOWN_ORDER.index(f.kind), f.name, f.id))
