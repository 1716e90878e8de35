"""One aggregate over several racks, through the real slice manager, broker and authority (embedded, with
the emulated driver) on the operator guide's two-rack example, whose racks share no VLAN range: nodes go
where the request binds them or where there is room, and a link between the racks is carried over the
trunk with the tags negotiated there (translated at tor-a's trunk port)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import rsa
from lxml import etree

from authority.substrate.emulated import EmulatedDriver
from deployment.actors import ActorKeys, embedded_slice_manager
from rspec.manifest import RACKS_EXT, SliverView, build_manifest
from rspec.request import parse_request
from rspec.substrate import load_substrate, urn_name
from rspec.validate import validate_rspec
from slice_manager.actor import ActorSliceManager
from slicex.clock import ManualClock
from slicex.store.sqlite_store import SqliteStore
from tests.factories import RSPEC3, request_rspec, vm

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "two-rack-site.yaml"
SUB = load_substrate(EXAMPLE)
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
MIN = timedelta(minutes=1)


def slice_manager(tmp_path: Path) -> tuple[SqliteStore, ActorSliceManager]:
    store = SqliteStore(str(tmp_path / "s.db"))
    return store, embedded_slice_manager(store, SUB, EmulatedDriver(SUB), keys=ActorKeys.given(KEY, KEY))


def pair(a_host: str | None, b_host: str | None, size: str = "small") -> str:
    bound = {k: {"component_id": SUB.host(h).component_id} if h else {} for k, h in (("a", a_host), ("b", b_host))}
    return request_rspec([vm("a", sliver_type=size, ifaces=["a:0"], **bound["a"]),
                          vm("b", sliver_type=size, ifaces=["b:0"], **bound["b"])],
                         [{"client_id": "l", "ifaces": ["a:0", "b:0"]}])


def test_a_bound_pair_gets_one_node_per_rack_and_a_translated_link_over_the_trunk(tmp_path):
    store, sm = slice_manager(tmp_path)
    now = ManualClock().now()
    slice_urn = "urn:publicid:IDN+example.edu+slice+x"
    slivers = sm.allocate(slice_urn, "o", parse_request(pair("host-a1", "host-b1")), now + 10 * MIN, now)
    recs = {r.client_id: r for r in sm.records(slice_urn)}
    assert recs["a"].details["host"] == "host-a1" and recs["b"].details["host"] == "host-b1"
    link = recs["l"].details
    assert link["rack_path"] == "translated"
    tags = {urn_name(sw): t for sw, t in link["switch_tags"].items()}
    assert 1000 <= tags["tor-a"] <= 1499 and 1500 <= tags["tor-b"] <= 1999
    trunk_hops = [h for h in link["hops"] if h["trunk"]]
    assert [urn_name(h["port"]) for h in trunk_hops] == ["tor-a:trunk-b", "tor-b:trunk-a"]
    claims = store.all_claims()
    assert recs["l"].ticket is not None
    held = set(recs["l"].ticket.units)
    assert {f"vlan:{sw}:{t}" for sw, t in link["switch_tags"].items()} <= held <= set(claims)
    assert {f"wire:{h['port']}:{h['tags'][0][1]}" for h in trunk_hops} <= held
    # a second slice over the same trunk gets other tags, never the first one's
    other = "urn:publicid:IDN+example.edu+slice+y"
    sm.allocate(other, "o", parse_request(pair("host-a2", "host-b2")), now + 10 * MIN, now)
    (second,) = [r for r in sm.records(other) if r.client_id == "l"]
    assert second.ticket is not None and not set(second.ticket.units) & held
    sm.delete([s.urn for s in slivers], now)
    assert not held & set(store.all_claims())


def test_an_unbound_pair_is_placed_where_there_is_room(tmp_path):
    store, sm = slice_manager(tmp_path)
    now = ManualClock().now()
    # fill rack A's VM hosts (32 cores each): 4 large VMs (8 cores) per host
    filler = request_rspec([vm(f"f{i}", sliver_type="large", component_id=SUB.host(h).component_id)
                            for i, h in enumerate(["host-a1"] * 4 + ["host-a2"] * 4)])
    sm.allocate("urn:publicid:IDN+example.edu+slice+full", "o", parse_request(filler), now + 10 * MIN, now)
    slice_urn = "urn:publicid:IDN+example.edu+slice+z"
    sm.allocate(slice_urn, "o", parse_request(pair(None, None)), now + 10 * MIN, now)
    recs = {r.client_id: r for r in sm.records(slice_urn)}
    hosts = {recs["a"].details["host"], recs["b"].details["host"]}
    assert hosts <= {"host-b1", "host-b2"}, hosts  # rack A had no room
    assert recs["l"].details["vlan_tag"] is not None


def test_the_manifest_shows_each_interfaces_tag_and_the_trunk_hop_and_stays_valid(tmp_path):
    store, sm = slice_manager(tmp_path)
    now = ManualClock().now()
    slice_urn = "urn:publicid:IDN+example.edu+slice+m"
    request = pair("host-a1", "host-b1")
    sm.allocate(slice_urn, "o", parse_request(request), now + 10 * MIN, now)
    views = [SliverView(r.client_id, f"urn:publicid:IDN+example.edu+sliver+{r.id}", r.kind, r.component_id,
                        r.details) for r in sm.records(slice_urn)]
    manifest = build_manifest([request], views, SUB.component_manager_id, now)
    assert validate_rspec(manifest, "manifest") == []
    path = etree.fromstring(manifest.encode()).find(f".//{{{RSPEC3}}}link/{{{RACKS_EXT}}}path")
    assert path is not None and path.get("kind") == "translated"
    tags = {i.get("client_id"): int(i.get("vlan_tag")) for i in path.iter(f"{{{RACKS_EXT}}}interface")}
    assert 1000 <= tags["a:0"] <= 1499 and 1500 <= tags["b:0"] <= 1999
    hops = [(urn_name(h.get("port")), h.get("tags"), h.get("trunk"), h.get("translation"))
            for h in path.iter(f"{{{RACKS_EXT}}}hop")]
    wire = f"0x8100:{tags['b:0']}"
    assert hops == [("tor-a:host-a1", f"0x8100:{tags['a:0']}", None, None),
                    ("tor-a:trunk-b", wire, SUB.trunks[0].component_id, "true"),
                    ("tor-b:trunk-a", wire, SUB.trunks[0].component_id, None),
                    ("tor-b:host-b1", wire, None, None)]
