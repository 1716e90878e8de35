"""ProtoGENI's image calls at the AM API v2 URL, where omni sends them by default (no `-V3`), with what omni
sends there: plain-string credentials, CreateImage(slice, name, sliver, creds, {global}), ListImages(creator,
creds, options), DeleteImage(image, creds, options). They reach the same handlers as at v3: on the emulated
substrate (both deployments) the authority's UNSUPPORTED with its reason and the same BADARGS and refusals;
on container nodes (`slicex up --substrate netns`) a real image made, listed and deleted."""

from __future__ import annotations

from lxml import etree

from slicex.tls_xmlrpc import client
from tests.factories import RSPEC3, request_rspec, vm
from tests.integration.conftest import AUTHORITY, Running, User
from tests.integration.test_am_api import code, ok
from tests.integration.test_images_datasets_netns import images_home, inside, people  # noqa: F401 - a fixture

USES_HOST_NETWORK = True  # the netns test; the emulated ones take the lock with it (one module, one worker)


def v2_client(url: str, user: User) -> object:
    return client(url, str(user.cert), str(user.key))


def _created_node(v2, user: User, name: str) -> tuple[str, list[str], str]:
    """A v2 CreateSliver of one node, as omni sends it: slice URN, the slice credential's XML, its sliver URN."""
    urn, creds = user.slice_credential(name)
    xml = [c["geni_value"] for c in creds]
    manifest = ok(v2.CreateSliver(urn, xml, request_rspec([vm("n1")]), [{"urn": user.urn, "keys": []}], {}))
    return urn, xml, etree.fromstring(manifest.encode()).find(f"{{{RSPEC3}}}node").get("sliver_id")


def test_v2_image_calls_reach_the_aggregate_and_answer_as_at_v3(running: Running):
    alice, bob = running.user("alice"), running.user("bob")
    v2 = v2_client(running.deployment.endpoints.am_v2_url, alice)
    urn, xml, sliver = _created_node(v2, alice, "v2img")
    reply = v2.CreateImage(urn, "snap", sliver, xml, {"global": True})
    assert code(reply) == 13 and "cannot make images" in reply["output"], reply  # the authority's answer
    ucred = [c["geni_value"] for c in alice.user_credential()]
    for reply in (v2.ListImages(alice.urn, ucred, {}), v2.ListImages("", ucred, {}),
                  v2.DeleteImage(f"urn:publicid:IDN+{AUTHORITY}+image+snap", ucred, {"creator_urn": alice.urn})):
        assert code(reply) == 13 and "keeps no image catalogue" in reply["output"], reply
    assert code(v2.CreateImage(urn, 7, sliver, xml, {})) == 1
    assert code(v2.CreateImage(urn, "snap", sliver, xml, {"global": "yes"})) == 1
    assert code(v2.ListImages("not-a-urn", ucred, {})) == 1
    assert code(v2.DeleteImage(urn, ucred, {})) == 1  # a slice URN where the image's goes
    _other, bob_xml = bob.slice_credential("v2imgb")
    refused = v2_client(running.deployment.endpoints.am_v2_url, bob).CreateImage(
        urn, "steal", sliver, [c["geni_value"] for c in bob_xml], {"global": True})
    assert code(refused) == 22 and "credential is for" in refused["output"], refused
    ok(v2.DeleteSliver(urn, xml, {}))


def test_v2_image_of_a_container_node_is_listed_and_deleted_by_its_owner_alone(images_home):  # noqa: F811
    home, up, prefix, catalogue = images_home
    v2_url = client(up.start(), str(home.user_cert("alice")), str(home.user_key("alice"))).GetVersion()
    v2_url = v2_url["value"]["geni_api_versions"]["2"]  # where omni without -V3 goes
    users = people(home, v2_url)
    v2_a, sa_a, alice, ucred_a = users["alice"]
    v2_b, _sa_b, _bob, ucred_b = users["bob"]
    ucred_a, ucred_b = [c["geni_value"] for c in ucred_a], [c["geni_value"] for c in ucred_b]
    urn = f"urn:publicid:IDN+{AUTHORITY}+slice+v2img"
    xml = [sa_a.CreateSlice(urn)]
    manifest = ok(v2_a.CreateSliver(urn, xml, request_rspec([vm("n1")]), [{"urn": alice, "keys": []}], {}))
    sliver = etree.fromstring(manifest.encode()).find(f"{{{RSPEC3}}}node").get("sliver_id")
    assert inside(prefix, sliver, "sh", "-c", "echo made-over-v2 > /root/marker")[0] == 0

    image = ok(v2_a.CreateImage(urn, "ViaV2", sliver, xml, {"global": False}))
    assert image == f"urn:publicid:IDN+{AUTHORITY}+image+viav2"
    assert (catalogue.get("viav2").rootfs / "root/marker").read_text() == "made-over-v2\n"
    listed = ok(v2_a.ListImages(alice, ucred_a, {}))
    assert [(i["urn"], i["owner"], i["public"]) for i in listed] == [(image, alice, False)]
    assert ok(v2_b.ListImages(alice, ucred_b, {})) == []  # private: bob does not see it
    assert code(v2_b.DeleteImage(image, ucred_b, {})) == 12  # nor delete it

    ok(v2_a.DeleteSliver(urn, xml, {}))
    assert ok(v2_a.DeleteImage(image, ucred_a, {"creator_urn": alice})) is True
    assert catalogue.get("viav2") is None and ok(v2_a.ListImages(alice, ucred_a, {})) == []
