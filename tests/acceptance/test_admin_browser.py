"""The admin page end to end in headless Chromium: find a failed message, restart it, see it OK.

Debian's chromium (`make system-deps`) is driven by Playwright's Python package pointed at the
system browser (no `playwright install`); the ingress is a real uvicorn server on a free port
and a real worker carries the messages.
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Iterator

import pytest
import uvicorn

import openhub
from openhub.api.app import create_app
from openhub.api.auth import Credentials
from openhub.core.config import get_settings
from openhub.testing import ExternalSystem
from tests.support import backends
from tests.support.waiting import wait_final, wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
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


@contextmanager
def logged_in(ingress: str, token: str):
    """A Chromium page on the admin page, logged in with `token`; every dialog is accepted (a prompt with
    the answer "by the browser test")."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(60_000)
            page.on("dialog", lambda dialog: dialog.accept("by the browser test"))
            page.goto(f"{ingress}/admin")
            page.fill("#token", token)
            page.click("#login-form button[type=submit]")
            page.wait_for_selector("#main:not([hidden])")
            yield page
        finally:
            browser.close()


@pytest.fixture
def page(ingress: str):
    """A Chromium page on the admin page, logged in with the admin token."""
    with logged_in(ingress, ADMIN_TOKEN) as page:
        yield page


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
        ids = [
            openhub.submit(
                "test.held",
                {"prefix": prefix},
                source_system="CRM",
                correlation_id=uuid.uuid4().hex,
                process_id=process,
            ).id
            for _ in range(3)
        ]
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


def _open_message(page, view) -> None:
    page.click("#tabs button[data-tab=search]")
    page.fill("#search-form [name=correlation_id]", view.correlation_id)
    page.click("#search-form button[type=submit]")
    page.locator(f"#results tbody tr[data-id='{view.id}']").click()


def test_an_operator_restarts_from_a_step_retries_now_and_resubmits_an_edited_payload(hub, external, prefix, ingress):
    """Issue 36: the new controls, with a named operator token that the page and the trail name."""
    from playwright.sync_api import expect

    from openhub.store import tokens

    name = f"browser-op-{uuid.uuid4().hex[:6]}"
    secret = tokens.add(name, "operator", url=get_settings().database_url)
    done = openhub.submit("test.flow", {"prefix": prefix}, source_system="CRM", correlation_id=uuid.uuid4().hex)
    assert wait_final(done.id).state == "OK"
    with logged_in(ingress, secret) as page:
        expect(page.locator("#whoami")).to_have_text(f"{name} (operator)")
        _open_message(page, done)
        expect(page.locator("#d-state")).to_have_text("OK")
        page.select_option("#d-from-step", "b")
        page.click("#d-restart-from")
        wait_for(
            lambda: openhub.get_message(done.id).state == "OK" and external.count(f"{prefix}/c") == 2,
            60,
            "steps b and c called again",
        )
        assert external.count(f"{prefix}/a") == 1
        expect(page.locator("#d-audit tbody")).to_contain_text("message.restart_from")
        expect(page.locator("#d-history tbody")).to_contain_text(f"cleared by {name}")

        held = openhub.submit(
            "test.flow",
            {"prefix": prefix, "script": {"a": {"postpone_once": True, "postpone_for": 3600}}},
            source_system="CRM",
            correlation_id=uuid.uuid4().hex,
        )
        wait_for(lambda: openhub.get_message(held.id).state == "POSTPONED", 60, "the message to be postponed")
        _open_message(page, held)
        expect(page.locator("#d-retry")).to_be_enabled()
        page.click("#d-retry")
        expect(page.locator("#d-state")).to_have_text("OK")

        failed = openhub.submit(
            "test.flow",
            {"prefix": prefix, "script": {"a": {"reject": True}}},
            source_system="CRM",
            correlation_id=uuid.uuid4().hex,
        )
        assert wait_final(failed.id).state == "FAILED"
        _open_message(page, failed)
        expect(page.locator("#d-edit-box")).to_be_visible()
        page.fill("#d-edit", '{"prefix": "%s", "edited": true}' % prefix)
        page.click("#d-resubmit")
        expect(page.locator("#d-state")).to_have_text("OK")
        assert [c.body for c in external.calls if c.path == f"{prefix}/a"][-1] == {"prefix": prefix, "edited": True}
        expect(page.locator("#d-history tbody")).to_contain_text('"reject":true')

        page.click("#tabs button[data-tab=routes]")
        billing = page.locator("#breakers tbody tr[data-system='test-billing']")
        billing.locator("button.breaker-open").click()
        expect(billing).to_contain_text("open until")
        expect(billing).to_contain_text("by the browser test")
        billing.locator("button.breaker-reset").click()
        expect(billing).to_contain_text("closed")

        page.click("#tabs button[data-tab=audit]")
        page.fill("#audit-form [name=who]", name)
        page.click("#audit-form button[type=submit]")
        for action in (
            "message.restart_from",
            "message.retry_now",
            "message.edit_payload",
            "breaker.open",
            "breaker.reset",
        ):
            expect(page.locator("#audit tbody")).to_contain_text(action)


