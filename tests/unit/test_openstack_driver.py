"""The OpenStack driver's edge (authority/substrate/openstack.py) through openstacksdk's real request code, against a
fake Keystone/Nova/Neutron/Glance served by requests-mock from tests/fixtures/openstack/ (written from the API
reference, not recorded from a live cloud; see the README there)."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

pytest.importorskip("openstack")
requests_mock = pytest.importorskip("requests_mock")

from authority.substrate.openstack import OpenStackDriver  # noqa: E402
from authority.substrate.openstack_plan import (  # noqa: E402
    OpenStackSettings,
    deployment_tag,
    resource_name,
    sliver_tag,
)
from protocol.messages import SliverSpec  # noqa: E402
from slicex.errors import Unsupported  # noqa: E402

# openstacksdk's warnings about its own deprecations
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]
FIX = Path(__file__).resolve().parents[1] / "fixtures" / "openstack"
NOW = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
PREFIX = "xab12"


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIX / name).read_text())


class FakeCloud:
    """Keystone, Nova, Neutron and Glance as one requests-mock handler: keeps what is created, answers in the
    fixtures' shapes, records every call (method, path, JSON body)."""

    NEUTRON = {"networks": ("network", "network.json"), "subnets": ("subnet", "subnet.json"),
               "ports": ("port", "port.json"), "security-groups": ("security_group", "security-group.json"),
               "security-group-rules": ("security_group_rule", "security-group-rule.json"),
               "qos/policies": ("policy", "qos-policy.json")}

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.neutron: dict[str, dict[str, dict]] = {k: {} for k in self.NEUTRON}
        self.servers: dict[str, dict] = {}
        self.keypairs: dict[str, dict] = {}
        self.flavors = {"m1.small": self._make("flavor.json", "flavor", "f-small", "m1.small")}
        self.images = {"ubuntu-22.04": self._make("image.json", None, "i-ubuntu", "ubuntu-22.04")}
        self.server_status_on_create = "BUILD"
        # Nova answers DELETE at once and removes the server later (the all-in-one cloud listed it, task_state
        # "deleting", for ~1 s): a deleted server stays listed for this many more server listings
        self.listings_until_deleted = 2
        self._deleting: dict[str, int] = {}

    @staticmethod
    def _make(fx: str, key: str | None, rid: str, name: str) -> dict:
        doc = fixture(fx)
        body = doc[key] if key else doc
        body.update(id=rid, name=name)
        return body

    # ---- dispatch --------------------------------------------------------------------------------------------
    def __call__(self, request: Any, context: Any) -> Any:
        url = urlparse(request.url)
        body = request.json() if request.body else None
        path = re.sub(r"/+", "/", url.path)
        query = {k: v if len(v) > 1 else v[0] for k, v in parse_qs(url.query).items()}
        if request.method != "GET" or url.hostname != "identity.example.com":
            self.calls.append((request.method, f"{url.hostname.split('.')[0]}:{path}", body))
        context.headers["Content-Type"] = "application/json"
        host = url.hostname.split(".")[0]
        handler = getattr(self, f"_{host}")
        out = handler(request.method, path, query, body, context)
        if context.status_code == 204:
            return None
        return out

    def _identity(self, method, path, query, body, context):
        if path in ("/", "/v3", "/v3/") and method == "GET":
            return fixture("keystone-discovery.json")
        if path == "/v3/auth/tokens" and method == "POST":
            context.status_code = 201
            context.headers["X-Subject-Token"] = "gAAAAA-fake-token"
            return fixture("keystone-token.json")
        context.status_code = 404
        return {"error": {"code": 404, "message": path}}

    def _image(self, method, path, query, body, context):
        if path in ("/", "/v2/", "/v2"):
            return fixture("image-version.json")
        m = re.fullmatch(r"/v2/images/([^/]+)", path)
        if m:
            img = next((i for i in self.images.values() if i["id"] == m.group(1)), None)
            if img is None:
                context.status_code = 404
                return {"message": "not found"}
            return img
        if path == "/v2/images":
            found = [i for i in self.images.values() if "name" not in query or i["name"] == query["name"]]
            return {"images": found, "first": "/v2/images", "schema": "/v2/schemas/images"}
        context.status_code = 404
        return {}

    def _compute(self, method, path, query, body, context):
        p = path.removeprefix("/v2.1")
        if p in ("", "/"):
            return fixture("compute-version.json") if path == "/" else {"version": fixture("compute-version.json")
                                                                        ["versions"][1]}
        if p == "/flavors/detail":
            return {"flavors": list(self.flavors.values())}
        if m := re.fullmatch(r"/flavors/([^/]+)", p):
            f = next((f for f in self.flavors.values() if f["id"] == m.group(1)), None)
            if f is None:
                context.status_code = 404
                return {"itemNotFound": {"code": 404, "message": "Flavor could not be found."}}
            return {"flavor": f}
        if p == "/os-keypairs":
            if method == "POST":
                kp = fixture("keypair.json")["keypair"]
                kp.update(name=body["keypair"]["name"], public_key=body["keypair"]["public_key"])
                self.keypairs[kp["name"]] = kp
                return {"keypair": kp}
            return {"keypairs": [{"keypair": k} for k in self.keypairs.values()]}
        if m := re.fullmatch(r"/os-keypairs/([^/]+)", p):
            kp = self.keypairs.get(m.group(1))
            if kp is None:
                context.status_code = 404
                return {"itemNotFound": {"code": 404, "message": f"Keypair {m.group(1)} not found."}}
            if method == "DELETE":
                del self.keypairs[m.group(1)]
                context.status_code = 202
                return {}
            return {"keypair": kp}
        if p == "/servers" and method == "POST":
            s = fixture("server.json")["server"]
            req = body["server"]
            sid = "s-" + uuid.uuid4().hex[:8]
            s.update(id=sid, name=req["name"], metadata=req.get("metadata", {}), key_name=req.get("key_name"),
                     status=self.server_status_on_create)
            s["image"]["id"] = req.get("imageRef")
            self.servers[sid] = s
            context.status_code = 202
            return {"server": {"id": sid, "links": [], "OS-DCF:diskConfig": "AUTO", "security_groups": [],
                               "adminPass": "x"}}
        if p in ("/servers", "/servers/detail"):
            self._finish_deletions()
            found = list(self.servers.values())
            if "name" in query:
                found = [s for s in found if re.search(query["name"], s["name"])]
            # as Nova Zed answered on the all-in-one cloud: a listing carries no fault, the server's own page does
            return {"servers": [{k: v for k, v in s.items() if k != "fault"} for s in found]}
        if m := re.fullmatch(r"/servers/([^/]+)(/action)?", p):
            s = self.servers.get(m.group(1))
            if s is None:
                context.status_code = 404
                return {"itemNotFound": {"code": 404, "message": "Instance could not be found."}}
            if method == "DELETE":
                s["OS-EXT-STS:task_state"] = "deleting"
                self._deleting.setdefault(s["id"], self.listings_until_deleted)
                context.status_code = 204
                return None
            if m.group(2):
                action = next(iter(body))
                s["status"] = {"os-stop": "SHUTOFF", "os-start": "ACTIVE", "reboot": "ACTIVE"}[action]
                context.status_code = 202
                return None
            return {"server": s}
        context.status_code = 404
        return {}

    def _finish_deletions(self) -> None:
        for sid in list(self._deleting):
            self._deleting[sid] -= 1
            if self._deleting[sid] < 0:
                del self._deleting[sid]
                self.servers.pop(sid, None)

    def _network(self, method, path, query, body, context):
        if path in ("/", "/v2.0/", "/v2.0"):
            return fixture("network-versions.json")
        p = path.removeprefix("/v2.0")
        if m := re.fullmatch(r"/(.+?)/([^/]+)/tags", p):
            kind = {"policies": "qos/policies"}.get(m.group(1), m.group(1))  # the tag API's name for QoS policies
            res = self.neutron[kind][m.group(2)]
            res["tags"] = list(body["tags"])
            return {"tags": res["tags"]}
        if m := re.fullmatch(r"/qos/policies/([^/]+)/bandwidth_limit_rules", p):
            rule = fixture("qos-bandwidth-limit-rule.json")["bandwidth_limit_rule"]
            rule.update(body["bandwidth_limit_rule"], id="r-" + uuid.uuid4().hex[:8])
            self.neutron["qos/policies"][m.group(1)]["rules"].append(rule)
            context.status_code = 201
            return {"bandwidth_limit_rule": rule}
        kind = next((k for k in sorted(self.NEUTRON, key=len, reverse=True)
                     if p == f"/{k}" or p.startswith(f"/{k}/")), None)
        if kind is None:
            context.status_code = 404
            return {"NeutronError": {"type": "HTTPNotFound", "message": p}}
        key, fx = self.NEUTRON[kind]
        store = self.neutron[kind]
        rid = p.removeprefix(f"/{kind}").strip("/")
        if not rid:
            if method == "POST":
                res = fixture(fx)[key]
                res.update(body[key], id=f"{kind[:3]}-{uuid.uuid4().hex[:8]}")
                if kind == "networks":
                    self._network_created(res)
                if kind == "ports":
                    self._port_created(res, context)
                    if context.status_code == 409:
                        return res
                if kind == "subnets":
                    self.neutron["networks"][res["network_id"]]["subnets"].append(res["id"])
                store[res["id"]] = res
                context.status_code = 201
                return {key: res}
            return {f"{key}s" if key != "policy" else "policies": [r for r in store.values() if self._matches(r, query)]}
        res = store.get(rid)
        if res is None:
            context.status_code = 404
            return {"NeutronError": {"type": f"{key}NotFound", "message": f"{key} {rid} could not be found."}}
        if method == "DELETE":
            users = [n["id"] for n in self.neutron["networks"].values() if n.get("qos_policy_id") == rid]
            if kind == "qos/policies" and users:  # Neutron's QosPolicyInUse, as the all-in-one cloud answered
                context.status_code = 409
                return {"NeutronError": {"type": "QosPolicyInUse", "message": f"QoS Policy {rid} is used by "
                                         f"network {users[0]}.", "detail": ""}}
            in_use = [pt["id"] for pt in self.neutron["ports"].values() if pt["network_id"] == rid]
            if kind == "networks" and in_use:  # Neutron Zed's words, as the all-in-one cloud answered
                context.status_code = 409
                return {"NeutronError": {"type": "NetworkInUse", "message": f"Unable to complete operation on "
                                         f"network {rid}. There are one or more ports still in use on the network, "
                                         f"id for these ports is: {', '.join(in_use)}.", "detail": ""}}
            del store[rid]
            if kind == "networks":
                for sid in res["subnets"]:
                    self.neutron["subnets"].pop(sid, None)
            if kind == "security-groups":  # Neutron deletes a group's rules with it
                rules = self.neutron["security-group-rules"]
                for r in [r for r in rules.values() if r["security_group_id"] == rid]:
                    del rules[r["id"]]
            context.status_code = 204
            return None
        if method == "PUT":
            res.update(body[key])
        return {key: res}

    @staticmethod
    def _network_created(res: dict) -> None:
        res["status"] = "ACTIVE"
        res["subnets"] = []

    def _port_created(self, res: dict, context: Any) -> None:
        res["security_groups"] = res.pop("security_groups", [])
        if not res.get("mac_address"):
            res["mac_address"] = "fa:16:3e:00:00:01"
        for ip in res.get("fixed_ips") or []:
            ip.setdefault("subnet_id", next(iter(self.neutron["networks"][res["network_id"]]["subnets"]), ""))

    @staticmethod
    def _matches(res: dict, query: dict) -> bool:
        for k, v in query.items():
            if k == "tags":
                if not set([v] if isinstance(v, str) else v) <= set(res.get("tags", [])):
                    return False
            elif k in ("limit", "fields"):
                continue
            elif str(res.get(k)) != v:
                return False
        return True

    def mutations(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p, _ in self.calls if m != "GET"]


