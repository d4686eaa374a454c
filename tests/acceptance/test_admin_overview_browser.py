"""The admin page's overview and HTTP exchanges in headless Chromium, on a store with known traffic.

The store is written row by row (tests/support/traffic.py), so the figures the page shows are
compared with numbers a person can check. Each view is saved as a screenshot under
var/screenshots/ (ignored by git) for people to look at.
"""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urljoin

import pytest

from openhub.store.db import utcnow
from tests.support.traffic import EXPECTED, fresh_store, write_known_traffic

from .test_admin_browser import CHROMIUM, CHROMIUM_ARGS, served_ingress

SCREENSHOTS = Path(__file__).resolve().parents[2] / "var" / "screenshots"
ADMIN_TOKEN = "overview-" + uuid.uuid4().hex

pytestmark = pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="chromium not installed (make system-deps)")


@pytest.fixture(params=["postgresql"])
def known(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict]:
    """A fresh store holding the known traffic; yields the ids worth looking at."""
    with fresh_store(request.param, tmp_path):
        yield write_known_traffic(utcnow())


@pytest.fixture
def admin_page(known: dict) -> Iterator[tuple]:
    """Chromium logged in to the admin page of an ingress over the known store."""
    from playwright.sync_api import sync_playwright

    with served_ingress(ADMIN_TOKEN) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(30_000)
            page.goto(f"{url}/admin")
            page.fill("#token", ADMIN_TOKEN)
            page.click("#login-form button[type=submit]")
            page.wait_for_selector("#main:not([hidden])")
            yield page, known
        finally:
            browser.close()


def test_overview_shows_the_known_traffic_and_draws_every_chart(admin_page) -> None:
    from playwright.sync_api import expect

    page, ids = admin_page
    expect(page.locator("#tab-overview")).to_be_visible()  # the first view
    expect(page.locator("#ov-hour-finished")).to_have_text(str(EXPECTED["hour_finished"]))
    expect(page.locator("#ov-hour-failure")).to_have_text("18.2 %")
    expect(page.locator("#ov-day-finished")).to_have_text(str(EXPECTED["day_finished"]))
    expect(page.locator("#ov-live")).to_have_text(str(sum(EXPECTED["live"].values())))
    expect(page.locator("#ov-parked")).to_have_text(str(EXPECTED["parked"]))
    expect(page.locator("#ov-paused")).to_have_text("1")
    expect(page.locator("#ov-paused-list")).to_contain_text("order.bookLine")
    for (route, state), count in EXPECTED["counts"].items():
        expect(page.locator(f"#ov-states tr[data-route='{route}'] td[data-state='{state}']")).to_have_text(str(count))
    oldest = page.locator("#ov-oldest tr[data-route='customer.setCustomer'][data-state='PARTLY_FAILED']")
    expect(oldest).to_contain_text("30 min")
    expect(oldest.locator("a.message-link")).to_have_text(f"#{ids['oldest_partly_failed']}")
    for failed in ids["failed"]:
        expect(page.locator(f"#ov-parked-list a[data-id='{failed}']")).to_be_visible()
    expect(page.locator("#ov-parked-list tbody tr").first).to_contain_text(EXPECTED["parked_error"])
    expect(page.locator("#ov-parked-list")).not_to_contain_text("developer.mozilla.org")
    expect(page.locator("#ov-workers")).not_to_be_empty()
    for chart in ("hour-throughput", "hour-failures", "day-throughput", "day-failures"):
        svg = page.locator(f"#chart-{chart}")
        expect(svg.locator("path.series")).to_have_count(1)
        d = svg.locator("path.series").get_attribute("d") or ""
        assert d.count("L") >= 59, (chart, d[:80])  # one point per bucket: 60 (hour) or 96 (day)
        assert "latest" in (svg.get_attribute("aria-label") or "")
    # The hour's throughput line rises above the axis where the 8 messages finished 5 minutes ago.
    ys = [
        float(p.split(",")[1])
        for p in (page.locator("#chart-hour-throughput path.series").get_attribute("d") or "")
        .replace("M", "")
        .split(" L")
    ]
    assert min(ys) < max(ys)
    # The day's axis names dates (its ends are a day apart), the hour's the time only.
    day_axis = page.locator("#chart-day-throughput text.axis").all_text_contents()
    assert any(re.fullmatch(r"\d{1,2} [A-Z][a-z]{2} \d{2}:\d{2}( UTC)?", t) for t in day_axis), day_axis
    # The search's date inputs say how they are read.
    for name in ("received_from", "received_to"):
        expect(page.locator(f"label:has(input[name={name}])")).to_contain_text("UTC")
    # A browser asks for /favicon.ico (a 404) unless the page names an icon the hub serves.
    icon = page.locator("link[rel=icon]").get_attribute("href")
    assert icon and page.request.get(urljoin(page.url, icon)).status == 200
    before = page.locator("#ov-updated").text_content()
    expect(page.locator("#ov-updated")).not_to_have_text(before or "", timeout=15_000)  # it refreshes itself
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "overview.png"), full_page=True)


def test_message_detail_shows_its_recorded_request_and_response(admin_page) -> None:
    from playwright.sync_api import expect

    page, ids = admin_page
    page.locator(f"#ov-oldest a[data-id='{ids['oldest_partly_failed']}']").click()  # from the overview's link
    expect(page.locator("#d-id")).to_have_text(str(ids["oldest_partly_failed"]))
    exchange = page.locator("#d-http details.exchange[data-step='update_billing'][data-attempt='1']")
    expect(exchange.locator("summary")).to_contain_text("POST http://billing.example/customers → 503")
    exchange.locator("summary").click()
    expect(exchange.locator("pre.request")).to_contain_text("authorization: [redacted]")
    expect(exchange.locator("pre.request")).to_contain_text('{"externalCustomerId": "42"}')
    expect(exchange.locator("pre.response")).to_contain_text("billing is down")
    expect(page.locator("#d-http-none")).to_be_hidden()
    exchange.scroll_into_view_if_needed()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "message-detail.png"), full_page=True)


def test_parked_confirmations_are_sent_again_from_the_overview(admin_page) -> None:
    from playwright.sync_api import expect

    page, ids = admin_page
    parked = EXPECTED["parked"]
    assert parked >= 2  # the known traffic parks one per failed message
    expect(page.locator("#ov-parked")).to_have_text(str(parked))
    page.locator("#ov-parked-list button.resend").first.click()
    expect(page.locator("#ov-parked")).to_have_text(str(parked - 1))  # a fresh round of attempts
    page.click("#ov-resend-parked")
    expect(page.locator("#ov-parked")).to_have_text("0")
    expect(page.locator("#ov-resend-parked")).to_be_hidden()
    expect(page.locator("#ov-parked-list tbody")).to_have_text("none")  # an empty table says so