def _postponed_shown_and_failed(prefix: str, page):
    """A POSTPONED message, shown in the detail (followed live: re-read each second), and a FAILED one."""
    from playwright.sync_api import expect

    waiting = openhub.submit(
        "test.flow",
        {"prefix": prefix, "script": {"a": {"postpone_once": True, "postpone_for": 3600}}},
        source_system="CRM",
        correlation_id=uuid.uuid4().hex,
    )
    failed = openhub.submit(
        "test.flow",
        {"prefix": prefix, "script": {"a": {"reject": True}}},
        source_system="CRM",
        correlation_id=uuid.uuid4().hex,
    )
    wait_for(lambda: openhub.get_message(waiting.id).state == "POSTPONED", 60, "the message to be postponed")
    assert wait_final(failed.id).state == "FAILED"
    _open_message(page, waiting)
    expect(page.locator("#d-state")).to_have_text("POSTPONED")  # followed live: re-read each second
    return waiting, failed


def test_a_late_answer_for_the_message_shown_before_does_not_take_the_detail_back(hub, prefix, page):
    """The detail follows a message on its way by re-reading it each second. A re-read of the message shown
    before, answered after another message was opened, put that one back (and `current` with it): the next
    click acted on the wrong message (in a CI run, Retry on an OK message: the message meant stayed
    POSTPONED). Here the earlier message's answers are held back 3 s in the page's fetch."""
    from playwright.sync_api import expect

    waiting, failed = _postponed_shown_and_failed(prefix, page)
    page.evaluate(
        """(id) => {
            const fetched = window.fetch;
            window.fetch = async (url, options) => {
                const answer = await fetched(url, options);
                if (String(url).endsWith("/api/v1/messages/" + id)) {
                    window.heldBack = true;
                    await new Promise((done) => setTimeout(done, 3000));  // the slow answer the test is about
                    const read = answer.json.bind(answer);
                    answer.json = async () => {
                        const body = await read();
                        setTimeout(() => { window.released = true; }, 0);  // after the page has used it
                        return body;
                    };
                }
                return answer;
            };
        }""",
        waiting.id,
    )
    page.wait_for_function("() => window.heldBack === true")  # a re-read of the first message is on its way
    _open_message(page, failed)
    expect(page.locator("#d-id")).to_have_text(str(failed.id))
    page.wait_for_function("() => window.released === true")  # its late answer has come and been used
    expect(page.locator("#d-id")).to_have_text(str(failed.id))
    expect(page.locator("#d-state")).to_have_text("FAILED")