@pytest.fixture
def cloud(tmp_path, monkeypatch):
    (tmp_path / "clouds.yaml").write_text(
        "clouds:\n  testcloud:\n    auth:\n      auth_url: https://identity.example.com\n      username: slicex\n"
        "      password: secret\n      project_name: slicex\n      user_domain_name: Default\n"
        "      project_domain_name: Default\n    region_name: RegionOne\n    identity_api_version: 3\n")
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(tmp_path / "clouds.yaml"))
    for var in [v for v in __import__("os").environ if v.startswith("OS_") and v != "OS_CLIENT_CONFIG_FILE"]:
        monkeypatch.delenv(var)
    fake = FakeCloud()
    with requests_mock.Mocker() as m:
        m.register_uri(requests_mock.ANY, re.compile(r"https?://[a-z]+\.example\.com.*"), json=fake)
        yield fake


def settings(**kw) -> OpenStackSettings:
    return OpenStackSettings("testcloud", "physnet1", {"XOSmall": "m1.small"}, {"ubuntu": "ubuntu-22.04"},
                             prefix=PREFIX, **kw)


@pytest.fixture
def driver(cloud):
    d = OpenStackDriver(settings())
    d.poll_s = 0.0
    d.start()
    cloud.calls.clear()
    return d


def link(sliver="urn:lan0", vlan=1000, cap=0) -> SliverSpec:
    return SliverSpec(sliver, "link", "lan0", ("vlan:sw:1000",), (("vlan", vlan),),
                      {"subnet": "10.10.0", "interface_refs": ["n1:if0", "n2:if0"], "capacity_kbps": cap})


