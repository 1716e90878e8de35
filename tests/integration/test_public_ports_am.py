"""Public ports through the AM API over mutual TLS on both deployments (the emulated driver places them; the
netns test forwards them): each node gets the port it asked for or the lowest free one, a port another slice
holds is UNAVAILABLE and one outside the operator's range BADARGS, both changing nothing, the quota counts
them, and a port is free for another slice once its sliver is deleted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from lxml import etree

from rspec.namespaces import PUBLIC
from tests.factories import request_rspec, vm
from tests.integration.conftest import AUTHORITY, Running, deployment
from tests.integration.test_am_api import code, ok


def gateway_site(public_ports: str, cores: int, memory_mb: int) -> str:
    """A one-host site (pc1 behind switch sw1) whose gateway forwards the operator's range `public_ports`."""
    return f"""authority: {AUTHORITY}
public_ports: ["{public_ports}"]
switches:
  - name: sw1
    ports: [{{name: pc1-eth0}}]
hosts:
  - name: pc1
    cores: {cores}
    memory_mb: {memory_mb}
    interfaces:
      - {{name: eth0, switch_port: "sw1:pc1-eth0"}}
"""


SITE = gateway_site("25100-25101", cores=16, memory_mb=65536)
QUOTAS = {"users": {f"urn:publicid:IDN+{AUTHORITY}+user+bob": {"public_ports": 1}}}


@pytest.fixture(params=["embedded", "distributed"])
def gateway(request, pki_home, tmp_path: Path) -> Iterator[Running]:
    (tmp_path / "site.yaml").write_text(SITE)
    yield from deployment(request.param, pki_home, tmp_path, substrate=str(tmp_path / "site.yaml"), quotas=QUOTAS)


def ask(*ports: tuple[int, int | None]) -> str:
    els = "".join(f'<public:port xmlns:public="{PUBLIC}" port="{p}"' + (f' public_port="{q}"' if q else "") + "/>"
                  for p, q in ports)
    return request_rspec([vm("web", extra=els)])


def given(manifest: str) -> list[tuple[int, int]]:
    return [(int(p.get("port")), int(p.get("public_port")))
            for p in etree.fromstring(manifest.encode()).iter(f"{{{PUBLIC}}}port")]


def test_public_ports_are_handed_out_once_refused_clearly_counted_and_released(gateway):
    alice, bob = gateway.user("alice"), gateway.user("bob")
    a_urn, a_creds = alice.slice_credential("gw-a")
    b_urn, b_creds = bob.slice_credential("gw-b")
    reply = ok(alice.am.Allocate(a_urn, a_creds, ask((80, 25101)), {}))
    assert given(reply["geni_rspec"]) == [(80, 25101)]
    claims = gateway.deployment.store.all_claims()

    held = bob.am.Allocate(b_urn, b_creds, ask((80, 25101)), {})
    assert code(held) == 11 and "public port 25101 is held by another sliver" in held["output"], held
    outside = bob.am.Allocate(b_urn, b_creds, ask((80, 9999)), {})
    assert code(outside) == 1 and "outside the operator's range (25100-25101)" in outside["output"], outside
    over = bob.am.Allocate(b_urn, b_creds, ask((80, None), (22, None)), {})
    assert code(over) == 3 and "public ports" in over["output"], over  # bob's quota: one
    assert gateway.deployment.store.all_claims() == claims  # the refusals changed nothing

    assert given(ok(bob.am.Allocate(b_urn, b_creds, ask((80, None)), {}))["geni_rspec"]) == [(80, 25100)]
    ok(alice.am.Provision([a_urn], a_creds, {}))
    ok(alice.am.Delete([a_urn], a_creds, {}))
    c_urn, c_creds = alice.slice_credential("gw-c")
    assert given(ok(alice.am.Allocate(c_urn, c_creds, ask((8080, 25101)), {}))["geni_rspec"]) == [(8080, 25101)]
