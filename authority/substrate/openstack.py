"""The OpenStack substrate driver: slivers as resources of an OpenStack cloud, through openstacksdk.

The edge of authority/substrate/openstack_plan.py: it applies the plan through an `openstack.connection.Connection`
(`openstack.connect(cloud=NAME)`, NAME an entry of the operator's clouds.yaml) and holds no policy.

- A link is a Neutron network with a VLAN segment (the broker's tag on the operator's physical network) and
  one subnet, administratively down until geni_start (geni_stop takes it down again); a capacity becomes a
  QoS policy with an egress bandwidth-limit rule on the network.
- A node is its ports (one per interface, with the manifest's MAC and address, in the slice's security
  group) and keypair at Provision, and a Nova server on those ports at its first geni_start; later
  geni_start / geni_stop / geni_restart are the server's start / stop / reboot.
- Status asks the cloud: the server's and ports' states map to GENI operational states (BUILD configuring,
  ACTIVE ready, SHUTOFF notready, ERROR failed with Nova's fault message).
- Everything is named `<prefix>-<hash of the sliver id>` and tagged with the deployment (Neutron tags, Nova
  metadata), so creating twice finds the first, destroy twice finds nothing, and `reconcile` removes what no
  live lease holds.

Tested against a live all-in-one OpenStack Zed (scripts/openstack-aio.sh; tests/integration/
test_openstack_aio.py), and for speed against a fake Keystone, Nova, Neutron and Glance answering from JSON
fixtures (tests/fixtures/openstack/). What the live cloud showed: Nova deletes servers asynchronously
(`leftovers` waits), Neutron refuses to delete a network with ports on it (409: one Delete closes nodes before
their links), and Nova's own words say why a server cannot be created."""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from authority.actor import no_storage
from authority.substrate.openstack_plan import (
    NOTREADY,
    READY,
    Found,
    NetworkPlan,
    NodePlan,
    OpenStackSettings,
    being_deleted,
    deployment_tag,
    network_plan,
    network_state,
    node_plan,
    node_state,
    orphans,
    slice_key,
    sliver_tag,
)
from protocol.messages import SliverSpec
from slicex.errors import BadArgs, GeniError, ServerError, Unsupported

log = logging.getLogger("slicex.openstack")

DESCRIPTION = ("openstack substrate: each node is a Nova server on Neutron ports, each link a Neutron network with "
               "a VLAN segment on the operator's physical network (openstacksdk)")


def connect(cloud: str) -> Any:
    """A Connection to the clouds.yaml entry `cloud`; Unsupported when openstacksdk is not installed."""
    try:
        import openstack
    except ImportError as exc:
        raise Unsupported(f"the openstack substrate needs openstacksdk ({exc}); pip install 'slicex[openstack]'") \
            from None
    return openstack.connect(cloud=cloud)


def _or_none(find: Callable[[], Any]) -> Any:
    """A find_* answer, None when the cloud has no such resource (openstacksdk 6 drops ignore_missing=True)."""
    from openstack import exceptions

    try:
        return find()
    except exceptions.NotFoundException:
        return None


def _server_doc(server: Any) -> dict[str, Any]:
    """The fields of an openstacksdk Server the plan reads."""
    return {"id": server.id, "status": server.status, "fault": server.fault, "task_state": server.task_state}