def node(name: str, sliver: str | None = None, vlan=1000) -> SliverSpec:
    return SliverSpec(sliver or f"urn:{name}", "node", name, (), (("vlan", vlan),),
                      {"sliver_type": "XOSmall", "vm_size": "XOSmall", "disk_image": "urn:publicid:IDN+x+image+ubuntu",
                       "hostname": f"{name}.demo.slicex.local",
                       "logins": [{"username": "alice", "keys": ["ssh-ed25519 AAAAC3alice alice@x"]}],
                       "interfaces": {f"{name}:if0": {"ip": "", "netmask": ""}}})


def provision(d: OpenStackDriver) -> dict[str, dict]:
    out = {"lan0": d.create(link(), NOW)}
    for n in ("n1", "n2"):
        out[n] = d.create(node(n), NOW)
    return out


def test_provisioning_a_two_node_lan_makes_a_vlan_network_subnet_ports_and_keypairs_in_order(driver, cloud):
    provision(driver)
    net_id = next(iter(cloud.neutron["networks"]))
    sg_id = next(iter(cloud.neutron["security-groups"]))
    subnet_id = next(iter(cloud.neutron["subnets"]))
    ports = {p["name"]: p for p in cloud.neutron["ports"].values()}
    p1, p2 = (next(p for p in ports.values() if p["description"].endswith(f"n{i}:n{i}:if0")) for i in (1, 2))
    assert cloud.mutations() == [
        ("POST", "network:/v2.0/networks"), ("PUT", f"network:/v2.0/networks/{net_id}/tags"),
        ("POST", "network:/v2.0/subnets"), ("PUT", f"network:/v2.0/subnets/{subnet_id}/tags"),
        # n1: the slice's security group (ssh in, everything from the group, v4 and v6), keypair, port
        ("POST", "network:/v2.0/security-groups"), ("PUT", f"network:/v2.0/security-groups/{sg_id}/tags"),
        *[("POST", "network:/v2.0/security-group-rules")] * 4,
        ("POST", "compute:/v2.1/os-keypairs"),
        ("POST", "network:/v2.0/ports"), ("PUT", f"network:/v2.0/ports/{p1['id']}/tags"),
        # n2: the same slice: its group is reused
        ("POST", "compute:/v2.1/os-keypairs"),
        ("POST", "network:/v2.0/ports"), ("PUT", f"network:/v2.0/ports/{p2['id']}/tags"),
    ]
    body = next(b for m, p, b in cloud.calls if p == "network:/v2.0/networks" and m == "POST")["network"]
    assert body["provider:network_type"] == "vlan"
    assert body["provider:physical_network"] == "physnet1"
    assert body["provider:segmentation_id"] == 1000
    assert body["admin_state_up"] is False
    subnet = cloud.neutron["subnets"][subnet_id]
    assert (subnet["cidr"], subnet["enable_dhcp"], subnet["gateway_ip"]) == ("10.10.0.0/24", False, None)
    assert p1["fixed_ips"] == [{"ip_address": "10.10.0.1", "subnet_id": subnet_id}]
    assert p2["fixed_ips"][0]["ip_address"] == "10.10.0.2"
    from slicex.inventory import mac_for
    assert p1["mac_address"] == mac_for("urn:n1", "n1:if0")
    assert p1["security_groups"] == [sg_id] and p1["network_id"] == net_id
    assert {deployment_tag(PREFIX), sliver_tag(PREFIX, "urn:n1")} <= set(p1["tags"])
    assert cloud.keypairs[next(iter(cloud.keypairs))]["public_key"] == "ssh-ed25519 AAAAC3alice alice@x"