def test_the_live_refresh_of_the_message_shown_before_does_not_take_the_detail_back(hub, prefix, page):
    """The other way round: the page follows a message on its way, and another is opened while that one's
    next re-read is due. The re-read fired before the new message's answer came, was the newer call, and
    the new answer was dropped as stale: the detail stayed on the old message (in a CI run, Retry stayed
    disabled for the POSTPONED message just opened). Here the new message's answers are held back 2.5 s."""
    from playwright.sync_api import expect

    waiting, failed = _postponed_shown_and_failed(prefix, page)
    page.evaluate(
        """(id) => {
            const fetched = window.fetch;
            window.fetch = async (url, options) => {
                const answer = await fetched(url, options);
                if (String(url).endsWith("/api/v1/messages/" + id)) {
                    await new Promise((done) => setTimeout(done, 2500));  // past the old one's next re-read
                }
                return answer;
            };
        }""",
        failed.id,
    )
    _open_message(page, failed)
    expect(page.locator("#d-id")).to_have_text(str(failed.id), timeout=15000)
    expect(page.locator("#d-state")).to_have_text("FAILED")


@contextmanager
def _worker_row(host: str) -> Iterator[str]:
    """A worker's main process on `host` as its heartbeat writes it, beating until the block ends (no such
    worker runs: nothing is held). Written once, a loaded box's page outlived OPENHUB_WORKER_DEAD_AFTER and
    showed it gone, with no Finish button (stop 49's CI)."""
    from sqlalchemy import update

    from openhub.store.schema import workers
    from tests.support.process_store import store_now, transaction

    worker_id, now = str(uuid.uuid4()), store_now()
    with transaction() as conn:
        conn.execute(workers.insert().values(id=worker_id, node=f"{host}:10", up_since=now, last_seen=now, taking=True))
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(0.2):  # the heartbeat's pace: a fifth of the shortest dead-after the suites use
            with transaction() as conn:
                conn.execute(update(workers).where(workers.c.id == worker_id).values(last_seen=store_now()))

    beating = threading.Thread(target=beat, daemon=True)
    beating.start()
    try:
        yield worker_id
    finally:
        stop.set()
        beating.join()


def test_an_operator_tells_a_worker_and_its_host_to_finish_and_lets_them_go(hub, ingress):
    """Issue 36, worker states: the overview's workers table, its Finish / Take work again buttons for a worker
    and for its host, each audited under the operator's token."""
    from playwright.sync_api import expect

    from openhub.store import audit, tokens

    name = f"browser-ops-{uuid.uuid4().hex[:6]}"
    secret = tokens.add(name, "operator", url=get_settings().database_url)
    host = f"node-{uuid.uuid4().hex[:6]}"
    with _worker_row(host) as worker_id, logged_in(ingress, secret) as page:
        row = page.locator(f"#ov-worker-states tbody tr[data-worker='{worker_id}']")
        expect(row).to_contain_text(f"{host}:10")
        row.locator("button.worker-finish").click()
        expect(row).to_contain_text(f"by {name}: by the browser test")
        row.locator("button.worker-resume").click()
        expect(row.locator("button.worker-finish")).to_be_visible()
        row.locator("button.host-finish").click()
        expect(row).to_contain_text(f"its host, by {name}")
        row.locator("button.host-resume").click()
        expect(row.locator("button.host-finish")).to_be_visible()
    done = [(e["action"], e["target"]) for e in audit.entries(who=name, url=get_settings().database_url)]
    assert done == [
        ("worker.resume", f"host {host}"),
        ("worker.finish", f"host {host}"),
        ("worker.resume", f"worker {worker_id}"),
        ("worker.finish", f"worker {worker_id}"),
    ], done


