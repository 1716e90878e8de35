"""The netns substrate driver: real slivers on one Linux host.

- A node sliver is a network namespace (loopback up, /etc/netns/<ns>/hostname) with one veth pair per
  interface: one end inside with the node's MAC and address, the other a port of the deployment's private
  Open vSwitch bridge (userspace datapath). Provisioning creates it with its interfaces down
  (geni_notready); geni_start brings them up, geni_stop down, geni_restart both.
- A link or LAN sliver is a segment of the bridge keyed by the VLAN tag the broker chose: geni_start installs
  its OpenFlow rules (authority/substrate/flows.py, pushed by the os-ken controller or ovs-ofctl), geni_stop removes
  them. Ports of different segments never exchange a frame, so slices are isolated.
- Link capacity is a token bucket on both ends of every interface on the link (egress of the namespace end
  and of the bridge end). Latency and loss need netem; where the kernel lacks it they are refused.
- Each node is also a machine (authority/substrate/container.py): an unprivileged LXC container joined to that
  namespace, with its own root file system (an overlay over the slice's uid-shifted copy of a catalogue
  image, authority/substrate/images.py), its own users and processes, its uids in a host range no other slice
  holds, and the sliver type's cores and memory enforced with cgroups. geni_start boots it, geni_stop stops it.
- Login (authority/substrate/login.py): the node's sshd runs inside its container with the slice users' keys
  (geni_users at Provision, geni_update_users after), reached through a port on the host (127.0.0.1 by
  default); the manifest's login service names that host and port. A node's public ports (the broker's
  `pport:` units, resources/public_port.py) are relays of the same kind from the gateway's address
  (`public_address`) to the node ports they name; the manifest names them at `public_host`.
- Measurement: a node's view carries the switch's counters of its interfaces' ports (with its container's
  CPU time and memory from cgroups); a link that asks for a mirror (measure:mirror) has every packet of
  its ports copied by an Open vSwitch mirror to the port of its slice's capture interface (an interface of a
  slice's node on no link, so in no segment: it receives the copies and nothing else). Post-boot `execute` services
  (authority/substrate/execute.py) run inside the node at every start, as its user; the node is configuring while
  they run and failed, naming the command, if one exits non-zero.

Every object name starts with the deployment's prefix (netns_plan.py), so `reconcile` can remove what belongs
to no live lease after a crash and adopt the rest. Status checks the real objects: a node whose namespace
vanished is geni_failed, never ready."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from authority.substrate import hostnet
from authority.substrate.container import (
    NodeContainer,
    NodeLimits,
    UidRanges,
    assign_uids,
    cgroup_pids,
    detach_loops,
    disk_admission,
    ensure_subids,
    loop_devices,
    lxc_missing,
    mounts_under,
    node_limits,
    uid_base,
    unmount,
)
from authority.substrate.datasets import DEFAULT_QUOTA_MB, DatasetStore
from authority.substrate.execute import NodeServices, services_of, verdict
from authority.substrate.flows import AccessPort, Segment, Uplink, segment_flows
from authority.substrate.images import (
    DEFAULT_IMAGE,
    DEFAULT_MAX_USER_BYTES,
    ImageCatalogue,
    NodeImage,
    image_copies,
    image_name,
    link_copy,
    may_use,
)
from authority.substrate.install import DEFAULT_MAX_BYTES, install_all, installs_of
from authority.substrate.login import Account, LoginRelay, accounts, kill_netns_processes, public_relay
from authority.substrate.netns_plan import (
    IfacePlan,
    LinkPlan,
    NodePlan,
    RackLayout,
    check_prefix,
    link_plan,
    node_plan,
    owned,
    shared_trunk_name,
    tbf_args,
    trunk_name,
    veth_names,
    wanted_mirrors,
)
from authority.substrate.openflow import DEFAULT_CONTROLLER, FlowProgrammer, OfctlProgrammer, flow_programmer
from authority.substrate.ovs import OvsSwitch, default_run_dir
from authority.substrate.vm import NodeVM, accel_of, machine_at, probe_accel, tap_name
from authority.substrate.vm_image import qemu_missing, raw_size, vm_form
from protocol.messages import REWIRE, SliverSpec
from rspec.blockstore import Blockstore
from slicex.errors import BadArgs, GeniError, InsufficientDisk, ServerError, Unsupported

log = logging.getLogger("slicex.netns")

DESCRIPTION = ("netns substrate: each node is an unprivileged LXC container on this host (its own root file "
               "system from an image, users, processes and uid range; cores and memory enforced by cgroups) in a "
               "network namespace of its own, each link a VLAN segment of a private Open vSwitch bridge "
               "programmed over OpenFlow, capacity enforced with tc, an sshd per node on a host port; nodes "
               "share the host's kernel (a qemu-vm node, where offered, runs its own)")
VM_BOOT_SECONDS = 300.0  # a qemu-vm node's start to its sshd's banner, else Status fails it (TCG, loaded: 20-80 s)
STATE_ROOT = Path("/var/lib")  # /var/lib/slicex-<prefix>: containers, their layers, uid-shifted image copies
UID_RANGES_DIR = Path("/var/lib/slicex/uid-ranges")  # host-wide: deployments sharing a host never share a range
NEEDED = ("root", "ip", "tc", "ethtool", "netns", "veth", "tbf", "broadcast_policer")
DEFAULT_LAYERS_RESERVE_MB = 2048  # kept free on the node layers' file system (slicex.yaml netns.layers_reserve_mb)
HOST_TMPFS_OPTIONS = "size=64m,mode=711,nosuid,nodev"  # the files the host hands its nodes
READY, NOTREADY, FAILED, READY_BUSY = "geni_ready", "geni_notready", "geni_failed", "geni_ready_busy"


def vm_description(probe: dict | None) -> str:
    """What GetVersion's description adds about qemu-vm nodes: KVM or TCG, and why (nothing where none run)."""
    if not probe:
        return ""
    return (f"; qemu-vm nodes: QEMU virtual machines with their own kernel, "
            f"{'KVM' if probe['kvm'] else 'TCG (software emulation)'} ({probe['why']})")