def test_geni_start_boots_a_server_on_the_ports_with_the_keypair_and_users(driver, cloud):
    recs = provision(driver)
    cloud.calls.clear()
    driver.modify(link(), recs["lan0"], "geni_start", NOW)
    out = driver.modify(node("n1"), recs["n1"], "geni_start", NOW)
    net_id = next(iter(cloud.neutron["networks"]))
    assert cloud.mutations() == [("PUT", f"network:/v2.0/networks/{net_id}"), ("POST", "compute:/v2.1/servers")]
    server = next(b for m, p, b in cloud.calls if p == "compute:/v2.1/servers" and m == "POST")["server"]
    port1 = recs["n1"]["ports"]
    assert server["networks"] == [{"port": v["id"]} for v in port1.values()]
    assert server["flavorRef"] == "f-small" and server["imageRef"] == "i-ubuntu"
    assert server["key_name"] == resource_name(PREFIX, "urn:n1") and server["key_name"] in cloud.keypairs
    import base64
    user_data = base64.b64decode(server["user_data"]).decode()
    assert "hostname: n1" in user_data and "ssh-ed25519 AAAAC3alice alice@x" in user_data
    assert server["metadata"]["slicex"] == deployment_tag(PREFIX)
    assert out["started"] and out["server_id"] in cloud.servers