def test_a_workers_answer_older_than_an_action_s_does_not_show_the_state_before_it(hub, ingress):
    """The overview renders only its latest workers load: one the 15 s timer started before an operator's
    Finish, answered after the load the Finish started, showed the worker not held again until the next
    refresh (stop 49's CI, on a loaded box). Here that older answer is held back and delivered last."""
    from playwright.sync_api import expect

    from openhub.store import tokens

    name = f"browser-race-{uuid.uuid4().hex[:6]}"
    secret = tokens.add(name, "operator", url=get_settings().database_url)
    host = f"node-{uuid.uuid4().hex[:6]}"
    held: list = []
    hold = {"next": False}

    def workers_answer(route) -> None:
        if hold["next"]:  # answered now (the worker not yet held), handed to the page only later
            hold["next"] = False
            held.append((route, route.fetch()))
        else:
            route.continue_()

    with _worker_row(host) as worker_id, logged_in(ingress, secret) as page:
        row = page.locator(f"#ov-worker-states tbody tr[data-worker='{worker_id}']")
        expect(row.locator("button.worker-finish")).to_be_visible()
        page.evaluate(  # count the workers loads the page has received from here on
            """() => { const real = api; window.workersAnswered = 0;
              api = async (...a) => { try { return await real(...a); }
                finally { if (a[1] === "/api/v1/workers") window.workersAnswered++; } }; }"""
        )
        page.route("**/api/v1/workers", workers_answer)
        hold["next"] = True
        page.evaluate("() => { loadWorkers(); }")  # the timer's load, started before the action
        deadline = time.monotonic() + 30
        while not held:  # Playwright hands the route over while the page is waited on
            assert time.monotonic() < deadline, "the older workers load never reached the server"
            page.wait_for_timeout(50)
        row.locator("button.worker-finish").click()
        expect(row).to_contain_text(f"by {name}: by the browser test")
        route, answer = held[0]
        route.fulfill(response=answer)
        page.wait_for_function("() => window.workersAnswered >= 2")
        page.evaluate("() => new Promise((done) => setTimeout(done, 0))")  # its continuation has run
        expect(row).to_contain_text(f"by {name}: by the browser test", timeout=1000)


def test_a_viewer_sees_no_control_it_may_not_use(hub, external, prefix, ingress):
    from playwright.sync_api import expect

    from openhub.store import tokens

    name = f"browser-view-{uuid.uuid4().hex[:6]}"
    secret = tokens.add(name, "viewer", url=get_settings().database_url)
    external.fail(f"{prefix}/fragile", times=3)
    failed = openhub.submit("test.fragile", {"prefix": prefix}, source_system="CRM", correlation_id=uuid.uuid4().hex)
    assert wait_final(failed.id).state == "FAILED"
    with _worker_row(f"node-{uuid.uuid4().hex[:6]}") as worker_id, logged_in(ingress, secret) as page:
        expect(page.locator("#whoami")).to_have_text(f"{name} (viewer)")
        expect(page.locator(f"#ov-worker-states tbody tr[data-worker='{worker_id}']")).to_be_visible()
        assert all(not b.is_visible() for b in page.locator("#ov-worker-states button").all())
        _open_message(page, failed)
        expect(page.locator("#d-state")).to_have_text("FAILED")
        expect(page.locator("#d-payload")).to_contain_text(prefix)  # it reads everything...
        for control in (
            "#d-restart",
            "#d-restart-total",
            "#d-restart-from",
            "#d-from-step",
            "#d-retry",
            "#d-cancel",
            "#d-edit-box",
            "#bulk-restart",
            "#bulk-cancel",
        ):
            expect(page.locator(control)).to_be_hidden()  # ...and is shown no control
        page.click("#tabs button[data-tab=routes]")
        expect(page.locator("#routes tbody tr[data-route='test.flow']")).to_be_visible()
        expect(page.locator("#routes button.pause")).to_have_count(page.locator("#routes tbody tr").count())
        assert all(not b.is_visible() for b in page.locator("#routes button, #breakers button").all())
        expect(page.locator("#breakers tbody tr[data-system='test-billing']")).to_be_visible()
        page.click("#tabs button[data-tab=audit]")
        expect(page.locator("#audit tbody tr").first).to_be_visible()
        expect(page.locator("#tabs button[data-tab=settings]")).to_be_hidden()  # the configuration is the admin's
        assert openhub.get_message(failed.id).state == "FAILED"


def test_an_admin_sees_the_settings_in_force_and_the_live_values(hub, page):
    from playwright.sync_api import expect

    from openhub.service import settings

    settings.set_setting("OPENHUB_MAX_FAILS", "7", "browser test")
    try:
        page.click("#tabs button[data-tab=settings]")
        row = page.locator("#settings tbody tr", has_text="OPENHUB_MAX_FAILS")
        expect(row).to_contain_text("7")
        expect(row).to_contain_text("store")
        expect(page.locator("#settings tbody tr", has_text="OPENHUB_DATABASE_URL")).to_contain_text("needs a restart")
        expect(page.locator("#settings-values tbody tr", has_text="OPENHUB_MAX_FAILS")).to_contain_text("browser test")
    finally:
        settings.unset_setting("OPENHUB_MAX_FAILS")


