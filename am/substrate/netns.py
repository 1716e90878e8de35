"""The netns substrate driver: real slivers on one Linux host.

- A node sliver is a network namespace (loopback up, /etc/netns/<ns>/hostname) with one veth pair per
  interface: one end inside with the node's MAC and address, the other a port of the deployment's private
  Open vSwitch bridge (userspace datapath). Provisioning creates it with its interfaces down
  (geni_notready); geni_start brings them up, geni_stop down, geni_restart both.
- A link or LAN sliver is a segment of the bridge keyed by the VLAN tag the broker chose: geni_start installs
  its OpenFlow rules (am/substrate/flows.py, pushed by the os-ken controller or ovs-ofctl), geni_stop removes
  them. Ports of different segments never exchange a frame, so slices are isolated.
- Link capacity is a token bucket on both ends of every interface on the link (egress of the namespace end
  and of the bridge end). Latency and loss need netem; where the kernel lacks it they are refused.
- Login (am/substrate/login.py): each node has its own sshd inside its namespace, started by geni_start,
  reached through a port on the host (127.0.0.1 by default) with the slice users' keys (geni_users at
  Provision, geni_update_users after); the manifest's login service names that host and port. Post-boot
  `execute` services (am/substrate/execute.py) run at every start, as the node's user; the node is
  configuring while they run and failed, naming the command, if one exits non-zero.

Every object name starts with the deployment's prefix (netns_plan.py), so `reconcile` can remove what belongs
to no live lease after a crash and adopt the rest. Status checks the real objects: a node whose namespace
vanished is geni_failed, never ready."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from am.authority import SliverSpec
from am.substrate import hostnet
from am.substrate.execute import NodeServices, services_of, verdict
from am.substrate.flows import AccessPort, Segment, Uplink, segment_flows
from am.substrate.login import NodeLogin, accounts, kill_netns_processes
from am.substrate.netns_plan import (
    LinkPlan,
    NodePlan,
    check_prefix,
    link_plan,
    node_plan,
    owned,
    shared_trunk_name,
    tbf_args,
    trunk_name,
)
from am.substrate.openflow import FlowProgrammer, OfctlProgrammer, OsKenController, osken_available
from am.substrate.ovs import OvsSwitch, default_run_dir
from slicex.errors import BadArgs, GeniError, ServerError, Unsupported

log = logging.getLogger("slicex.netns")

DESCRIPTION = ("netns substrate: each node is a Linux network namespace on this host, each link a VLAN segment of "
               "a private Open vSwitch bridge programmed over OpenFlow, capacity enforced with tc, an sshd per "
               "node on a host port; no VM: nodes share the host's kernel and file system")
NEEDED = ("root", "ip", "tc", "ethtool", "netns", "veth", "tbf")
READY, NOTREADY, FAILED = "geni_ready", "geni_notready", "geni_failed"


class NetnsDriver:
    """SubstrateDriver over namespaces, veths, tc and a private OVS. `start` before use, `shutdown` after."""

    def __init__(self, prefix: str, run_dir: Path | None = None, controller: str = "auto", timeout: float = 30.0,
                 login_address: str = "127.0.0.1", login_host: str | None = None, switch_dir: Path | None = None,
                 cables: Mapping[str, str] | None = None):
        """`switch_dir`: the run directory of an Open vSwitch shared with other deployments on this host (one
        bridge each; slicex.yaml `netns: {switch_dir: ...}`). Two ovs-vswitchd with the userspace datapath
        cannot run on one host: the second cannot create its `ovs-netdev` tap ("Device or resource busy") and
        its bridges never come up. `cables`: external port URN -> the remote port URN (the substrate's
        external links); on a shared switch the driver joins two aggregates' bridges itself, with a veth pair
        named from both ports (`shared_trunk_name`), the first time a stitched link uses the cable."""
        self.prefix = check_prefix(prefix)
        self.bridge = f"{prefix}-br"
        self.dpid = int(hashlib.sha256(prefix.encode()).hexdigest()[:12], 16)
        self.run_dir = Path(run_dir or default_run_dir(prefix))
        self.shared_switch = switch_dir is not None
        self.ovs = OvsSwitch(switch_dir or self.run_dir, timeout=timeout)
        self.cables = {k.lower(): v for k, v in (cables or {}).items()}
        if controller not in ("auto", "os-ken", "ovs-ofctl"):
            raise BadArgs(f"netns controller {controller!r}: auto, os-ken or ovs-ofctl")
        why = osken_available() if controller != "ovs-ofctl" else "not asked for"
        if controller == "os-ken" and why:
            raise Unsupported(f"the os-ken controller cannot be imported here ({why}); pip install os-ken, or use "
                              f"controller ovs-ofctl")
        self.flows: FlowProgrammer = (OsKenController(self.run_dir, timeout) if why is None
                                      else OfctlProgrammer(self.ovs))
        self.description = f"{DESCRIPTION} (OpenFlow rules from {self.flows.name})"
        self.links: dict[int, LinkPlan] = {}  # live link segments by VLAN
        self.enabled: set[int] = set()  # segments started (their rules installed)
        self.ports: dict[str, tuple[int, int, str]] = {}  # bridge port -> (ofport, vlan, mac)
        self.netem = False
        # per-node login and services (readable by the nodes' users: the switch's run directory is root-only)
        self.nodes_dir = Path(f"{self.run_dir}-nodes")
        self.trunks: dict[str, int] = {}  # external port URN (lower case) -> ofport of its trunk device
        self.login_address = login_address  # where the login ports listen
        self.login_host = login_host or login_address  # what the manifest tells users to connect to
        self._lock = threading.RLock()

    # ---- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Check the host can do it, start (or adopt) the private switch and the controller."""
        caps = hostnet.capabilities()
        missing = [f"{k}: {caps.get(k, 'not probed')}" for k in NEEDED if caps.get(k) != "ok"]
        if missing:
            raise Unsupported("the netns substrate cannot run on this host: " + "; ".join(missing))
        self.netem = caps.get("netem") == "ok"
        self.ovs.start()
        self.flows.start()
        self.ovs.ensure_bridge(self.bridge, self.dpid, self.flows.controller_target())
        with self._lock:
            self._push()

    def shutdown(self, remove: bool = False) -> None:
        """Stop the controller and the switch (slivers' namespaces stay: their leases are live; the next
        start reconciles). `remove` also deletes the run directory (tests, operators uninstalling)."""
        self.flows.stop()
        if remove and self.ovs.running():
            self.ovs.vsctl("--if-exists", "del-br", self.bridge)
        if self.shared_switch:  # the switch is the host's: its owner stops it; this deployment only its bridge
            if remove:
                shutil.rmtree(self.run_dir, ignore_errors=True)
        else:
            self.ovs.stop(remove=remove)
        if remove:
            shutil.rmtree(self.nodes_dir, ignore_errors=True)  # node directories went with their slivers
            hostnet.del_link(self.bridge)  # the netdev datapath's tap for the bridge may outlive the daemon

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
            services_of(spec.details, spec.client_id)  # refuse an unknown shell now, not at boot
            accts = accounts(spec.details.get("logins") or ())
            try:
                self._build(plan, up=False)
                login = self._login(plan)
                login.prepare(accts)
                port = login.ensure_forward(None)
            except GeniError:
                self._teardown(plan)
                raise
            return {"state": NOTREADY, "netns": plan.netns, "login_port": port,
                    "interfaces": {i.client_id: {"device": i.ns_if, "address": i.address, "vlan": i.vlan,
                                                 "rate_kbps": i.rate_kbps} for i in plan.interfaces}}

    def modify(self, spec: SliverSpec, status: dict[str, Any], action: str, now: datetime) -> dict[str, Any]:
        with self._lock:
            if action == "geni_update_users":
                if spec.kind == "node":  # the authority merged the new users into the spec's logins
                    self._login(self._node_plan(spec)).set_accounts(accounts(spec.details.get("logins") or ()))
                return {**status, "error": ""}
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
                if up:
                    slow = [i.ns_if for i in plan.interfaces if not hostnet.wait_carrier(plan.netns, i.ns_if)]
                    if slow:
                        raise ServerError(f"node {spec.client_id}: interfaces {', '.join(slow)} of namespace "
                                          f"{plan.netns} did not come up")
                self._node_services(spec, plan, status, up, restart=action == "geni_restart", boot=True)
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
            self._teardown(self._node_plan(spec))

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
        if state == READY:
            down = [d["device"] for d in status.get("interfaces", {}).values() if not hostnet.is_up(ns, d["device"])]
            if down:
                return FAILED, f"interfaces {', '.join(down)} of namespace {ns} are down"
            plan = self._node_plan(spec)
            login = self._login(plan)
            if not login.sshd_running():
                return FAILED, f"the sshd of node {spec.client_id} (namespace {ns}) is not running"
            if status.get("login_port") and not login.forward_running():
                return FAILED, (f"the login port {self.login_address}:{status['login_port']} of node "
                                f"{spec.client_id} has no relay to its sshd")
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
        (this host's login port, not port 22 of a name nobody resolves) and its execute services' results."""
        if spec.kind != "node":
            return {}
        out: dict[str, Any] = {}
        port = status.get("login_port")
        if port:
            out["logins"] = [{"username": a.name, "hostname": self.login_host, "port": port}
                             for a in accounts(spec.details.get("logins") or ())]
        services = services_of(spec.details, spec.client_id)
        if services:
            out["execute"] = self._services(self._node_plan(spec)).results(services)
        return out

    # ---- reconcile -------------------------------------------------------------------------------------------
    def reconcile(self, live: Iterable[tuple[SliverSpec, dict[str, Any]]]) -> dict[str, list[str]]:
        """After a restart: adopt the objects of live slivers (re-creating what is missing, restoring
        started/stopped), remove every object with this deployment's prefix that belongs to none."""
        live = list(live)
        with self._lock:
            self.links.clear()
            self.enabled.clear()
            self.ports.clear()
            self.trunks.clear()
            for spec, status in live:
                if spec.kind == "link":
                    plan = self._link_plan(spec, check=False)
                    if plan.vlan is not None:
                        self.links[plan.vlan] = plan
                        if status.get("state") == READY:
                            self.enabled.add(plan.vlan)
            plans: list[tuple[NodePlan, bool]] = [(self._node_plan(spec), status.get("state") == READY)
                                                  for spec, status in live if spec.kind == "node"]
            for vlan in self.enabled:
                for port, _tags in self.links[vlan].uplinks:
                    self._trunk(port)
            keep = set().union(*(p.names() for p, _ in plans)) | {self.bridge} | {
                self.trunk_device(port) for lk in self.links.values() for port, _t in lk.uplinks}
            removed: list[str] = []
            for ns in sorted(hostnet.namespaces()):
                if ns.startswith(self.prefix + "-") and ns not in keep:
                    self._login_of(ns).remove()
                    hostnet.del_namespace(ns)
                    removed.append(f"namespace {ns}")
            if self.nodes_dir.exists():
                for d in self.nodes_dir.iterdir():
                    if d.name not in keep:
                        self._login_of(d.name).remove()
                        removed.append(f"node directory {d}")
            if hostnet.NETNS_ETC.exists():
                for d in hostnet.NETNS_ETC.glob(f"{self.prefix}-*"):
                    if d.name not in keep:
                        hostnet.del_namespace(d.name)
            for port in self.ovs.ports(self.bridge):
                if port not in keep:
                    self.ovs.del_port(self.bridge, port)
                    removed.append(f"port {port}")
            for name in hostnet.links():
                if owned(self.prefix, name) and name not in keep:
                    hostnet.del_link(name)
                    removed.append(f"veth {name}")
            adopted = []
            records = {self._node_plan(spec).netns: (spec, status) for spec, status in live if spec.kind == "node"}
            for plan, up in plans:
                self._build(plan, up=up)
                spec, status = records[plan.netns]
                login = self._login(plan)
                login.prepare(accounts(spec.details.get("logins") or ()))
                login.ensure_forward(status.get("login_port"))
                self._node_services(spec, plan, status, up, restart=False, boot=False)
                adopted.append(plan.netns)
            self._push()
            if removed:
                log.info("netns reconcile removed %s", ", ".join(removed))
            return {"removed": removed, "adopted": adopted}

    def leftovers(self) -> list[str]:
        """Every host object with this deployment's prefix (tests: nothing may remain after delete)."""
        out = [f"namespace {ns}" for ns in hostnet.namespaces() if ns.startswith(self.prefix + "-")]
        out += [f"link {n}" for n in hostnet.links() if owned(self.prefix, n) and n != self.bridge]
        if self.ovs.running() and self.bridge in self.ovs.bridges():
            out += [f"port {p}" for p in self.ovs.ports(self.bridge)]
        if hostnet.NETNS_ETC.exists():
            out += [f"/etc/netns/{d.name}" for d in hostnet.NETNS_ETC.glob(f"{self.prefix}-*")]
        if self.nodes_dir.exists():
            out += [f"node directory {d}" for d in self.nodes_dir.iterdir()]
        out += [f"process {pid} ({cmd})" for pid, cmd in self.processes()]
        return out

    def processes(self) -> list[tuple[int, str]]:
        """This deployment's node processes (sshd, login relays, services), by their command lines."""
        marks = (str(self.nodes_dir) + "/", f"--netns {self.prefix}-")
        out = []
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            if cmd and any(m in cmd for m in marks) and int(p.name) != os.getpid():
                out.append((int(p.name), cmd[:120]))
        return out

    # ---- helpers ---------------------------------------------------------------------------------------------
    def _link_plan(self, spec: SliverSpec, check: bool = True) -> LinkPlan:
        return link_plan(spec.id, spec.client_id, spec.labels, spec.details, netem=self.netem or not check)

    def _node_plan(self, spec: SliverSpec) -> NodePlan:
        return node_plan(self.prefix, spec.id, spec.client_id, spec.labels, spec.details, self.links)

    def _build(self, plan: NodePlan, up: bool) -> None:
        """Make the node's objects exist as planned (idempotent): namespace, veths, addresses, rates, ports."""
        hostnet.add_namespace(plan.netns, plan.hostname)
        for i in plan.interfaces:
            hostnet.add_veth(plan.netns, i.ns_if, i.host_if, i.mac)
            if i.address:
                hostnet.set_address(plan.netns, i.ns_if, i.address)
            tbf = tbf_args(i.rate_kbps) if i.rate_kbps else None
            hostnet.shape(plan.netns, i.ns_if, tbf)
            hostnet.shape(None, i.host_if, tbf)
            hostnet.set_up(plan.netns, i.ns_if, up)
            if i.vlan is not None:
                self.ports[i.host_if] = (self.ovs.add_port(self.bridge, i.host_if, i.vlan), i.vlan, i.mac)
        self._push()

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
            self.trunks[key] = self.ovs.add_port(self.bridge, dev)
        return self.trunks[key]

    def _login(self, plan: NodePlan) -> NodeLogin:
        return NodeLogin(self.nodes_dir, plan.netns, plan.hostname, self.login_address)

    def _login_of(self, ns: str) -> NodeLogin:
        return NodeLogin(self.nodes_dir, ns, ns, self.login_address)

    def _services(self, plan: NodePlan) -> NodeServices:
        return NodeServices(self.nodes_dir, plan.netns, plan.hostname)

    def _node_services(self, spec: SliverSpec, plan: NodePlan, status: dict[str, Any], up: bool, restart: bool,
                       boot: bool) -> None:
        """sshd and execute services follow the node: started with it (services run at each boot, not when
        a restarted aggregate adopts a running node), stopped with it."""
        login, services = self._login(plan), self._services(plan)
        if not up or restart:
            services.stop()
            login.stop_sshd()
        if up:
            login.start_sshd()
            if boot:
                accts = accounts(spec.details.get("logins") or ())
                services.start(services_of(spec.details, spec.client_id), accts[0] if accts else None)

    def _teardown(self, plan: NodePlan) -> None:
        self._login(plan).remove()  # sshd, sessions, relay and services: nothing may hold the namespace
        kill_netns_processes(plan.netns)
        for i in plan.interfaces:
            self.ovs.del_port(self.bridge, i.host_if)
            self.ports.pop(i.host_if, None)
        hostnet.del_namespace(plan.netns)
        for i in plan.interfaces:  # the namespace took its ends and their peers; a half-made pair may remain
            hostnet.del_link(i.host_if)
        self._push()

    def _push(self) -> None:
        """Install the rules of every started segment (the controller sends only the difference)."""
        segments = []
        for vlan in sorted(self.enabled):
            ports = tuple(AccessPort(ofport, mac) for ofport, v, mac in self.ports.values() if v == vlan)
            uplinks = tuple(Uplink(self.trunks[p.lower()], tags) for p, tags in self.links[vlan].uplinks
                            if p.lower() in self.trunks)
            segments.append(Segment(vlan, ports, uplinks))
        self.flows.apply(self.bridge, self.dpid, segment_flows(segments))