class NetnsDriver:
    """SubstrateDriver over namespaces, veths, tc, a private OVS and a container per node. `start` before use,
    `shutdown` after."""

    def __init__(self, prefix: str, run_dir: Path | None = None, controller: str = DEFAULT_CONTROLLER,
                 timeout: float = 30.0, login_address: str = "127.0.0.1", login_host: str | None = None, switch_dir: Path | None = None,
                 cables: Mapping[str, str] | None = None, state_dir: Path | None = None,
                 images: ImageCatalogue | None = None, default_image: str = DEFAULT_IMAGE,
                 uid_ranges_dir: Path | None = None, pids_max: int = 1024, install_sources: Iterable[str] = (),
                 install_max_bytes: int = DEFAULT_MAX_BYTES, public_address: str = "127.0.0.1",
                 public_host: str | None = None, image_quota_bytes: int = DEFAULT_MAX_USER_BYTES,
                 datasets: DatasetStore | None = None, dataset_quota_mb: int = DEFAULT_QUOTA_MB,
                 layout: RackLayout | None = None, login_ports: tuple[tuple[int, int], ...] = (),
                 layers_dir: Path | None = None, layers_reserve_mb: int = DEFAULT_LAYERS_RESERVE_MB):
        """`switch_dir`: the run directory of an Open vSwitch shared with other deployments on this host (one
        bridge each; slicex.yaml `netns: {switch_dir: ...}`). Two ovs-vswitchd with the userspace datapath
        cannot run on one host: the second cannot create its `ovs-netdev` tap ("Device or resource busy") and
        its bridges never come up. `cables`: external port URN -> the remote port URN (the substrate's
        external links); on a shared switch the driver joins two aggregates' bridges itself, with a veth pair
        named from both ports (`shared_trunk_name`), the first time a stitched link uses the cable.
        `state_dir` holds the node containers (default /var/lib/slicex-<prefix>); `images` the operator's
        image catalogue; `default_image` what a node that names none boots; `install_sources` the URL prefixes
        of the file servers install services may fetch from (none: install services are refused);
        `public_address` where nodes' public ports listen (the gateway) and `public_host` the name the
        manifest gives it (slicex.yaml public_hostname); `image_quota_bytes` what one user's snapshots
        (CreateImage) may hold together; `datasets` the host's persistent datasets and `dataset_quota_mb` what
        one user's may hold together. `layout`: the substrate's switches and trunks (RackLayout.of): one bridge
        per switch, each trunk a veth pair between two bridges carrying links between racks under the tags
        negotiated for them. `login_ports`: the ranges new login ports are taken from (any free port when
        empty). `layers_dir`: where nodes' disks (their layer file systems) live (default
        `<state_dir>/layers`); a node is made only while the disks of the nodes there fit its file system's
        free space less `layers_reserve_mb`."""
        self.prefix = check_prefix(prefix)
        self.bridge = f"{prefix}-br"
        self.dpid = int(hashlib.sha256(prefix.encode()).hexdigest()[:12], 16)
        self.layout = layout or RackLayout()
        self.bridges = self.layout.bridges(prefix)  # switch -> bridge (the first switch's is self.bridge)
        self.run_dir = Path(run_dir or default_run_dir(prefix))
        self.shared_switch = switch_dir is not None
        self.ovs = OvsSwitch(switch_dir or self.run_dir, timeout=timeout)
        self.cables = {k.lower(): v for k, v in (cables or {}).items()}
        self.flows: FlowProgrammer = flow_programmer(controller, self.run_dir, self.ovs, timeout)
        # a rack's switch on another host (a lab host's namespace): a switch of its own there, rules pushed
        # with ovs-ofctl over its socket (the controller listens on this namespace's loopback)
        self.remote: dict[str, OvsSwitch] = {
            self.bridges[sw]: OvsSwitch(Path(f"{self.run_dir}-{self.bridges[sw]}"), timeout=timeout, netns=ns)
            for sw, ns in self.layout.hosts.items() if sw in self.bridges}
        self.remote_flows: dict[str, FlowProgrammer] = {b: OfctlProgrammer(o) for b, o in self.remote.items()}
        self.description = f"{DESCRIPTION} (OpenFlow rules from {self.flows.name})"
        self.links: dict[int, LinkPlan] = {}  # live link segments by VLAN
        self.enabled: set[int] = set()  # segments started (their rules installed)
        self.ports: dict[str, tuple[int, int, str]] = {}  # bridge port -> (ofport, vlan, mac)
        self.port_bridge: dict[str, str] = {}  # bridge port -> its bridge (its rack's switch)
        self.netem = False
        self.nodes_dir = Path(f"{self.run_dir}-nodes")  # login relays' pid files and logs (root's)
        self.state_dir = Path(state_dir or STATE_ROOT / f"slicex-{prefix}")
        self.lxcpath = self.state_dir / "lxc"
        self.bases_dir = self.state_dir / "bases"  # per uid range, the image copies shifted into it
        self.layers_dir = Path(layers_dir or self.state_dir / "layers")  # nodes' disks: <netns>.img each
        self.layers_reserve_bytes = layers_reserve_mb * 2**20
        self.host_files = self.state_dir / "host"  # a tmpfs: what the host hands its nodes (/run/slicex)
        self.images = images or ImageCatalogue()
        self.default_image = default_image
        self.uid_ranges = UidRanges(uid_ranges_dir or UID_RANGES_DIR)
        self.pids_max = pids_max
        self.install_sources = tuple(install_sources)
        self.install_max_bytes = install_max_bytes
        self.image_quota_bytes = image_quota_bytes
        self.datasets = datasets or DatasetStore()
        self.dataset_quota_mb = dataset_quota_mb
        self.node_slices: dict[str, str] = {}  # namespace of a live node -> its slice's uid range owner
        self.trunks: dict[str, int] = {}  # external port URN (lower case) -> ofport of its trunk device
        self.capture_ports: dict[tuple[str, str], str] = {}  # (slice URN, interface client_id) -> bridge port
        self.mirrored: dict[str, tuple[tuple[str, ...], str]] = {}  # mirror name -> (ports copied, output port)
        self.rack_trunks: dict[str, int] = {}  # trunk port between two switches -> ofport of its veth end
        self.login_address = login_address  # where the login ports listen
        self.login_host = login_host or login_address  # what the manifest tells users to connect to
        self.login_ports = login_ports  # where new login ports come from (slicex.yaml netns.login_ports)
        self.public_address = public_address  # where nodes' public ports listen
        self.public_host = public_host or public_address  # what the manifest names for them
        self.snapshotting: set[str] = set()  # namespaces of nodes frozen while an image is made of them
        self._lock = threading.RLock()
        # qemu-vm nodes: KVM where a probe boot shows it works, else TCG (GetVersion's description says which)
        self.vm_probe = self._probe_vm()
        self.description += vm_description(self.vm_probe)

    def _probe_vm(self) -> dict | None:
        """Whether KVM boots a guest here (once per host boot); None where qemu-vm nodes cannot run (no QEMU,
        or the default image has no VM form yet)."""
        if qemu_missing():
            return None
        img = self.images.get(self.default_image)
        form = vm_form(img.rootfs.parent) if img is not None else None
        return probe_accel(form) if form is not None else None

    # ---- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Check the host can do it, start (or adopt) the private switch and the controller; make sure an
        image exists to boot nodes from (the first start builds the default one)."""
        caps = hostnet.capabilities()
        missing = [f"{k}: {caps.get(k, 'not probed')}" for k in NEEDED if caps.get(k) != "ok"]
        missing += lxc_missing()
        if missing:
            raise Unsupported("the netns substrate cannot run on this host: " + "; ".join(missing))
        changed = ensure_subids()
        if changed:
            log.info("netns: gave root the node uid ranges in %s", ", ".join(changed))
        recovered = self.images.recover() + self.datasets.recover()  # what a kill -9 mid-build left
        if recovered:
            log.info("netns: after a cut image or dataset operation: %s", ", ".join(recovered))
        if self.images.get(self.default_image) is None:
            log.info("netns: building node image %s (debootstrap; once per host)", self.default_image)
            self.images.build(self.default_image)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.chmod(0o711)
        self._mount_host_files()
        self.netem = caps.get("netem") == "ok"
        self.ovs.start()
        self.flows.start()
        target = self.flows.controller_target()
        log.info("netns: OpenFlow rules of bridge %s from %s%s", self.bridge, self.flows.name,
                 f" (controller {target})" if target else " (no controller: pushed with ovs-ofctl)")
        for bridge in dict.fromkeys(self.bridges.values()):
            if bridge in self.remote:
                self.remote[bridge].start()
                self.remote[bridge].ensure_bridge(bridge, self._dpid(bridge), None)
            else:
                self.ovs.ensure_bridge(bridge, self._dpid(bridge), target)
        with self._lock:
            self._join_racks()
            self._push()

    def holds_slivers(self) -> bool:
        """Whether any node of this deployment is on the host (a namespace or a container with its prefix)."""
        return any(ns.startswith(self.prefix + "-") for ns in hostnet.namespaces()) or (
            self.lxcpath.is_dir() and any(self.lxcpath.iterdir()))

    def shutdown(self, remove: bool = False) -> None:
        """Stop the controller and the switch. Slivers' namespaces and containers stay (their leases are live;
        the next start reconciles); when there are none, nothing of this deployment does: its bridge, run and
        state directories go too, as `remove` makes them go in any case (tests, operators uninstalling)."""
        remove = remove or not self.holds_slivers()
        self.flows.stop()
        for bridge in dict.fromkeys(self.bridges.values()):
            if remove and self._ovs(bridge).running():
                self._ovs(bridge).vsctl("--if-exists", "del-br", bridge)
        for remote in self.remote.values():
            remote.stop(remove=remove)
        if remove:
            for dev in self._rack_trunk_devices():
                hostnet.del_link(dev)
        if self.shared_switch:  # the switch is the host's: its owner stops it; this deployment only its bridge
            if remove:
                shutil.rmtree(self.run_dir, ignore_errors=True)
        else:
            self.ovs.stop(remove=remove)
        if remove:
            shutil.rmtree(self.nodes_dir, ignore_errors=True)  # node directories went with their slivers
            if self.lxcpath.is_dir():
                for d in self.lxcpath.iterdir():
                    self._machine_at(d.name).destroy()
            self._remove_layers(keep=set())
            for point in mounts_under(self.state_dir):
                unmount(point)
            for owner in self._owned_ranges():
                self.uid_ranges.release(owner)
            shutil.rmtree(self.state_dir, ignore_errors=True)
            for bridge in dict.fromkeys(self.bridges.values()):
                hostnet.del_link(bridge)  # the netdev datapath's tap for a bridge may outlive the daemon

    # ---- the SubstrateDriver seam ----------------------------------------------------------------------------
    def create(self, spec: SliverSpec, now: datetime) -> dict[str, Any]:
        with self._lock:
            if spec.kind == "link":
                plan = self._link_plan(spec)
                if plan.vlan is not None:
                    other = self.links.get(plan.vlan)
                    if other is not None and other.sliver_id != spec.id:
                        raise ServerError(f"link {spec.client_id}: VLAN {plan.vlan} is already the segment of "
                                          f"sliver {other.sliver_id} on this host")
                    self.links[plan.vlan] = plan
                return {"state": NOTREADY, "vlan": plan.vlan}
            if spec.kind != "node":
                raise BadArgs(f"the netns substrate has no {spec.kind} slivers")
            plan = self._node_plan(spec)
            if plan.machine == "qemu":
                self._check_vm(spec)
            services_of(spec.details, spec.client_id)  # refuse an unknown shell now, not at boot
            installs_of(spec.details, spec.client_id, self.install_sources)  # and a file server not offered
            accts = accounts(spec.details.get("logins") or ())
            image = self._image(spec)
            limits = self._limits(spec, plan)
            self._admit_disk(spec, plan, limits)
            owner = self._owner(spec)
            try:
                index = self.uid_ranges.claim(owner)
                self.node_slices[plan.netns] = owner
                self._capture_ports(spec, plan)  # before its ports exist: _build's push mirrors to them
                self._build(plan, up=False)
                self._define(plan, image, index, limits, self._attach(spec, plan, index), spec)
                self._set_users(plan, accts, running=False)
                port = self._relay(plan).ensure_forward(None)
                self._public_forwards(spec, plan)
            except (GeniError, OSError) as exc:
                self._teardown(plan)
                if isinstance(exc, GeniError):
                    raise
                raise ServerError(f"node {spec.client_id}: {exc}") from None
            return {"state": NOTREADY, "netns": plan.netns, "login_port": port, "image": image.name,
                    "uid_range": index, "limits": limits.to_doc(), **self._vm_record(plan),
                    "interfaces": {i.client_id: {"device": i.ns_if, "address": i.address, "vlan": i.vlan,
                                                 "rate_kbps": i.rate_kbps} for i in plan.interfaces}}

    def modify(self, spec: SliverSpec, status: dict[str, Any], action: str, now: datetime) -> dict[str, Any]:
        with self._lock:
            if action == "geni_update_users":
                if spec.kind == "node":  # the authority merged the new users into the spec's logins
                    plan = self._node_plan(spec)
                    self._set_users(plan, accounts(spec.details.get("logins") or ()),
                                    running=self._container(plan).running())
                return {**status, "error": ""}
            if action == REWIRE:
                return self._rewire(spec, status) if spec.kind == "node" else {**status, "error": ""}
            if action not in ("geni_start", "geni_stop", "geni_restart"):
                raise Unsupported(f"{action} is not an action of the netns substrate")
            up = action != "geni_stop"
            if spec.kind == "link":
                plan = self._link_plan(spec)
                if plan.vlan is not None:
                    self.links.setdefault(plan.vlan, plan)
                    if up:
                        for port, _tags in plan.uplinks:
                            self._trunk(port)
                    (self.enabled.add if up else self.enabled.discard)(plan.vlan)
                    self._push()
            else:
                plan = self._node_plan(spec)
                if plan.netns not in hostnet.namespaces():
                    raise ServerError(f"node {spec.client_id}: its namespace {plan.netns} is gone from the host")
                for i in plan.interfaces:
                    if action == "geni_restart":
                        hostnet.set_up(plan.netns, i.ns_if, False)
                    hostnet.set_up(plan.netns, i.ns_if, up)
                container = self._container(plan)
                container.clear_failure()
                try:
                    if up:
                        slow = [i.ns_if for i in plan.interfaces if not hostnet.wait_carrier(plan.netns, i.ns_if)]
                        if slow:
                            raise ServerError(f"node {spec.client_id}: interfaces {', '.join(slow)} of namespace "
                                              f"{plan.netns} did not come up")
                    self._node_services(spec, plan, status, up, restart=action == "geni_restart", boot=True)
                    if up:  # a relay that died (killed, crashed) comes back on the node's recorded port
                        status = {**status, "login_port": self._relay(plan).ensure_forward(status.get("login_port"))}
                        self._public_forwards(spec, plan)
                except Exception as exc:  # noqa: BLE001 - whatever stopped it, Status says it
                    container.note_failure(f"{action} failed: {getattr(exc, 'message', None) or exc}")
                    raise
            return {**status, "state": READY if up else NOTREADY, "error": ""}

    def destroy(self, spec: SliverSpec, status: dict[str, Any], now: datetime) -> None:
        """Remove everything of the sliver; asked twice, the second time finds nothing to do."""
        with self._lock:
            if spec.kind == "link":
                vlan = self._link_plan(spec).vlan
                if vlan is not None and (lk := self.links.get(vlan)) is not None and lk.sliver_id == spec.id:
                    del self.links[vlan]
                    self.enabled.discard(vlan)
                    self._push()
                return
            plan = self._node_plan(spec)
            self.node_slices.setdefault(plan.netns, self._owner(spec))
            self._teardown(plan)

    def status(self, spec: SliverSpec, status: dict[str, Any], now: datetime) -> tuple[str, str]:
        """The recorded state, checked against the host: what is gone is geni_failed, saying what."""
        state = status.get("state", NOTREADY)
        if spec.kind == "link":
            vlan = status.get("vlan")
            if state == READY and vlan is not None and vlan not in self.enabled:
                return FAILED, f"segment VLAN {vlan} has no forwarding rules on bridge {self.bridge}"
            return state, status.get("error", "")
        ns = status.get("netns") or self._node_plan(spec).netns
        if ns not in hostnet.namespaces():
            return FAILED, f"namespace {ns} is gone from the host"
        container = self._container(self._node_plan(spec))
        failure = container.failure()
        if failure:
            return FAILED, f"node {spec.client_id}: {failure}"
        if container.frozen():
            if ns in self.snapshotting:
                return READY_BUSY, f"node {spec.client_id} is paused while an image is made of it"
            return FAILED, (f"node {spec.client_id} (container {ns}) is frozen: its processes are paused (a cut "
                            f"CreateImage; the aggregate's next start thaws it)")
        if state == READY:
            down = [d["device"] for d in status.get("interfaces", {}).values() if not hostnet.is_up(ns, d["device"])]
            if down:
                return FAILED, f"interfaces {', '.join(down)} of namespace {ns} are down"
            plan = self._node_plan(spec)
            container = self._container(plan)
            if not container.running():
                return FAILED, f"the container of node {spec.client_id} ({plan.netns}) is not running"
            if plan.machine == "qemu":
                booted = NodeVM(self.lxcpath, ns, self.layers_dir).boot_state(
                    lambda argv: hostnet.exec_in(ns, argv, timeout=10), VM_BOOT_SECONDS)
                if booted == "booting":
                    return "geni_configuring", ""
                if booted != "ready":
                    return FAILED, f"node {spec.client_id}: {booted}"
            elif "sshd" not in container.process_names():
                return FAILED, f"the sshd of node {spec.client_id} (container {ns}) is not running"
            if status.get("login_port") and not self._relay(plan).forward_running():
                return FAILED, (f"the login port {self.login_address}:{status['login_port']} of node "
                                f"{spec.client_id} has no relay to its sshd")
            for pp in spec.details.get("public_ports") or ():
                if not self._relay(plan).forward_running(public_relay(pp["port"])):
                    return FAILED, (f"the public port {self.public_address}:{pp['public_port']} of node "
                                    f"{spec.client_id} has no relay to its port {pp['port']}")
            services = services_of(spec.details, spec.client_id)
            if services:
                how, why = verdict(self._services(plan).results(services))
                if how == "running":
                    return "geni_configuring", ""
                if how == "failed":
                    return FAILED, f"node {spec.client_id}: {why}"
        return state, status.get("error", "")

    def view(self, spec: SliverSpec, status: dict[str, Any]) -> dict[str, Any]:
        """What the manifest shows of a node beyond the slice manager's record: where its users log in
        (this host's login port, not port 22 of a name nobody resolves), its execute services' results and
        what the machine got (image, cores, memory)."""
        if spec.kind != "node":
            return {}
        out: dict[str, Any] = {}
        port = status.get("login_port")
        if port:
            out["logins"] = [{"username": a.name, "hostname": self.login_host, "port": port}
                             for a in accounts(spec.details.get("logins") or ())]
        public = spec.details.get("public_ports") or ()
        if public:
            out["public_ports"] = [{"port": pp["port"], "public_port": pp["public_port"], "host": self.public_host}
                                   for pp in public]
        plan = self._node_plan(spec)
        if status.get("limits"):
            out["container"] = {**status["limits"], "image": status.get("image", ""),
                                **self._container(plan).usage(), **self._vm_record(plan)}
        machine = self._container(plan)
        if isinstance(machine, NodeVM):
            out["console"] = machine.console()
        services = services_of(spec.details, spec.client_id)
        if services:
            out["execute"] = self._services(plan).results(services)
        counters = self._counters(plan)
        if counters:
            out["counters"] = counters
        return out

    def snapshot(self, spec: SliverSpec, status: dict[str, Any], name: str, owner: str, public: bool,
                 now: datetime) -> NodeImage:
        """CreateImage: the node's root file system as a new image of the catalogue, owned by `owner`: the
        image it booted with its own overlay layer applied (images.py `snapshot`), read while the node is
        frozen so its files do not change under the copy."""
        if spec.kind != "node":
            raise BadArgs(f"{spec.client_id or spec.id} is a {spec.kind}; an image is made of a node")
        plan = self._node_plan(spec)
        if plan.machine == "qemu":
            raise Unsupported(f"node {spec.client_id} is a qemu-vm: CreateImage of a VM node is not built yet "
                              f"(container nodes only)")
        container = self._container(plan)
        layer = container.fs / "upper"
        booted = str(status.get("image") or "")
        base = self.images.get(booted) if booted else None
        if base is None or status.get("uid_range") is None or not layer.is_dir():
            raise ServerError(f"node {spec.client_id}: cannot snapshot it (its image {booted or '?'} or its own "
                              f"layer is gone from this host)")
        self.snapshotting.add(plan.netns)
        try:
            frozen = container.freeze()
            if not frozen and container.running():
                raise ServerError(f"node {spec.client_id}: its processes could not be paused for the copy; retry")
            try:
                return self.images.snapshot(
                    name, base, layer, uid_base(int(status["uid_range"])), owner, public,
                    f"snapshot of node {spec.client_id} of {spec.details.get('slice_urn', '')} (from {base.name})",
                    self.image_quota_bytes)
            finally:
                if frozen:
                    container.unfreeze()
        finally:
            self.snapshotting.discard(plan.netns)

    # ---- reconcile -------------------------------------------------------------------------------------------
    def reconcile(self, live: Iterable[tuple[SliverSpec, dict[str, Any]]]) -> dict[str, list[str]]:
        """After a restart: adopt the objects of live slivers (re-creating what is missing, restoring
        started/stopped), remove every object with this deployment's prefix that belongs to none."""
        live = list(live)
        with self._lock:
            self.links.clear()
            self.enabled.clear()
            self.ports.clear()
            self.port_bridge.clear()
            self.trunks.clear()
            self.rack_trunks.clear()
            self._join_racks()
            self.node_slices.clear()
            self.capture_ports.clear()
            self.mirrored.clear()
            if self.ovs.running() and self.bridge in self.ovs.bridges():
                for name in self.ovs.mirrors(self.bridge):  # made again below for the live links that ask
                    if name.startswith(self.prefix + "-m"):
                        self.ovs.del_mirror(self.bridge, name)
            for spec, status in live:
                if spec.kind == "link":
                    plan = self._link_plan(spec, check=False)
                    if plan.vlan is not None:
                        self.links[plan.vlan] = plan
                        if status.get("state") == READY:
                            self.enabled.add(plan.vlan)
            nodes = [(spec, status, self._node_plan(spec)) for spec, status in live if spec.kind == "node"]
            for spec, _status, plan in nodes:
                self.node_slices[plan.netns] = self._owner(spec)
            for vlan in self.enabled:
                for port, _tags in self.links[vlan].uplinks:
                    self._trunk(port)
            keep = set().union(*(p.names() for _s, _st, p in nodes)) | set(self.bridges.values()) | {
                self.trunk_device(port) for lk in self.links.values() for port, _t in lk.uplinks} | {
                trunk_name(self.prefix, p) for a, _sa, b, _sb in self.layout.trunks for p in (a, b)}
            removed: list[str] = []
            if self.lxcpath.is_dir():
                for d in self.lxcpath.iterdir():
                    if NodeContainer(self.lxcpath, d.name).thaw():  # a snapshot cut before it could
                        log.info("netns reconcile thawed container %s (frozen by a cut CreateImage)", d.name)
                    if d.name not in keep:
                        self._machine_at(d.name).destroy()
                        self.datasets.release(d.name)
                        removed.append(f"container {d.name}")
            removed += [f"node disk {f}" for f in self._remove_layers(keep)]
            for ns in sorted(hostnet.namespaces()):
                if ns.startswith(self.prefix + "-") and ns not in keep:
                    self._relay_of(ns).remove()
                    kill_netns_processes(ns)
                    hostnet.del_namespace(ns)
                    removed.append(f"namespace {ns}")
            if self.nodes_dir.exists():
                for d in self.nodes_dir.iterdir():
                    if d.name not in keep:
                        self._relay_of(d.name).remove()
                        removed.append(f"node directory {d}")
            if hostnet.NETNS_ETC.exists():
                for d in hostnet.NETNS_ETC.glob(f"{self.prefix}-*"):
                    if d.name not in keep:
                        hostnet.del_namespace(d.name)
            for bridge in dict.fromkeys(self.bridges.values()):
                for port in self._ovs(bridge).ports(bridge):
                    if port not in keep:
                        self._ovs(bridge).del_port(bridge, port)
                        removed.append(f"port {port}")
            for name in hostnet.links():
                if owned(self.prefix, name) and name not in keep:
                    hostnet.del_link(name)
                    removed.append(f"veth {name}")
            live_owners = set(self.node_slices.values())
            for owner in self._owned_ranges():
                if owner not in live_owners:
                    self.uid_ranges.release(owner)
                    removed.append(f"uid range of {owner.split(' ', 1)[1]}")
            adopted = []
            for spec, status, plan in nodes:
                up = status.get("state") == READY
                index = self.uid_ranges.claim(self._owner(spec))
                self._build(plan, up=up)
                recorded = status.get("image")
                image = (self.images.get(recorded) or recorded) if recorded else self._image(spec)
                self._define(plan, image, index, self._limits(spec, plan), self._attach(spec, plan, index), spec)
                self._set_users(plan, accounts(spec.details.get("logins") or ()), running=False)
                self._relay(plan).ensure_forward(status.get("login_port"))
                self._public_forwards(spec, plan)
                self._capture_ports(spec, plan)
                self._node_services(spec, plan, status, up, restart=False, boot=False)
                adopted.append(plan.netns)
            self._push()
            if removed:
                log.info("netns reconcile removed %s", ", ".join(removed))
            return {"removed": removed, "adopted": adopted}

    def leftovers(self) -> list[str]:
        """Every host object with this deployment's prefix (tests: nothing may remain after delete)."""
        out = [f"namespace {ns}" for ns in hostnet.namespaces() if ns.startswith(self.prefix + "-")]
        bridges = set(self.bridges.values())
        out += [f"link {n}" for n in hostnet.links() if owned(self.prefix, n) and n not in bridges]
        for b in sorted(bridges):
            ovs = self._ovs(b)
            if ovs.running() and b in ovs.bridges():
                out += [f"port {p}" for p in ovs.ports(b)]
        if hostnet.NETNS_ETC.exists():
            out += [f"/etc/netns/{d.name}" for d in hostnet.NETNS_ETC.glob(f"{self.prefix}-*")]
        if self.nodes_dir.exists():
            out += [f"node directory {d}" for d in self.nodes_dir.iterdir()]
        if self.lxcpath.is_dir():
            out += [f"container {d.name}" for d in self.lxcpath.iterdir()]
        out += [f"node disk {f}" for f in self._layer_files()]
        out += [f"loop device {dev}" for f in self._layer_files() for dev in loop_devices(f)]
        out += [f"mount {m}" for m in mounts_under(self.lxcpath)]
        out += [f"cgroup {d}" for d in self.cgroups()]
        out += [f"uid range {i} ({owner})" for i, owner in self.uid_ranges.claims().items()
                if owner.startswith(self.prefix + " ")]
        out += [f"process {pid} ({cmd})" for pid, cmd in self.processes()]
        return out

    def cgroups(self) -> list[Path]:
        """This deployment's node cgroups on the host (each controller's slicex/<prefix>-* directories)."""
        root = Path("/sys/fs/cgroup")
        out: list[Path] = []
        for ctrl in [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []:
            for top in ("slicex", "slicex-monitor"):
                if (ctrl / top).is_dir():
                    out += sorted((ctrl / top).glob(f"{self.prefix}-*"))
        return out

    def processes(self) -> list[tuple[int, str]]:
        """This deployment's node processes (relays, lxc-attach and lxc monitors, and every process inside
        its containers), by their command lines and cgroups."""
        marks = (str(self.nodes_dir) + "/", f"--netns {self.prefix}-", str(self.lxcpath) + " ")
        inside = {pid for d in self.cgroups() for pid in cgroup_pids(d)}
        out = []
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            pid = int(p.name)
            if pid != os.getpid() and (pid in inside or (cmd and any(m in cmd + " " for m in marks))):
                out.append((pid, cmd[:120]))
        return out

    # ---- helpers ---------------------------------------------------------------------------------------------
    def _link_plan(self, spec: SliverSpec, check: bool = True) -> LinkPlan:
        return link_plan(spec.id, spec.client_id, spec.labels, spec.details, netem=self.netem or not check)

    def _node_plan(self, spec: SliverSpec) -> NodePlan:
        return node_plan(self.prefix, spec.id, spec.client_id, spec.labels, spec.details, self.links, self.layout)

    def _owner(self, spec: SliverSpec) -> str:
        """Who holds a node's uid range: its slice (every node of a slice shares one range, no other slice
        does); a sliver recorded before slices were named holds one of its own."""
        return f"{self.prefix} {spec.details.get('slice_urn') or spec.id}"

    def _owned_ranges(self) -> list[str]:
        return sorted({o for o in self.uid_ranges.claims().values() if o.startswith(self.prefix + " ")})

    def _image(self, spec: SliverSpec, recorded: str | None = None) -> NodeImage:
        """The catalogue image a node boots: the one it booted before (a restart), else its disk_image, else
        the default. One the catalogue lacks, or another user's private image, is refused naming those the
        slice's owner may boot."""
        wanted = recorded or image_name(str(spec.details.get("disk_image") or "")) or self.default_image
        owner = str(spec.details.get("owner") or "")
        img = self.images.get(wanted)
        if img is None or (not recorded and not may_use(img, owner)):  # another's private image: as if absent
            offered = ", ".join(i.name for i in self.images.list() if may_use(i, owner)) or "none: slicex image build"
            raise BadArgs(f"node {spec.client_id}: disk image {wanted} is not in this aggregate's catalogue "
                          f"(offered: {offered})")
        return img

    def _limits(self, spec: SliverSpec, plan: NodePlan) -> NodeLimits:
        return node_limits(spec.details, plan.netns, os.cpu_count() or 1, self.pids_max)

    def _lower(self, image: NodeImage | str, index: int) -> Path:
        """The image copy shifted into uid range `index` (made once, kept for the next slice holding the
        range: containers only ever write their own upper layer). Given only a name (a node adopted after
        its image left the catalogue), the copy it booted."""
        base = uid_base(index)
        holder = self.bases_dir / str(index)
        if isinstance(image, str):
            found = image_copies(holder, image)
            if not found:
                raise ServerError(f"image {image} is gone from the catalogue and from uid range {index}'s copies")
            return found[-1]
        lower = holder / f"{image.name}-{image.build_id}"
        if not lower.is_dir():
            holder.mkdir(parents=True, exist_ok=True)
            os.chown(holder, base, base)
            holder.chmod(0o700)  # only that range's root gets through: other slices' roots are other uids
            for old in image_copies(holder, image.name):  # earlier builds no node boots from any more
                if not self._booted_from(old):
                    shutil.rmtree(old, ignore_errors=True)
            link_copy(self.images.shifted(image, index, base), lower)  # shifted once per host, range and build
        return lower

    def _booted_from(self, lower: Path) -> bool:
        """Whether a node of this deployment has `lower` under its root (an owner may replace an image while
        nodes booted from the old build run)."""
        return any(NodeContainer(self.lxcpath, d.name, self.layers_dir).lower() == lower
                   for d in self.lxcpath.iterdir()) if self.lxcpath.is_dir() else False

    def _container(self, plan: NodePlan) -> NodeContainer:
        """The node's machine: its container, or its VM (a qemu-vm node)."""
        kind = NodeVM if plan.machine == "qemu" else NodeContainer
        return kind(self.lxcpath, plan.netns, self.layers_dir)

    def _machine_at(self, name: str) -> NodeContainer:
        """The machine whose directory is `lxcpath/<name>`, for a node no lease names."""
        return machine_at(self.lxcpath, name, self.layers_dir)

    def _check_vm(self, spec: SliverSpec) -> None:
        """Refuse at Provision what a qemu-vm node cannot do yet, and a host that cannot run one, saying why."""
        missing = qemu_missing()
        if missing:
            raise Unsupported(f"node {spec.client_id}: a qemu-vm node needs {', '.join(missing)} on the aggregate's "
                              f"host (scripts/system-deps.sh installs them)")
        for what, key in (("execute or install services", "services"), ("datasets (emulab:blockstore)", "blockstores")):
            if spec.details.get(key):
                raise BadArgs(f"node {spec.client_id}: a qemu-vm node has no {what} yet (container nodes do); "
                              f"run them over ssh after geni_start")

    def _vm_record(self, plan: NodePlan) -> dict[str, Any]:
        """What the manifest and the record say of a VM node's machine (nothing for a container)."""
        if plan.machine != "qemu":
            return {}
        meta = NodeVM(self.lxcpath, plan.netns, self.layers_dir).meta()
        return {"machine": "qemu", "accel": meta.get("accel", ""), "kernel": meta.get("kernel_version", "")}

    def _mount_host_files(self) -> None:
        """The tmpfs the host hands its nodes' files from (/run/slicex, LXC's init): a node's mount table names
        a bind mount's source by its path on its own file system, here `/<digest of the node's name>`, not a
        host path. Lost with the host's memory at a reboot: the restart's reconcile writes each node's again."""
        self.host_files.mkdir(exist_ok=True)
        if not os.path.ismount(self.host_files):
            hostnet.run(["mount", "-t", "tmpfs", "-o", HOST_TMPFS_OPTIONS, "slicex",
                         str(self.host_files)], check=True)

    def _layer_files(self) -> list[Path]:
        """This deployment's node disks (and half-made ones) in the layers directory."""
        if not self.layers_dir.is_dir():
            return []
        return sorted(f for f in self.layers_dir.iterdir()
                      if f.name.lstrip(".").startswith(self.prefix + "-") and ".img" in f.name)

    def _remove_layers(self, keep: set[str]) -> list[Path]:
        """Detach and remove this deployment's node disks whose node is not in `keep` (a crash between making a
        disk and recording its node, or in the middle of a delete); the files removed."""
        out = []
        for f in self._layer_files():
            if f.name.lstrip(".").split(".img", 1)[0] in keep:
                continue
            for point in [m for m in mounts_under(self.lxcpath) if m.name == "fs"
                          and m.parent.name == f.name.lstrip(".").split(".img", 1)[0]]:
                unmount(point)
            detach_loops(f)
            f.unlink(missing_ok=True)
            out.append(f)
        return out

    def _admit_disk(self, spec: SliverSpec, plan: NodePlan, limits: NodeLimits) -> None:
        """Refuse a node whose disk does not fit the layers' file system with what the disks already there may
        still write and the reserve (INSUFFICIENT, naming the numbers). Nodes of every deployment whose disks
        are in this directory are counted."""
        if self._container(plan).layer.exists():
            return  # made already (a retried create): its disk was admitted then
        self.layers_dir.mkdir(parents=True, exist_ok=True)
        st = os.statvfs(self.layers_dir)
        promised = 0
        for f in self.layers_dir.glob("*.img"):
            try:
                fs = f.stat()
            except OSError:
                continue
            promised += max(0, (raw_size(f) or fs.st_size) - fs.st_blocks * 512)  # a VM's qcow2: its disk's size
        why = disk_admission(limits.disk_gb, promised, st.f_bavail * st.f_frsize, self.layers_reserve_bytes)
        if why is not None:
            raise InsufficientDisk(f"node {spec.client_id}: {why}; delete nodes or ask for a smaller sliver type "
                                   f"(operators: slicex.yaml netns.layers_dir and layers_reserve_mb)")

    def _attach(self, spec: SliverSpec, plan: NodePlan, index: int) -> list[tuple[Path, str]]:
        """Mount the datasets the node's request names (made on first use, its owner's alone): (host path,
        mountpoint) of each, bound into the node."""
        out = []
        for doc in spec.details.get("blockstores") or ():
            b = Blockstore.from_doc(doc)
            path = self.datasets.attach(b.dataset, b.size_mb, str(spec.details.get("owner") or ""), uid_base(index),
                                        plan.netns, self.dataset_quota_mb, busy=lambda ns: ns in hostnet.namespaces())
            out.append((path, b.mountpoint))
        return out

    def _define(self, plan: NodePlan, image: NodeImage | str, index: int, limits: NodeLimits,
                mounts: list[tuple[Path, str]] | None = None, spec: SliverSpec | None = None) -> None:
        # a node that shares its namespace with its container: its root may bind port 22, its users ping (a VM's
        # QEMU, as the slice's uid, binds port 22 and the public ports it forwards into the guest)
        hostnet.exec_in(plan.netns, ["sysctl", "-q", "-w", "net.ipv4.ip_unprivileged_port_start=22",
                                     "net.ipv4.ping_group_range=0 2147483647"], check=True)
        if plan.machine == "qemu":
            self._define_vm(plan, image, index, limits, spec)
            return
        self._container(plan).define(plan.hostname, self._lower(image, index), uid_base(index), plan.netns, limits,
                                     mounts or ())

    def _define_vm(self, plan: NodePlan, image: NodeImage | str, index: int, limits: NodeLimits,
                   spec: SliverSpec | None) -> None:
        """A VM node's disk, taps and boot record. Its overlay is over a link to the VM form's base kept in the
        deployment (`bases/vm/<image>-<build>.qcow2`), so a rebuilt image never changes a disk's base under it."""
        name = image if isinstance(image, str) else image.name
        img = self.images.get(name)
        form = vm_form(img.rootfs.parent) if img is not None else None
        pinned_dir = self.bases_dir / "vm"
        pins = sorted(pinned_dir.glob(f"{name}-*.qcow2")) if pinned_dir.is_dir() else []
        if form is not None:
            pinned = pinned_dir / f"{name}-{form['build_id']}.qcow2"
            if not pinned.exists():
                pinned_dir.mkdir(parents=True, exist_ok=True)
                pinned_dir.chmod(0o700)
                tmp = pinned.with_name(pinned.name + ".tmp")
                tmp.unlink(missing_ok=True)
                try:
                    os.link(form["disk"], tmp)
                except OSError:  # another file system: a copy
                    shutil.copyfile(form["disk"], tmp)
                tmp.rename(pinned)
        elif pins:
            pinned = pins[-1]
        else:
            raise BadArgs(f"node {plan.client_id}: image {name} has no VM form on this host (`slicex image build "
                          f"{name}` makes it where QEMU is installed)")
        node = NodeVM(self.lxcpath, plan.netns, self.layers_dir)
        recorded = node.meta()
        if recorded and (node.dir / "lower").is_symlink():
            pinned = Path(os.readlink(node.dir / "lower"))  # a disk made before keeps its base
        if form is None:
            form = {k: recorded[v] for k, v in (("vmlinuz", "kernel"), ("initrd", "initrd"), ("cmdline", "cmdline"),
                                                ("kernel", "kernel_version"))} if recorded else None
            if form is None:
                raise BadArgs(f"node {plan.client_id}: image {name} has no VM form on this host")
        uid = uid_base(index)
        for i in plan.interfaces:
            tap = tap_name(i.ns_if)
            hostnet.add_tap(plan.netns, tap, uid)
            hostnet.join_redirect(plan.netns, tap, i.ns_if)
        forwards = [22] + [int(pp["port"]) for pp in ((spec.details.get("public_ports") or ()) if spec else ())]
        node.define_vm(plan.hostname, form, pinned, uid, plan.netns, limits,
                       [(tap_name(i.ns_if), i.mac, i.address) for i in plan.interfaces], forwards,
                       accel_of(self.vm_probe or {}))

    def _set_users(self, plan: NodePlan, accts: list[Account], running: bool) -> None:
        container = self._container(plan)
        uids = dict(assign_uids([(a.name, a.urn) for a in accts], container.users()))
        container.set_users([(a.name, uids[a.name], a.keys) for a in accts])
        if running:
            container.sync_users()

    def _build(self, plan: NodePlan, up: bool) -> None:
        """Make the node's network objects exist as planned (idempotent): namespace, veths, addresses, rates,
        ports."""
        hostnet.add_namespace(plan.netns, plan.hostname)
        for i in plan.interfaces:
            self._plug(plan, i, up)
        self._push()

    def _plug(self, plan: NodePlan, i: IfacePlan, up: bool) -> None:
        """One interface of a node: its veth pair, address, rate and switch port. The bridge end's token
        bucket goes on after the port is added: Open vSwitch removes a root qdisc already on an interface it
        adds as a port."""
        hostnet.add_veth(plan.netns, i.ns_if, i.host_if, i.mac)
        if plan.machine == "qemu":  # the guest holds the address; its tap is joined to this end (_define_vm)
            hostnet.no_ipv6(plan.netns, i.ns_if)
            if tap_name(i.ns_if) in hostnet.links(plan.netns):
                hostnet.join_redirect(plan.netns, tap_name(i.ns_if), i.ns_if)
        elif i.address:
            hostnet.set_address(plan.netns, i.ns_if, i.address)
        tbf = tbf_args(i.rate_kbps) if i.rate_kbps else None
        # the node's end: its link's rate, and its broadcast and multicast policed (a flood would take the shared
        # userspace switch's CPU from every slice: bench/broadcast.py)
        hostnet.shape_and_police(plan.netns, i.ns_if, tbf)
        hostnet.set_up(plan.netns, i.ns_if, up)
        # on its rack's switch (another host's namespace when that switch runs there); an interface on no link
        # is a port of no segment: no rule moves its frames (a mirror may copy to it)
        bridge = self.layout.bridge(self.prefix, i.switch)
        where = self._ns_of(bridge)
        if where is not None:
            hostnet.move_link(i.host_if, where)
        self.ports[i.host_if] = (self._ovs(bridge).add_port(bridge, i.host_if, i.vlan), i.vlan, i.mac)
        self.port_bridge[i.host_if] = bridge
        hostnet.shape(where, i.host_if, tbf)

    def _unplug(self, host_if: str) -> None:
        """One interface of a node gone: its switch port and its veth pair (deleting one end takes both, in the
        namespace of the switch it is on)."""
        bridge = self.port_bridge.pop(host_if, self.bridge)
        self._ovs(bridge).del_port(bridge, host_if)
        self.ports.pop(host_if, None)
        hostnet.del_link(host_if, self._ns_of(bridge))

    def _rewire(self, spec: SliverSpec, status: dict[str, Any]) -> dict[str, Any]:
        """An Update changed a running node's interfaces (slice_manager/updater.py): ports of links it left go,
        ports of new links come (into the namespace its container runs in, up when the node is), an
        interface whose link, address or rate changed is made again; the node itself keeps running."""
        plan = self._node_plan(spec)
        if plan.netns not in hostnet.namespaces():
            raise ServerError(f"node {spec.client_id}: its namespace {plan.netns} is gone from the host")
        before = dict(status.get("interfaces") or {})
        now_on = {i.client_id: i for i in plan.interfaces}
        up = status.get("state") == READY
        for cid, old in before.items():
            new = now_on.get(cid)
            if new is None or (old.get("vlan"), old.get("address"), old.get("rate_kbps")) != \
                    (new.vlan, new.address, new.rate_kbps):
                host_if = veth_names(self.prefix, spec.id, cid)[1]
                self._unplug(host_if)
        for i in plan.interfaces:
            old = before.get(i.client_id)
            if old is None or (old.get("vlan"), old.get("address"), old.get("rate_kbps")) != \
                    (i.vlan, i.address, i.rate_kbps):
                self._plug(plan, i, up)
        if up:
            slow = [i.ns_if for i in plan.interfaces if not hostnet.wait_carrier(plan.netns, i.ns_if)]
            if slow:
                raise ServerError(f"node {spec.client_id}: interfaces {', '.join(slow)} of namespace {plan.netns} "
                                  f"did not come up")
        self._push()
        return {**status, "error": "", "interfaces": {i.client_id: {"device": i.ns_if, "address": i.address,
                                                                    "vlan": i.vlan, "rate_kbps": i.rate_kbps}
                                                      for i in plan.interfaces}}

    def trunk_device(self, port: str) -> str:
        """The host device of an external port's trunk: on a shared switch named from the switch and the port
        (both sides of a cable know both names), else `trunk_name(prefix, port)`, which the operator makes."""
        if self.shared_switch:
            return shared_trunk_name(str(self.ovs.run_dir), port)
        return trunk_name(self.prefix, port)

    def _trunk(self, port: str) -> int:
        """The OpenFlow port of the trunk toward another aggregate, added to the bridge the first time a
        stitched link uses it. On a shared switch the veth pair to the remote port's end is made here when it
        does not exist yet (the other aggregate adds its end to its own bridge); otherwise the device must
        exist (the operator's cable, or `hostnet.add_trunk`)."""
        key = port.lower()
        if key not in self.trunks:
            dev = self.trunk_device(port)
            if dev not in hostnet.links():
                remote = self.cables.get(key)
                if not (self.shared_switch and remote):
                    how = ("the substrate file names no remote port for it" if self.shared_switch else
                           f"make it (an interface named {dev}) or share one switch (netns: switch_dir)")
                    raise ServerError(f"stitched port {port}: its trunk device {dev} does not exist on this host; "
                                      f"{how} (docs/stitching.md)")
                hostnet.add_trunk(dev, shared_trunk_name(str(self.ovs.run_dir), remote))
            self.trunks[key] = self.ovs.add_port(self.layout.bridge(self.prefix, self.layout.cabled.get(port, "")), dev)
        return self.trunks[key]

    def _rack_trunk_devices(self) -> list[str]:
        """The veth ends of the trunks this driver makes (both switches here); a cable to a switch on another
        host is the lab's (or the operator's)."""
        return [trunk_name(self.prefix, p) for a, sa, b, sb in self.layout.trunks for p in (a, b)
                if not ({self.layout.bridge(self.prefix, sa), self.layout.bridge(self.prefix, sb)} & set(self.remote))]

    def _ovs(self, bridge: str) -> OvsSwitch:
        return self.remote.get(bridge, self.ovs)

    def _ns_of(self, bridge: str) -> str | None:
        return self.remote[bridge].netns if bridge in self.remote else None

    def _join_racks(self) -> None:
        """Each trunk between two of the substrate's switches: between two switches here a veth pair made here
        (the deployment's, removed with its bridges); to a switch on another host the cable must exist, its
        ends named `trunk_name(prefix, port)` in each switch's namespace (`lab.cable`, docs/lab.md)."""
        for a, sw_a, b, sw_b in self.layout.trunks:
            ends = [(port, self.layout.bridge(self.prefix, sw), trunk_name(self.prefix, port))
                    for port, sw in ((a, sw_a), (b, sw_b))]
            if not {bridge for _p, bridge, _d in ends} & set(self.remote):
                hostnet.add_trunk(ends[0][2], ends[1][2])
            for port, bridge, dev in ends:
                if dev not in hostnet.links(self._ns_of(bridge)):
                    raise ServerError(f"trunk port {port}: its cable end {dev} does not exist on the host of bridge "
                                      f"{bridge} ({self._ns_of(bridge)}); make the cable between the racks' hosts "
                                      f"(docs/lab.md, lab.cable)")
                self.rack_trunks[port] = self._ovs(bridge).add_port(bridge, dev)

    def _dpid(self, bridge: str) -> int:
        return self.dpid if bridge == self.bridge else self.dpid + list(dict.fromkeys(self.bridges.values())).index(bridge)

    def _relay(self, plan: NodePlan) -> LoginRelay:
        return LoginRelay(self.nodes_dir, plan.netns, plan.hostname, self.login_address, self.login_ports)

    def _counters(self, plan: NodePlan) -> dict[str, dict[str, int]]:
        """interface client_id -> the switch's counters of its port (those the switch has)."""
        out = {}
        with self._lock:
            for i in plan.interfaces:
                if i.host_if in self.ports:
                    try:
                        out[i.client_id] = self._ovs(self.port_bridge.get(i.host_if, self.bridge)).port_counters(i.host_if)
                    except ServerError:
                        continue
        return out

    def _capture_ports(self, spec: SliverSpec, plan: NodePlan) -> None:
        """Note the node's interfaces on no link: ports a mirror of its slice's links may copy to."""
        for i in plan.interfaces:
            if i.vlan is None:
                self.capture_ports[(str(spec.details.get("slice_urn") or ""), i.client_id)] = i.host_if

    def _mirror(self) -> None:
        """Make the switch's mirrors those of the started links that ask for one and whose capture port exists
        (changing only what differs)."""
        here = {name: port for name, port in self.ports.items() if self.port_bridge.get(name, self.bridge) == self.bridge}
        want = wanted_mirrors(self.prefix, self.enabled, self.links, here, self.capture_ports)  # the first switch's
        for name in [n for n in self.mirrored if n not in want]:
            self.ovs.del_mirror(self.bridge, name)
            del self.mirrored[name]
        for name, (copied, out) in want.items():
            if self.mirrored.get(name) != (copied, out):
                self.ovs.set_mirror(self.bridge, name, copied, out)
                self.mirrored[name] = (copied, out)

    def _public_forwards(self, spec: SliverSpec, plan: NodePlan) -> None:
        """The relays of the node's public ports (the broker chose them: no other sliver holds one)."""
        relay = self._relay(plan)
        for pp in spec.details.get("public_ports") or ():
            relay.ensure_forward(int(pp["public_port"]), int(pp["port"]), self.public_address,
                                 public_relay(int(pp["port"])))

    def _relay_of(self, ns: str) -> LoginRelay:
        return LoginRelay(self.nodes_dir, ns, ns, self.login_address)

    def _services(self, plan: NodePlan) -> NodeServices:
        return NodeServices(self._container(plan))

    def _node_services(self, spec: SliverSpec, plan: NodePlan, status: dict[str, Any], up: bool, restart: bool,
                       boot: bool) -> None:
        """The container (its sshd) and execute services follow the node: booted with it (services run at
        each boot, not when a restarted aggregate adopts a running node), stopped with it."""
        if plan.machine == "qemu":  # the guest boots on its own: Status says configuring until its sshd answers
            vm = NodeVM(self.lxcpath, plan.netns, self.layers_dir)
            if not up or restart:
                vm.stop()
            if up and not vm.running():
                vm.start()
            return
        container, services = self._container(plan), self._services(plan)
        if not up or restart:
            services.stop()
            container.stop()
        if up:
            container.start()
            self._wait_sshd(spec, plan, container)
            if boot:
                accts = accounts(spec.details.get("logins") or ())
                installs = installs_of(spec.details, spec.client_id, self.install_sources)
                if installs:
                    install_all(container, installs, accts[0].name if accts else "nobody", spec.client_id,
                                self.install_max_bytes)
                services.start(services_of(spec.details, spec.client_id), accts[0] if accts else None)

    def _wait_sshd(self, spec: SliverSpec, plan: NodePlan, container: NodeContainer, timeout: float = 20.0) -> None:
        """Until the node's sshd listens on port 22 of its namespace (a fresh node makes its host key first)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ":22 " in hostnet.exec_in(plan.netns, ["ss", "-Hltn", "sport = :22"], timeout=5).stdout + " ":
                return
            if not container.running():
                break
            time.sleep(0.05)
        raise ServerError(f"node {spec.client_id}: its sshd did not listen within {timeout:.0f} s (container "
                          f"{plan.netns} {'runs' if container.running() else 'stopped'}; see "
                          f"{container.dir / 'lxc.log'})")

    def _teardown(self, plan: NodePlan) -> None:
        self._container(plan).destroy()  # every process of the node, its layers and cgroups
        self.datasets.release(plan.netns)  # its datasets stay, unmounted
        self._relay(plan).remove()
        kill_netns_processes(plan.netns)  # nothing may hold the namespace
        for i in plan.interfaces:
            bridge = self.layout.bridge(self.prefix, i.switch)
            self._ovs(bridge).del_port(bridge, i.host_if)
            self.ports.pop(i.host_if, None)
            self.port_bridge.pop(i.host_if, None)
        self.capture_ports = {k: v for k, v in self.capture_ports.items()
                              if v not in {i.host_if for i in plan.interfaces}}
        hostnet.del_namespace(plan.netns)
        for i in plan.interfaces:  # the namespace took its ends and their peers; a half-made pair may remain
            hostnet.del_link(i.host_if)
        owner = self.node_slices.pop(plan.netns, None)
        if owner is not None and owner not in self.node_slices.values():
            self.uid_ranges.release(owner)  # the slice's last node here: its range is free for another slice
        self._push()

    def _push(self) -> None:
        """Install the rules of every started segment on every bridge (the controller sends only the
        difference). A link between racks is a segment on each of its switches' bridges, under that switch's
        tag, joined over the trunk ports it crosses with the tags negotiated on their wires."""
        for switch, bridge in self.bridges.items():
            segments = []
            for vlan in sorted(self.enabled):
                link = self.links[vlan]
                ports = tuple(AccessPort(ofport, mac) for name, (ofport, v, mac) in self.ports.items()
                              if v == vlan and self.port_bridge.get(name, self.bridge) == bridge)
                uplinks = tuple(Uplink(self.trunks[p.lower()], tags) for p, tags in link.uplinks
                                if p.lower() in self.trunks and self.layout.bridge(
                                    self.prefix, self.layout.cabled.get(p, "")) == bridge)
                uplinks += tuple(Uplink(self.rack_trunks[p], tags) for p, tags in link.trunk_hops(switch)
                                 if p in self.rack_trunks)
                if ports or uplinks:
                    segments.append(Segment(link.tag_on(switch) or vlan, ports, uplinks))
            self.remote_flows.get(bridge, self.flows).apply(bridge, self._dpid(bridge), segment_flows(segments))
        self._mirror()

