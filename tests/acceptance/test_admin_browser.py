"""The admin page end to end in headless Chromium: find a failed message, restart it, see it OK.

Debian's chromium (`make system-deps`) is driven by Playwright's Python package pointed at the
system browser (no `playwright install`); the ingress is a real uvicorn server on a free port
and a real worker carries the messages.
"""

from __future__ import annotations

import shutil
import threading
import uuid
from contextlib import contextmanager
from typing import Iterator

import pytest
import uvicorn

import openhub
from openhub.api.app import create_app
from openhub.api.auth import Credentials
from openhub.testing import ExternalSystem
from tests.support import backends
from tests.support.waiting import wait_final, wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ADMIN_TOKEN = "browser-" + uuid.uuid4().hex

pytestmark = pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="chromium not installed (make system-deps)")


@contextmanager
def served_ingress(admin_token: str) -> Iterator[str]:
    """The ingress served by uvicorn on a free port, with `admin_token`; yields its base URL."""
    port = backends.free_port()
    app = create_app(credentials=Credentials({"CRM": "k-" + uuid.uuid4().hex}, admin_token))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 30, "uvicorn to start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def ingress(hub: backends.Backend) -> Iterator[str]:
    """The ingress over the test backend; yields its base URL."""
    with served_ingress(ADMIN_TOKEN) as url:
        yield url


@pytest.fixture
def page(ingress: str):  # noqa: ANN201
    """A Chromium page on the admin page, logged in with the admin token."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(60_000)
            page.on("dialog", lambda dialog: dialog.accept())
            page.goto(f"{ingress}/admin")
            page.fill("#token", ADMIN_TOKEN)
            page.click("#login-form button[type=submit]")
            page.wait_for_selector("#main:not([hidden])")
            yield page
        finally:
            browser.close()


def test_find_a_failed_message_restart_it_and_see_it_ok(hub, external: ExternalSystem, prefix, page):
    from playwright.sync_api import expect

    external.fail(f"{prefix}/fragile", times=3)  # max_fails=2: the third failure is final
    view = openhub.submit("test.fragile", {"prefix": prefix}, source_system="CRM", correlation_id=uuid.uuid4().hex)
    assert wait_final(view.id).state == "FAILED"

    page.click("#tabs button[data-tab=failed]")
    row = page.locator(f"#failed tbody tr[data-id='{view.id}']")
    expect(row).to_be_visible()
    expect(row).to_contain_text("fragile")
    row.click()
    expect(page.locator("#d-state")).to_have_text("FAILED")
    expect(page.locator("#d-error-title")).to_have_text("Last error")
    # Issue 40: one line, the whole traceback a click away.
    expect(page.locator("#d-error-line")).to_have_text(f"HTTP 503 from {external.url}{prefix}/fragile")
    expect(page.locator("#d-error")).not_to_be_visible()
    page.click("#d-error-box summary")
    expect(page.locator("#d-error")).to_contain_text("Traceback (most recent call last)")
    expect(page.locator("#d-children tbody")).to_have_text("none")  # not bare headers
    call_error = page.locator("#d-calls tbody details.error").first  # an external call's error: the same
    expect(call_error.locator("summary")).to_have_text(f"HTTP 503 from {external.url}{prefix}/fragile")
    call_error.locator("summary").click()
    expect(call_error.locator("pre")).to_contain_text("Traceback (most recent call last)")
    expect(page.locator("#d-calls tbody")).to_contain_text("FAILED")
    expect(page.locator("#d-history tbody")).to_contain_text("transient")
    expect(page.locator("#d-cancel")).to_be_disabled()

    page.click("#d-restart")
    expect(page.locator("#d-state")).to_have_text("OK", timeout=60_000)  # the page follows the message live
    assert openhub.get_message(view.id).state == "OK"
    expect(page.locator("#d-history tbody")).to_contain_text("restarted")
    assert external.effects(f"{prefix}/fragile") == 1


def test_a_message_ok_after_a_retry_shows_its_error_as_an_earlier_attempts(hub, external, prefix, page):
    from playwright.sync_api import expect

    external.fail(f"{prefix}/fragile", times=1)
    view = openhub.submit("test.fragile", {"prefix": prefix}, source_system="CRM", correlation_id=uuid.uuid4().hex)
    done = wait_final(view.id)
    assert done.state == "OK" and "503" in done.failed_error

    page.click("#tabs button[data-tab=search]")
    page.fill("#search-form [name=correlation_id]", done.correlation_id)
    page.click("#search-form button[type=submit]")
    page.locator(f"#results tbody tr[data-id='{view.id}']").click()
    expect(page.locator("#d-state")).to_have_text("OK")
    expect(page.locator("#d-error-title")).to_have_text("Error of an earlier attempt (the message then ended OK)")
    expect(page.locator("#d-error-line")).to_contain_text("HTTP 503 from")
    expect(page.locator("#d-error")).not_to_be_visible()  # folded: shown on a click
    expect(page.locator("#d-fields")).not_to_contain_text("failed step")
    expect(page.locator("#d-fields")).to_contain_text("step that failed earlier")


def test_search_and_resume_a_paused_route(hub, prefix, page):
    from playwright.sync_api import expect

    cid = uuid.uuid4().hex
    view = openhub.submit("test.flow", {"prefix": prefix}, source_system="CRM", correlation_id=cid)
    page.click("#tabs button[data-tab=search]")  # the page opens on the overview
    page.fill("#search-form input[name=correlation_id]", cid)
    page.click("#search-form button[type=submit]")
    expect(page.locator("#results tbody tr")).to_have_count(1)
    expect(page.locator(f"#results tbody tr[data-id='{view.id}']")).to_contain_text("test.flow")
    expect(page.locator("#search-total")).to_have_text("1 message match")
    process = uuid.uuid4().hex
    openhub.pause("test.held")  # its messages stay live until the page cancels them
    try:
        ids = [openhub.submit("test.held", {"prefix": prefix}, source_system="CRM", correlation_id=uuid.uuid4().hex,
                              process_id=process).id for _ in range(3)]
        page.fill("#search-form input[name=correlation_id]", "")
        page.fill("#search-form input[name=process_id]", process)
        page.fill("#search-form input[name=limit]", "2")
        page.click("#search-form button[type=submit]")
        expect(page.locator("#results tbody tr")).to_have_count(2)  # one page of two...
        expect(page.locator("#search-total")).to_have_text("3 messages match")  # ...of three
        shown = page.locator("#results tbody tr").evaluate_all("rs => rs.map(r => r.dataset.id)")
        assert {int(i) for i in shown} <= set(ids)
        page.click("#bulk-cancel")  # every match, not only the page shown
        expect(page.locator("#bulk-result")).to_have_text("3 cancelled")
        assert {openhub.get_message(i).state for i in ids} == {"CANCEL"}
        page.click("#bulk-restart")
        expect(page.locator("#bulk-result")).to_have_text("3 restarted")
    finally:
        openhub.resume("test.held")

    openhub.pause("test.held")
    page.click("#tabs button[data-tab=routes]")
    held = page.locator("#routes tbody tr[data-route='test.held']")
    expect(held).to_contain_text("paused")
    held.locator("button.resume").click()
    expect(held.locator("button.pause")).to_be_visible()
    assert "test.held" not in openhub.paused()


def test_a_wrong_token_is_refused(ingress):
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{ingress}/admin/")
            page.fill("#token", "wrong")
            page.click("#login-form button[type=submit]")
            expect(page.locator("#error")).to_contain_text("refused")
            expect(page.locator("#main")).to_be_hidden()
        finally:
            browser.close()