def test_status_follows_the_server_build_active_shutoff_error(driver, cloud):
    recs = provision(driver)
    spec = node("n1")
    assert driver.status(spec, recs["n1"], NOW) == ("geni_notready", "")
    recs["n1"] = driver.modify(spec, recs["n1"], "geni_start", NOW)
    server = cloud.servers[recs["n1"]["server_id"]]
    assert driver.status(spec, recs["n1"], NOW) == ("geni_configuring", "")  # BUILD
    server["status"] = "ACTIVE"
    for p in cloud.neutron["ports"].values():
        p["status"] = "ACTIVE"
    assert driver.status(spec, recs["n1"], NOW) == ("geni_ready", "")
    server["status"] = "SHUTOFF"
    assert driver.status(spec, recs["n1"], NOW) == ("geni_notready", "")
    server.update(status="ERROR", fault={"code": 500, "message": "No valid host was found."})
    state, error = driver.status(spec, recs["n1"], NOW)
    assert state == "geni_failed" and "No valid host was found" in error
    del cloud.servers[server["id"]]
    state, error = driver.status(spec, recs["n1"], NOW)
    assert state == "geni_failed" and "gone" in error


def test_link_state_is_the_networks_admin_state(driver, cloud):
    recs = provision(driver)
    assert driver.status(link(), recs["lan0"], NOW) == ("geni_notready", "")
    driver.modify(link(), recs["lan0"], "geni_start", NOW)
    assert driver.status(link(), recs["lan0"], NOW) == ("geni_ready", "")
    driver.modify(link(), recs["lan0"], "geni_stop", NOW)
    assert driver.status(link(), recs["lan0"], NOW) == ("geni_notready", "")


