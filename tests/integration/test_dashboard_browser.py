"""The dashboard end to end in headless Chromium (Playwright driving Debian's `chromium`, installed by
`make system-deps`; no browser download): a real deployment, a three-node slice with three links created
over the AM API (mutual TLS), the actors' snapshots, and the pages as a browser renders them. A screenshot of
each page is written under test-artifacts/ (ignored by git); the paths are printed."""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from slicex.home import Home
from tests.factories import request_rspec, vm
from tests.integration.conftest import Running, deployment
from tests.integration.test_am_api import ok

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (`make system-deps` "
                                                          "installs it; the test drives it with Playwright)")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
TRIANGLE = request_rspec(
    [vm("n1", ifaces=["n1:if0", "n1:if1"]), vm("n2", ifaces=["n2:if0", "n2:if1"]),
     vm("n3", ifaces=["n3:if0", "n3:if1"])],
    [{"client_id": "l12", "ifaces": ["n1:if0", "n2:if0"]}, {"client_id": "l23", "ifaces": ["n2:if1", "n3:if0"]},
     {"client_id": "l13", "ifaces": ["n1:if1", "n3:if1"]}])


@pytest.fixture(params=["embedded", "distributed"])
def live(request, pki_home: Home, tmp_path: Path) -> Iterator[Running]:
    """Both deployments (in the distributed one the broker and authority publish from their own processes)."""
    yield from deployment(request.param, pki_home, tmp_path, dashboard_port=0)


@contextmanager
def chromium_page(width: int, height: int) -> Iterator[tuple[Any, list[str]]]:
    """A page of headless Chromium driven by Playwright (imported here: only the browser tests need it), and
    the list it fills with each console error and HTTP error it meets, for the test to assert empty."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)
            yield page, errors
        finally:
            browser.close()


def api_state(url: str) -> dict:
    with urllib.request.urlopen(url + "api/state", timeout=10) as resp:
        return json.load(resp)


def wait_for(url: str, check, seconds: float = 20.0) -> dict:
    """The dashboard's JSON once `check` holds on it (the actors publish on their next tick)."""
    deadline = time.monotonic() + seconds
    while True:
        state = api_state(url)
        if check(state):
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"the snapshot never showed it: {json.dumps(state)[:2000]}")
        time.sleep(0.1)


def test_a_three_node_slice_created_over_the_am_api_appears_in_chromium(live: Running, request):
    alice = live.user("alice")
    urn, creds = alice.slice_credential("tri")
    slivers = ok(alice.am.Allocate(urn, creds, TRIANGLE, {}))["geni_slivers"]
    assert len(slivers) == 6
    ok(alice.am.Provision([urn], creds, {}))
    url = live.deployment.dashboard_url
    state = wait_for(url, lambda s: len(s["slices"].get(urn, [])) == 6
                     and {a["role"] for a in s["actors"]} == {"slice-manager", "broker", "authority"}
                     and s["reservations"]["Active"] == 6 and s["leases"] == 6)
    tags = {s["client_id"]: s["vlan_tag"] for s in state["slices"][urn] if s["kind"] == "link"}
    assert set(tags) == {"l12", "l23", "l13"} and all(isinstance(t, int) for t in tags.values())

    ARTIFACTS.mkdir(exist_ok=True)
    kind = request.node.callspec.params["live"]
    with chromium_page(1400, 1000) as (page, errors):
        page.goto(url + "slices")
        section = page.locator("section#tri")
        section.wait_for()
        text = section.inner_text()
        assert urn in text
        for client_id in ("n1", "n2", "n3", "l12", "l23", "l13"):
            assert client_id in text
        svg_texts = section.locator("svg text").all_text_contents()
        for node in ("n1", "n2", "n3"):
            assert f"node {node}" in svg_texts
        for link, tag in tags.items():
            assert f"link {link}" in svg_texts and f"VLAN {tag}" in svg_texts
            assert section.locator(".tag", has_text=str(tag)).count() >= 1
        # three links, each drawn as a line to both of its nodes
        assert section.locator("svg line").count() >= 6
        shots = [ARTIFACTS / f"dashboard-slices-{kind}.png"]
        page.screenshot(path=str(shots[0]), full_page=True)

        page.goto(url)
        assert "tri" in page.locator("main").inner_text()
        assert page.locator("#topology svg").count() == 1 and page.locator("#charts svg").count() >= 2
        shots.append(ARTIFACTS / f"dashboard-overview-{kind}.png")
        page.screenshot(path=str(shots[-1]), full_page=True)

        page.goto(url + "reservations")
        assert page.locator("#leases tr").count() == 1 + 6  # header + one lease per sliver
        assert page.locator("#tickets tr").count() >= 1 + 6
        page.goto(url + "actors")
        rows = page.locator("#actors tr").all_inner_texts()
        assert len(rows) == 1 + 3 and all("ok" in r for r in rows[1:])
        page.goto(url + "federation")
        assert page.locator("#no-peers").count() == 1
        assert not errors, errors  # no CSP violation or script error
    for shot in shots:
        assert shot.stat().st_size > 10_000
        print(f"screenshot: {shot}")