class OpenStackDriver:
    """SubstrateDriver over one OpenStack project. `start` before use (connects and checks the cloud)."""

    def __init__(self, settings: OpenStackSettings, connector: Callable[[str], Any] = connect):
        self.settings = settings
        self.prefix = settings.prefix
        self.description = f"{DESCRIPTION} (cloud {settings.cloud}, physical network {settings.physical_network})"
        self._connector = connector
        self.conn: Any = None
        self.links: dict[int, NetworkPlan] = {}  # live links by VLAN: what a node's ports attach to
        self.poll_s = 0.5  # between looks at what the cloud does asynchronously (server deletion)
        self._lock = threading.RLock()

    # ---- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Connect and authenticate; refuse to start, saying why, when the cloud cannot be reached."""
        try:
            self.conn = self._connector(self.settings.cloud)
            self.conn.authorize()
            next(iter(self.conn.network.networks(limit=1)), None)
        except GeniError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure to reach the cloud stops `slicex up` with its reason
            raise Unsupported(f"the openstack substrate cannot use cloud {self.settings.cloud!r} (clouds.yaml): "
                              f"{type(exc).__name__}: {exc}") from None

    def shutdown(self, remove: bool = False) -> None:
        """Nothing runs on this host; slivers stay in the cloud while their leases live."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    # ---- the SubstrateDriver seam ----------------------------------------------------------------------------
    def create(self, spec: SliverSpec, now: datetime) -> dict[str, Any]:
        no_storage(spec, self.description)  # Cinder volumes are not wired (docs/substrate-openstack.md)
        with self._lock:
            if spec.kind == "link":
                plan = self._network_plan(spec)
                other = self.links.get(plan.vlan)
                if other is not None and other.sliver_id != spec.id:
                    raise ServerError(f"link {spec.client_id}: VLAN {plan.vlan} is already the segment of sliver "
                                      f"{other.sliver_id}")
                net_id = self._ensure_network(plan)
                self.links[plan.vlan] = plan
                return {"state": NOTREADY, "vlan": plan.vlan, "network_id": net_id}
            if spec.kind != "node":
                raise BadArgs(f"the openstack substrate has no {spec.kind} slivers")
            plan = self._node_plan(spec)
            flavor = _or_none(lambda: self.conn.compute.find_flavor(plan.flavor, ignore_missing=False))
            if flavor is None:
                raise BadArgs(f"node {spec.client_id}: flavor {plan.flavor!r} does not exist in cloud "
                              f"{self.settings.cloud}; map the sliver type under openstack.flavors")
            image = _or_none(lambda: self.conn.image.find_image(plan.image, ignore_missing=False))
            if image is None:
                raise BadArgs(f"node {spec.client_id}: image {plan.image!r} does not exist in cloud "
                              f"{self.settings.cloud}; map the disk image under openstack.images")
            try:
                sg = self._ensure_security_group(plan)
                self._ensure_keypair(plan)
                ports = {p.name: self._ensure_port(plan, p, sg) for p in plan.ports}
            except Exception:
                self._teardown_node(plan)
                raise
            return {"state": NOTREADY, "server_id": None, "flavor_id": flavor.id, "image_id": image.id,
                    "ports": ports, "security_group": sg, "started": False}

    def modify(self, spec: SliverSpec, status: dict[str, Any], action: str, now: datetime) -> dict[str, Any]:
        with self._lock:
            if action == "geni_update_users":
                # Nova cannot change a server's keypair or user-data after boot: the new keys reach a node only
                # when it is created. Say so rather than pretend.
                raise Unsupported("geni_update_users: the openstack substrate cannot change the users of a server "
                                  "that exists (Nova keeps its keypair and user-data from boot)")
            if action not in ("geni_start", "geni_stop", "geni_restart"):
                raise Unsupported(f"{action} is not an action of the openstack substrate")
            if spec.kind == "link":
                plan = self._network_plan(spec)
                self.links.setdefault(plan.vlan, plan)
                net = self._find_network(plan.name)
                if net is None:
                    raise ServerError(f"link {spec.client_id}: its network {plan.name} is gone from the cloud")
                self.conn.network.update_network(net, admin_state_up=action != "geni_stop")
                return {**status, "state": NOTREADY if action == "geni_stop" else READY, "error": ""}
            plan = self._node_plan(spec)
            server = self._find_server(plan.name)
            if action == "geni_stop":
                if server is not None and str(server.status).upper() != "SHUTOFF":
                    self.conn.compute.stop_server(server)
                return {**status, "state": NOTREADY, "error": ""}
            if server is None:
                server = self._create_server(plan, status)
            elif action == "geni_restart" and str(server.status).upper() == "ACTIVE":
                self.conn.compute.reboot_server(server, "SOFT")
            elif str(server.status).upper() == "SHUTOFF":
                self.conn.compute.start_server(server)
            return {**status, "state": READY, "server_id": server.id, "started": True, "error": ""}

    def destroy(self, spec: SliverSpec, status: dict[str, Any], now: datetime) -> None:
        """Delete every resource of the sliver; asked twice, the second time finds nothing to delete."""
        with self._lock:
            if spec.kind == "link":
                plan = self._network_plan(spec, check=False)
                self._teardown_network(plan)
                if (lk := self.links.get(plan.vlan)) is not None and lk.sliver_id == spec.id:
                    del self.links[plan.vlan]
                return
            self._teardown_node(self._node_plan(spec, strict=False))

    def status(self, spec: SliverSpec, status: dict[str, Any], now: datetime) -> tuple[str, str]:
        """The cloud's view of the sliver, as a GENI operational state and error."""
        if spec.kind == "link":
            plan = self._network_plan(spec, check=False)
            net = self._find_network(plan.name)
            return network_state(None if net is None else {"id": net.id, "status": net.status,
                                                           "is_admin_state_up": net.is_admin_state_up},
                                 spec.client_id)
        plan = self._node_plan(spec, strict=False)
        tag = sliver_tag(self.prefix, spec.id)
        ports = [{"id": p.id, "name": p.name, "status": p.status} for p in self.conn.network.ports(tags=tag)]
        server = self._find_server(plan.name)
        if server is not None and str(server.status).upper() == "ERROR" and not server.fault:
            server = self.conn.compute.get_server(server.id)  # Nova lists no fault; the server's own page has it
        doc = None if server is None else _server_doc(server)
        return node_state(doc, ports, len(plan.ports), bool(status.get("started")), spec.client_id)

    def view(self, spec: SliverSpec, status: dict[str, Any]) -> dict[str, Any]:
        """Where users log in: the node's address on the management network, port 22 (nothing without one)."""
        if spec.kind != "node" or not self.settings.management_network:
            return {}
        addr = next((p.get("address") for p in (status.get("ports") or {}).values() if p.get("management")), "")
        if not addr:
            return {}
        return {"logins": [{"username": lg.get("username", ""), "hostname": addr, "port": 22}
                           for lg in spec.details.get("logins") or ()]}

    # ---- reconcile -------------------------------------------------------------------------------------------
    def reconcile(self, live: Iterable[tuple[SliverSpec, dict[str, Any]]]) -> dict[str, list[str]]:
        """After a restart: remember the live links, and delete every resource of this deployment that no live
        lease holds (servers, ports, QoS policies, networks, security groups, keypairs)."""
        live = list(live)
        with self._lock:
            self.links.clear()
            for spec, _ in live:
                if spec.kind == "link":
                    plan = self._network_plan(spec, check=False)
                    self.links[plan.vlan] = plan
            slices = [slice_key(spec.details, spec.id) for spec, _ in live if spec.kind == "node"]
            removed = []
            for f in orphans(self.prefix, self._found(), [spec.id for spec, _ in live], slices):
                self._delete(f)
                removed.append(f"{f.kind} {f.name or f.id}")
            if removed:
                log.info("openstack reconcile removed %s", ", ".join(removed))
            return {"removed": removed, "adopted": [spec.id for spec, _ in live]}

    def leftovers(self, timeout_s: float = 60.0) -> list[str]:
        """Every resource of this deployment in the cloud (tests: nothing may remain after delete). Servers Nova
        is still deleting are waited for, up to `timeout_s`: right after a destroy they are listed still."""
        deadline = time.monotonic() + timeout_s
        while any(being_deleted(_server_doc(s)) for s in self._servers()) and time.monotonic() < deadline:
            time.sleep(self.poll_s)
        return [f"{f.kind} {f.name or f.id}" for f in self._found()]

    # ---- helpers ---------------------------------------------------------------------------------------------
    def _network_plan(self, spec: SliverSpec, check: bool = True) -> NetworkPlan:
        details = spec.details if check else {k: v for k, v in spec.details.items()
                                              if k not in ("latency_ms", "packet_loss")}
        return network_plan(self.settings, spec.id, spec.client_id, spec.labels, details)

    def _node_plan(self, spec: SliverSpec, strict: bool = True) -> NodePlan:
        """The node's plan; `strict=False` (teardown, status) tolerates links this process no longer knows,
        since only the names of the node's own resources matter then."""
        if strict:
            return node_plan(self.settings, spec.id, spec.client_id, spec.labels, spec.details, self.links)
        details = {**spec.details, "interfaces": {c: i for c, i in (spec.details.get("interfaces") or {}).items()
                                                  if any(c in lk.interface_refs for lk in self.links.values())}}
        try:
            return node_plan(self.settings, spec.id, spec.client_id, spec.labels, details, self.links)
        except BadArgs:
            return node_plan(self.settings, spec.id, spec.client_id, (), {**details, "interfaces": {}}, {})

    def _find_network(self, name: str) -> Any:
        return next(iter(self.conn.network.networks(name=name, tags=deployment_tag(self.prefix))), None)

    def _find_server(self, name: str) -> Any:
        """Our server of this name (Nova's name filter is a regular expression: anchor it; check the tag)."""
        dep = deployment_tag(self.prefix)
        return next((s for s in self.conn.compute.servers(name=f"^{name}$")
                     if s.name == name and (s.metadata or {}).get("slicex") == dep), None)

    def _ensure_network(self, plan: NetworkPlan) -> str:
        net = self._find_network(plan.name)
        if net is None:
            net = self.conn.network.create_network(**plan.network_body())
            self.conn.network.set_tags(net, list(plan.tags))
        if plan.cidr and not any(True for _ in self.conn.network.subnets(network_id=net.id)):
            sub = self.conn.network.create_subnet(**plan.subnet_body(net.id))
            self.conn.network.set_tags(sub, list(plan.tags))
        if plan.capacity_kbps and not net.qos_policy_id:
            qos = next(iter(self.conn.network.qos_policies(name=plan.name)), None)
            if qos is None:
                qos = self.conn.network.create_qos_policy(name=plan.name, description=f"slicex link {plan.client_id}")
                self.conn.network.set_tags(qos, list(plan.tags))
                self.conn.network.create_qos_bandwidth_limit_rule(qos, max_kbps=plan.capacity_kbps,
                                                                  max_burst_kbps=max(plan.capacity_kbps // 10, 1),
                                                                  direction="egress")
            self.conn.network.update_network(net, qos_policy_id=qos.id)
        return str(net.id)

    def _ensure_security_group(self, plan: NodePlan) -> str:
        """The slice's group: ssh from anywhere, everything from the slice's own nodes."""
        sg = next(iter(self.conn.network.security_groups(name=plan.security_group,
                                                         tags=deployment_tag(self.prefix))), None)
        if sg is not None:
            return str(sg.id)
        sg = self.conn.network.create_security_group(name=plan.security_group,
                                                     description="slicex slice: ssh in, all within the slice")
        self.conn.network.set_tags(sg, [deployment_tag(self.prefix), plan.tags[2]])
        for ethertype in ("IPv4", "IPv6"):
            self.conn.network.create_security_group_rule(security_group_id=sg.id, direction="ingress",
                                                         ethertype=ethertype, protocol="tcp", port_range_min=22,
                                                         port_range_max=22)
            self.conn.network.create_security_group_rule(security_group_id=sg.id, direction="ingress",
                                                         ethertype=ethertype, remote_group_id=sg.id)
        return str(sg.id)

    def _ensure_keypair(self, plan: NodePlan) -> None:
        if plan.keypair_key and _or_none(lambda: self.conn.compute.find_keypair(plan.name,
                                                                                 ignore_missing=False)) is None:
            self.conn.compute.create_keypair(name=plan.name, public_key=plan.keypair_key)

    def _ensure_port(self, plan: NodePlan, port: Any, sg: str) -> dict[str, Any]:
        found = next(iter(self.conn.network.ports(name=port.name, tags=deployment_tag(self.prefix))), None)
        if found is None:
            net = (self._find_network(port.network) if not port.management
                   else _or_none(lambda: self.conn.network.find_network(port.network, ignore_missing=False)))
            if net is None:
                raise ServerError(f"node {plan.client_id}: network {port.network} of interface "
                                  f"{port.client_id or 'management'} does not exist in cloud {self.settings.cloud}")
            body: dict[str, Any] = {"name": port.name, "network_id": net.id, "security_group_ids": [sg],
                                    "description": f"slicex {plan.client_id}:{port.client_id or 'management'}"}
            if port.mac:
                body["mac_address"] = port.mac
            if port.address:
                subnet = next(iter(self.conn.network.subnets(network_id=net.id)), None)
                body["fixed_ips"] = [{"ip_address": port.address, **({"subnet_id": subnet.id} if subnet else {})}]
            found = self.conn.network.create_port(**body)
            self.conn.network.set_tags(found, list(plan.tags))
        ips = found.fixed_ips or []
        return {"id": found.id, "interface": port.client_id, "mac": found.mac_address,
                "address": ips[0].get("ip_address", "") if ips else "", "management": port.management}

    def _create_server(self, plan: NodePlan, status: dict[str, Any]) -> Any:
        ports = status.get("ports") or {}
        missing = [p.name for p in plan.ports if p.name not in ports]
        if missing:
            raise ServerError(f"node {plan.client_id}: its ports {', '.join(missing)} were never created")
        body: dict[str, Any] = {
            "name": plan.name, "flavor_id": status["flavor_id"], "image_id": status["image_id"],
            "networks": [{"port": ports[p.name]["id"]} for p in plan.ports] or "none",
            "user_data": base64.b64encode(plan.user_data.encode()).decode(), "metadata": dict(plan.metadata)}
        if plan.keypair_key:
            body["key_name"] = plan.name
        from openstack import exceptions

        try:
            return self.conn.compute.create_server(**body)
        except exceptions.HttpException as exc:  # e.g. 400 "Can not find requested image": Nova's words
            raise ServerError(f"node {plan.client_id}: Nova refused to create its server ({exc.status_code}): "
                              f"{exc.details or exc.message}") from None

    def _teardown_node(self, plan: NodePlan) -> None:
        dep = deployment_tag(self.prefix)
        server = self._find_server(plan.name)
        if server is not None:
            self.conn.compute.delete_server(server, ignore_missing=True)
        for p in self.conn.network.ports(tags=sliver_tag(self.prefix, plan.sliver_id)):
            self.conn.network.delete_port(p, ignore_missing=True)
        if _or_none(lambda: self.conn.compute.find_keypair(plan.name, ignore_missing=False)) is not None:
            self.conn.compute.delete_keypair(plan.name, ignore_missing=True)
        stag = plan.tags[2]
        if not any(True for _ in self.conn.network.ports(tags=stag)):  # the slice's last node: its group goes
            for sg in self.conn.network.security_groups(name=plan.security_group, tags=dep):
                self.conn.network.delete_security_group(sg, ignore_missing=True)

    def _teardown_network(self, plan: NetworkPlan) -> None:
        from openstack import exceptions

        net = self._find_network(plan.name)
        if net is not None:
            try:
                self.conn.network.delete_network(net, ignore_missing=True)  # its subnet goes with it
            except exceptions.ConflictException as exc:  # Neutron's 409 NetworkInUse: a node's ports are on it
                ports = sorted(p.name or p.id for p in self.conn.network.ports(network_id=net.id))
                raise ServerError(f"link {plan.client_id}: Neutron refuses to delete network {plan.name} while "
                                  f"ports are on it ({', '.join(ports) or 'none listed'}: "
                                  f"{exc.details or exc.message}); delete its nodes first, the close will be "
                                  f"retried") from None
        for q in self.conn.network.qos_policies(name=plan.name):
            self.conn.network.delete_qos_policy(q, ignore_missing=True)

    def _found(self) -> list[Found]:
        """This deployment's resources in the project: tagged ones, our servers, our keypairs."""
        dep = deployment_tag(self.prefix)
        net = self.conn.network
        out = [Found("server", s.id, s.name, frozenset((s.metadata or {}).values())) for s in self._servers()]
        for kind, listing in (("port", net.ports), ("qos_policy", net.qos_policies), ("network", net.networks),
                              ("security_group", net.security_groups)):
            out += [Found(kind, r.id, r.name, frozenset(r.tags or ())) for r in listing(tags=dep)]
        out += [Found("keypair", k.name, k.name) for k in self.conn.compute.keypairs()]
        return [f for f in out if f.kind != "keypair" or f.name.startswith(self.prefix + "-")]

    def _servers(self) -> list[Any]:
        """This deployment's servers (by the metadata every one of them carries)."""
        dep = deployment_tag(self.prefix)
        return [s for s in self.conn.compute.servers() if (s.metadata or {}).get("slicex") == dep]

    def _delete(self, f: Found) -> None:
        c, n = self.conn.compute, self.conn.network
        {"server": lambda: c.delete_server(f.id, ignore_missing=True),
         "port": lambda: n.delete_port(f.id, ignore_missing=True),
         "qos_policy": lambda: n.delete_qos_policy(f.id, ignore_missing=True),
         "network": lambda: n.delete_network(f.id, ignore_missing=True),
         "security_group": lambda: n.delete_security_group(f.id, ignore_missing=True),
         "keypair": lambda: c.delete_keypair(f.name, ignore_missing=True)}[f.kind]()