def test_stop_start_restart_are_server_stop_start_reboot(driver, cloud):
    recs = provision(driver)
    spec = node("n1")
    rec = driver.modify(spec, recs["n1"], "geni_start", NOW)
    sid = rec["server_id"]
    cloud.servers[sid]["status"] = "ACTIVE"
    cloud.calls.clear()
    rec = driver.modify(spec, rec, "geni_stop", NOW)
    assert rec["state"] == "geni_notready" and cloud.servers[sid]["status"] == "SHUTOFF"
    rec = driver.modify(spec, rec, "geni_start", NOW)
    rec = driver.modify(spec, rec, "geni_restart", NOW)
    actions = [next(iter(b)) for m, p, b in cloud.calls if p.endswith(f"/servers/{sid}/action")]
    assert actions == ["os-stop", "os-start", "reboot"]
    assert [b for m, p, b in cloud.calls if p.endswith("/action")][-1] == {"reboot": {"type": "SOFT"}}
    assert not [c for c in cloud.mutations() if c == ("POST", "compute:/v2.1/servers")]  # no second server


def test_create_twice_makes_one_set_of_resources(driver, cloud):
    provision(driver)
    before = {k: len(v) for k, v in cloud.neutron.items()}, len(cloud.keypairs)
    cloud.calls.clear()
    provision(driver)
    assert ({k: len(v) for k, v in cloud.neutron.items()}, len(cloud.keypairs)) == before
    assert cloud.mutations() == []


def _start_then_destroy(driver) -> dict:
    """A started 2-node slice destroyed node by node, then its link; the records, for destroying again."""
    recs = provision(driver)
    for n in ("n1", "n2"):
        recs[n] = driver.modify(node(n), recs[n], "geni_start", NOW)
    for n in ("n1", "n2"):
        driver.destroy(node(n), recs[n], NOW)
    driver.destroy(link(), recs["lan0"], NOW)
    return recs


def test_delete_removes_everything_and_twice_is_harmless(driver, cloud):
    recs = _start_then_destroy(driver)
    assert driver.leftovers() == []
    assert not cloud.servers and not cloud.keypairs and not any(cloud.neutron.values())
    cloud.calls.clear()
    for n in ("n1", "n2"):
        driver.destroy(node(n), recs[n], NOW)
    driver.destroy(link(), recs["lan0"], NOW)
    assert cloud.mutations() == []


def test_leftovers_waits_for_the_servers_nova_is_still_deleting(driver, cloud):
    _start_then_destroy(driver)
    assert [s["OS-EXT-STS:task_state"] for s in cloud.servers.values()] == ["deleting", "deleting"]
    assert driver.leftovers() == []
    assert not cloud.servers


def test_deleting_a_link_before_its_nodes_says_why_and_can_be_retried(driver, cloud):
    from slicex.errors import ServerError

    recs = provision(driver)
    with pytest.raises(ServerError, match=r"Neutron refuses .* ports are on it \(xab12-\w+-\w+, xab12-\w+-\w+: "
                                          r".*ports still in use on the network.*delete its nodes first"):
        driver.destroy(link(), recs["lan0"], NOW)
    for n in ("n1", "n2"):
        driver.destroy(node(n), recs[n], NOW)
    driver.destroy(link(), recs["lan0"], NOW)
    assert driver.leftovers() == []


def test_capacity_becomes_a_qos_bandwidth_limit_on_the_network(driver, cloud):
    driver.create(link(cap=10_000), NOW)
    policy = next(iter(cloud.neutron["qos/policies"].values()))
    assert policy["rules"][0]["max_kbps"] == 10_000 and policy["rules"][0]["direction"] == "egress"
    assert next(iter(cloud.neutron["networks"].values()))["qos_policy_id"] == policy["id"]