def test_an_admin_changes_a_live_setting_and_unsets_it_on_the_page(hub, page):
    """Issue 36: an admin changes a live setting from the page (kept in the store, audited with the reason), a
    bad value is refused with the setting's name and changes nothing, and unset brings the default back."""
    from playwright.sync_api import expect

    from openhub.store.audit import entries

    page.click("#tabs button[data-tab=settings]")
    expect(page.locator("#setting-name option", has_text="OPENHUB_RETRY_INTERVAL")).to_have_count(1)
    expect(page.locator("#setting-name option", has_text="OPENHUB_DATABASE_URL")).to_have_count(0)  # not live
    page.select_option("#setting-name", "OPENHUB_RETRY_INTERVAL")
    page.fill("#setting-value", "soon")
    page.click("#setting-set")
    expect(page.locator("#error")).to_contain_text("OPENHUB_RETRY_INTERVAL")
    expect(page.locator("#settings-values tbody")).not_to_contain_text("OPENHUB_RETRY_INTERVAL")
    page.fill("#setting-value", "42")
    page.fill("#setting-reason", "billing is slow today")
    page.click("#setting-set")
    row = page.locator("#settings tbody tr", has_text="OPENHUB_RETRY_INTERVAL")
    expect(row).to_contain_text("42")
    expect(row).to_contain_text("store")
    expect(page.locator("#settings-values tbody tr", has_text="OPENHUB_RETRY_INTERVAL")).to_contain_text(
        "billing is slow today"
    )
    page.click("#setting-unset")
    expect(row).not_to_contain_text("store")  # the environment's value or the default again
    expect(page.locator("#settings-values tbody")).not_to_contain_text("OPENHUB_RETRY_INTERVAL")
    actions = [
        e["action"]
        for e in entries(limit=10, url=get_settings().database_url)
        if e["target"] and "OPENHUB_RETRY_INTERVAL" in e["target"]
    ]
    assert actions.count("config.set") == 1 and actions.count("config.unset") == 1, actions


def test_a_fan_out_family_shows_its_receivers_and_one_is_restarted_alone(hub, external, prefix, page):
    """Issue 37 part 2: the family's detail lists its receivers (one per subscribed route) with their states;
    a receiver's names its family, a click away; restarting a failed receiver leaves its siblings."""
    from playwright.sync_api import expect

    external.fail(f"{prefix}/crm", 1, status=400)
    family = openhub.submit("dlv.published", {"prefix": prefix}, source_system="CRM", correlation_id=uuid.uuid4().hex)
    billing, crm, warehouse = sorted(openhub.list_messages(parent_id=family.id), key=lambda v: v.id)
    assert [wait_final(m.id).state for m in (billing, crm, warehouse)] == ["OK", "FAILED", "OK"]

    _open_message(page, family)
    expect(page.locator("#d-state")).to_have_text("OK")
    expect(page.locator("#d-children-title")).to_contain_text("Receivers (fan-out family")
    rows = page.locator("#d-children tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.nth(1)).to_contain_text("dlvsub.crm")
    expect(rows.nth(1)).to_contain_text("FAILED")
    expect(page.locator("#d-history tbody")).to_contain_text("fanned_out")
    rows.nth(1).click()
    expect(page.locator("#d-id")).to_have_text(str(crm.id))
    expect(page.locator("#d-children-title")).to_have_text("Children")
    page.click("#d-restart")
    expect(page.locator("#d-state")).to_have_text("OK", timeout=60_000)
    page.click("#d-parent")
    expect(page.locator("#d-id")).to_have_text(str(family.id))
    expect(page.locator("#d-children tbody tr").nth(1)).to_contain_text("OK")
    assert [external.effects(f"{prefix}/{r}") for r in ("billing", "crm", "warehouse")] == [1, 1, 1]
