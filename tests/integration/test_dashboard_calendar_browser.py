"""The dashboard's calendar in headless Chromium (Playwright driving Debian's `chromium`, as
test_dashboard_browser.py does), on both deployments: slices held now and booked ahead over the AM API (mutual
TLS) appear as bars on their hosts' lanes, named by slice and sliver, and the free-capacity table says what is
left per day. A screenshot is written under test-artifacts/."""

from __future__ import annotations

import json
import time
import urllib.request
from datetime import timedelta

from operations.calendar_view import days_from
from slicex.clock import parse_time, rfc3339
from tests.factories import request_rspec, vm
from tests.integration.conftest import AUTHORITY, Running
from tests.integration.test_am_api import ok
from tests.integration.test_dashboard_browser import ARTIFACTS, chromium_page, live, pytestmark  # noqa: F401 - fixture

H = timedelta(hours=1)
BM1 = f"urn:publicid:IDN+{AUTHORITY}+node+bm1"


def calendar(url: str) -> dict:
    with urllib.request.urlopen(url + "api/calendar?days=3", timeout=10) as resp:
        return json.load(resp)


def wait_for_bookings(url: str, labels: set[str], seconds: float = 20.0) -> dict:
    """The calendar once every label is booked somewhere (the actors publish on their next tick)."""
    deadline = time.monotonic() + seconds
    while True:
        doc = calendar(url)
        if labels <= {b["label"] for lane in doc["lanes"] for b in lane["bookings"]}:
            return doc
        assert time.monotonic() < deadline, f"the calendar never showed {labels}: {json.dumps(doc)[:2000]}"
        time.sleep(0.1)


def test_reservations_now_and_ahead_appear_on_their_lanes_with_the_free_capacity(live: Running, request):  # noqa: F811
    alice, bob = live.user("alice"), live.user("bob")
    now = live.clock.now()
    urn, creds = bob.slice_credential("held")
    ok(bob.am.Allocate(urn, creds, request_rspec([{"client_id": "a", "sliver_type": "raw-pc"},
                                                  {"client_id": "b", "sliver_type": "raw-pc"}]), {}))
    ok(bob.am.Provision([urn], creds, {"geni_end_time": rfc3339(now + 3 * H)}))
    urn, creds = bob.slice_credential("later")
    ok(bob.am.Allocate(urn, creds, request_rspec([{"client_id": "c", "sliver_type": "raw-pc", "component_id": BM1}]),
                       {"geni_start_time": rfc3339(now + 3 * H), "geni_end_time": rfc3339(now + 5 * H)}))
    urn, creds = alice.slice_credential("ahead")
    tomorrow = now + timedelta(days=1)
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("v1", sliver_type="m1.large")]),
                         {"geni_start_time": rfc3339(tomorrow), "geni_end_time": rfc3339(tomorrow + 6 * H)}))
    url = live.deployment.dashboard_url
    doc = wait_for_bookings(url, {"held/a", "held/b", "later/c", "ahead/v1"})
    lanes = {lane["name"]: lane for lane in doc["lanes"]}
    bm1 = [(b["label"], parse_time(b["start"]), parse_time(b["end"])) for b in lanes["bm1"]["bookings"]]
    assert ("later/c", now + 3 * H, now + 5 * H) in bm1 and lanes["bm1"]["free_now"] == 0
    (v1,) = [b for lane in doc["lanes"] for b in lane["bookings"] if b["label"] == "ahead/v1"]
    assert parse_time(v1["start"]) == tomorrow and v1["amount"] == 4  # m1.large: 4 cores

    ARTIFACTS.mkdir(exist_ok=True)
    kind = request.node.callspec.params["live"]
    shot = ARTIFACTS / f"dashboard-calendar-{kind}.png"
    with chromium_page(1200, 900) as (page, errors):
        page.goto(url + "calendar?days=3")
        svg = page.locator("#calendar svg")
        svg.wait_for()
        assert set(page.locator("#calendar g.lane").evaluate_all("gs => gs.map(g => g.dataset.lane)")) >= {
            "pc1", "pc2", "pc3", "bm1", "bm2"}
        on_bm1 = page.locator('#calendar g.lane[data-lane="bm1"] g.booking title').all_text_contents()
        assert any(t.startswith(f"later/c: {rfc3339(now + 3 * H)} to {rfc3339(now + 5 * H)}") for t in on_bm1)
        assert any(t.startswith("held/") for t in on_bm1)
        texts = svg.locator("text").all_text_contents()
        assert any("ahead/v1" in t for t in texts) and any("0/1 node free now" in t for t in texts)
        headers = page.locator("#free th").all_text_contents()
        assert headers[3:] == [f"{a:%a %d %b}" for a, _b in days_from(now, 3)]
        rows = {r.locator("td").first.inner_text(): r.locator("td").all_text_contents()
                for r in page.locator("#free tr").all()[1:]}
        assert rows["bm1"][3] == "0" and rows["bm1"][-1] == "1"  # held today; free in three days
        day = next(i for i, (a, b) in enumerate(days_from(now, 3)) if a < tomorrow + 6 * H and tomorrow < b)
        pc_free = [int(rows[h][3 + day]) for h in ("pc1", "pc2", "pc3")]
        assert sorted(pc_free) == [12, 16, 16]  # the advance VM's 4 cores, on the day it runs
        page.screenshot(path=str(shot), full_page=True)
        page.click("header a[href='/calendar']")
        assert page.locator("header a.here").inner_text() == "calendar"
        assert not errors, errors
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")
