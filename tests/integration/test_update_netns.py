"""AM API Update on real slivers (`slicex up --substrate netns`, over mutual TLS as omni drives it): a node
and a link added to a running 2-node slice boot and join it on commit (ping across the new link, the kept
nodes never restarted), a second Update cancelled leaves the running topology as it was, and a third,
committed, removes the node and its link and re-shapes the kept link (its ports re-made on a new segment)."""

from __future__ import annotations

from authority.substrate import hostnet
from authority.substrate.netns import NetnsDriver
from slicex import procs
from slicex.tls_xmlrpc import client
from tests.factories import request_rspec, vm
from tests.integration.conftest import AUTHORITY
from tests.integration.netns_support import link_ends, ping, root_qdisc
from tests.integration.test_netns_am import namespaces_of, netns_home, ok  # noqa: F401 - netns_home: the fixture


def pair(capacity: int | None = None) -> str:
    return request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0"])],
                         [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"],
                           **({"capacity": capacity} if capacity else {})}])


def triple() -> str:
    return request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0", "n2:if1"]),
                          vm("n3", ifaces=["n3:if0"])],
                         [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"]},
                          {"client_id": "l2", "ifaces": ["n2:if1", "n3:if0"]}])


def addresses(ns: str) -> dict[str, str]:
    """Interface -> IPv4 address of a node namespace."""
    out = hostnet.exec_in(ns, ["ip", "-o", "-4", "addr", "show"]).stdout
    return {line.split()[1]: line.split()[3].split("/")[0] for line in out.splitlines() if " lo " not in line}


def container_pid(ns: str) -> str:
    """The pid of the node's sshd as seen on the host: a node restarted by the Update would have a new one."""
    return hostnet.exec_in(ns, ["sh", "-c", "pgrep -o sshd || true"]).stdout.strip()


def test_update_adds_boots_cancels_and_reshapes_running_nodes(netns_home):  # noqa: F811
    home, up, prefix = netns_home
    am_url = up.start()
    sa_url = procs.read(home.pid_file).info["sa_url"]
    cert, key = str(home.user_cert("alice")), str(home.user_key("alice"))
    am, sa = client(am_url, cert, key), client(sa_url, cert, key)
    urn = f"urn:publicid:IDN+{AUTHORITY}+slice+nsupd"
    cred = [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": sa.CreateSlice(urn)}]
    ok(am.Allocate(urn, cred, pair(), {}))
    ns = namespaces_of(ok(am.Provision([urn], cred, {"geni_users": []}))["geni_rspec"], prefix)
    ok(am.PerformOperationalAction([urn], cred, "geni_start", {}))
    assert ping(ns["n1"], "10.10.0.2", count=2)[0]
    sshd = {c: container_pid(n) for c, n in ns.items()}

    # Update: n3 and l2 (n2 <-> n3) staged, committed by Provision: n3 boots, n2 gets a port on l2
    staged = ok(am.Update([urn], cred, triple(), {}))
    assert {s["geni_allocation_status"] for s in staged["geni_slivers"]} == {"geni_updating"}
    assert ping(ns["n1"], "10.10.0.2", count=1)[0]  # nothing changes on the host before the commit
    manifest = ok(am.Provision([urn], cred, {"geni_users": []}))["geni_rspec"]
    ns3 = namespaces_of(manifest, prefix)
    assert {k: ns3[k] for k in ns} == ns and ns3["n3"] in hostnet.namespaces()
    status = ok(am.Status([urn], cred, {}))["geni_slivers"]
    assert {s["geni_operational_status"] for s in status} == {"geni_ready"}, status
    new = addresses(ns3["n3"])
    assert len(new) == 1
    reached, rtt = ping(ns["n2"], next(iter(new.values())), count=3)
    assert reached, (addresses(ns["n2"]), new)
    print(f"\nping n2 -> n3 across the link the Update added: {rtt} ms")
    assert ping(ns["n1"], "10.10.0.2", count=2)[0]
    assert {c: container_pid(n) for c, n in ns.items()} == sshd  # the kept nodes were not restarted

    # a second Update (n3 and l2 removed, l1 at 10 Mbit/s), cancelled: the running topology is untouched
    ok(am.Update([urn], cred, pair(capacity=10_000), {}))
    ok(am.Cancel([urn], cred, {}))
    assert ns3["n3"] in hostnet.namespaces()
    assert ping(ns["n2"], next(iter(new.values())), count=2)[0]
    assert all(root_qdisc(n, d)[0] != "tbf" for n, d in link_ends([ns["n1"]]))

    # committed this time: n3 and its link are gone from the host, l1 is re-made at 10 Mbit/s
    ok(am.Update([urn], cred, pair(capacity=10_000), {}))
    ok(am.Provision([urn], cred, {"geni_users": []}))
    assert ns3["n3"] not in hostnet.namespaces()
    assert set(addresses(ns["n2"])) == {next(d for d in hostnet.links(ns["n2"]) if d != "lo")}
    target = addresses(ns["n2"])
    assert ping(ns["n1"], next(iter(target.values())), count=2)[0]
    assert {kind for kind, _ in (root_qdisc(n, d) for n, d in link_ends([ns["n1"], ns["n2"]]))} == {"tbf"}
    assert {c: container_pid(n) for c, n in ns.items()} == sshd
    ok(am.Delete([urn], cred, {}))
    assert NetnsDriver(prefix).leftovers() == []


def test_extending_a_running_link_keeps_its_nodes_addresses(netns_home):  # noqa: F811
    """n3 joins l1 of a running pair (named first on the link): n1 and n2 keep 10.10.0.1 and 10.10.0.2 in
    their namespaces (before, both were renumbered into a new subnet) and n3 gets 10.10.0.3 and reaches them."""
    home, up, prefix = netns_home
    am_url = up.start()
    sa_url = procs.read(home.pid_file).info["sa_url"]
    cert, key = str(home.user_cert("alice")), str(home.user_key("alice"))
    am, sa = client(am_url, cert, key), client(sa_url, cert, key)
    urn = f"urn:publicid:IDN+{AUTHORITY}+slice+nsaddr"
    cred = [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": sa.CreateSlice(urn)}]
    ok(am.Allocate(urn, cred, pair(), {}))
    ns = namespaces_of(ok(am.Provision([urn], cred, {"geni_users": []}))["geni_rspec"], prefix)
    ok(am.PerformOperationalAction([urn], cred, "geni_start", {}))
    before = {c: set(addresses(n).values()) for c, n in ns.items()}
    assert before == {"n1": {"10.10.0.1"}, "n2": {"10.10.0.2"}}
    wider = request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0"]), vm("n3", ifaces=["n3:if0"])],
                          [{"client_id": "l1", "ifaces": ["n3:if0", "n1:if0", "n2:if0"]}])
    ok(am.Update([urn], cred, wider, {}))
    ns3 = namespaces_of(ok(am.Provision([urn], cred, {"geni_users": []}))["geni_rspec"], prefix)
    assert {c: set(addresses(n).values()) for c, n in ns.items()} == before
    assert set(addresses(ns3["n3"]).values()) == {"10.10.0.3"}
    assert ping(ns3["n3"], "10.10.0.1", count=2)[0] and ping(ns3["n3"], "10.10.0.2", count=2)[0]
    assert ping(ns["n1"], "10.10.0.2", count=2)[0]
    ok(am.Delete([urn], cred, {}))
    assert NetnsDriver(prefix).leftovers() == []