def test_reconcile_removes_what_no_live_lease_holds_and_keeps_the_rest(driver, cloud):
    recs = provision(driver)
    recs["n2"] = driver.modify(node("n2"), recs["n2"], "geni_start", NOW)
    other = FakeCloud._make("network.json", "network", "net-other", "someone-elses")  # not ours: untouched
    cloud.neutron["networks"]["net-other"] = other
    restarted = OpenStackDriver(settings())
    restarted.poll_s = 0.0
    restarted.start()
    report = restarted.reconcile([(link(), recs["lan0"]), (node("n1"), recs["n1"])])
    assert all(s["OS-EXT-STS:task_state"] == "deleting" for s in cloud.servers.values())  # n2's, going
    assert sorted(r.split()[0] for r in report["removed"]) == ["keypair", "port", "server"]
    left = restarted.leftovers()
    assert any(x.startswith("network") for x in left) and sum(x.startswith("port") for x in left) == 1
    assert "net-other" in cloud.neutron["networks"]
    # the lease of n1 ends later: nothing of the deployment remains
    restarted.reconcile([])
    assert restarted.leftovers() == []
    assert "net-other" in cloud.neutron["networks"]


def test_reconcile_deletes_a_network_before_its_qos_policy(driver, cloud):
    """Neutron refuses to delete a QoS policy a network still uses (409 QosPolicyInUse, seen on the live
    cloud): the network goes first."""
    driver.create(link(cap=10_000), NOW)
    assert cloud.neutron["qos/policies"]
    report = driver.reconcile([])
    assert [r.split()[0] for r in report["removed"]] == ["network", "qos_policy"]
    assert driver.leftovers() == []


def test_an_unknown_flavor_is_refused_naming_the_mapping(driver, cloud):
    from slicex.errors import BadArgs

    driver.create(link(), NOW)
    spec = node("n1")
    spec = SliverSpec(spec.id, "node", "n1", (), spec.labels, {**spec.details, "sliver_type": "XOLarge",
                                                               "vm_size": "XOLarge"})
    with pytest.raises(BadArgs, match="openstack.flavors"):
        driver.create(spec, NOW)


def test_an_unreachable_cloud_stops_start_with_the_reason(tmp_path, monkeypatch):
    (tmp_path / "clouds.yaml").write_text("clouds:\n  other:\n    auth:\n      auth_url: https://identity.example.com\n")
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(tmp_path / "clouds.yaml"))
    with pytest.raises(Unsupported, match="testcloud"):
        OpenStackDriver(settings()).start()


# ---- wiring: slicex.yaml's substrate_driver: openstack -------------------------------------------------------------
def _home(tmp_path, section: str):
    from slicex.home import Home

    root = tmp_path / "home"
    root.mkdir()
    (root / "slicex.yaml").write_text("deployment_id: dep-1\nsubstrate_driver: openstack\n" + section)
    return Home(root)


def test_slicex_yaml_selects_the_openstack_driver_and_up_starts_and_reconciles_it(cloud, tmp_path):
    from deployment.service import host_driver, start_host_driver

    home = _home(tmp_path, "openstack:\n  cloud: testcloud\n  physical_network: physnet1\n"
                           "  flavors: {XOSmall: m1.small}\n  images: {ubuntu: ubuntu-22.04}\n")
    driver = host_driver(home.config(), home)
    assert isinstance(driver, OpenStackDriver)
    assert (driver.settings.cloud, driver.settings.physical_network) == ("testcloud", "physnet1")
    assert driver.settings.flavors == {"XOSmall": "m1.small"}

    class NoLeases:
        def live_slivers(self):
            return []

    start_host_driver(driver, NoLeases())  # what `slicex up` does before serving
    assert driver.conn is not None


def test_slicex_yaml_without_a_cloud_is_refused_naming_the_section(tmp_path):
    from deployment.service import host_driver
    from slicex.errors import BadArgs

    home = _home(tmp_path, "openstack:\n  physical_network: physnet1\n")
    with pytest.raises(BadArgs, match="cloud under `openstack:`"):
        host_driver(home.config(), home)


def test_without_openstacksdk_start_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "openstack", None)  # `import openstack` now fails as if not installed
    with pytest.raises(Unsupported, match=r"slicex\[openstack\]"):
        OpenStackDriver(settings()).start()
