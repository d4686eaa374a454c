"""The `openhub` command line (openhub/api/README.md, "Command line"): JSON for scripts, tables for people,
clean errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from click.testing import CliRunner

import openhub
from openhub.cli import main
from openhub.core.config import get_settings
from openhub.store import audit
from openhub.testing import ExternalSystem
from tests.support import backends
from tests.support.waiting import wait_final, wait_for, wait_state
from tests.support.workers import PROJECT, Worker

OPENHUB = str(Path(sys.executable).with_name("openhub"))
CLI_KEY = "cli-key-" + uuid.uuid4().hex  # `openhub serve` refuses keys shorter than 32 characters
CLI_ADMIN = "cli-admin-" + uuid.uuid4().hex


@pytest.fixture
def cli(backend: backends.Backend):
    """Run `openhub ...` in-process against the active backend; returns the click Result."""
    backend.activate()
    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(main, list(args), catch_exceptions=False)

    return run


def test_submit_then_duplicate(cli, prefix, tmp_path):
    cid = uuid.uuid4().hex
    payload = json.dumps({"prefix": prefix})
    first = cli(
        "submit", "test.flow", "--source-system", "CRM", "--correlation-id", cid, "--payload", payload, "--json"
    )
    assert first.exit_code == 0, first.output
    accepted = json.loads(first.output)
    assert accepted["duplicate"] is False and openhub.get_message(accepted["id"]).correlation_id == cid
    path = tmp_path / "payload.json"
    path.write_text(payload)
    again = cli("submit", "test.flow", "-s", "CRM", "-c", cid, "--file", str(path))
    assert again.exit_code == 0 and f"duplicate: message {accepted['id']}" in again.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["submit", "no.such", "-s", "CRM", "-c", "x", "--payload", "{}"], "unknown route"),
        (["submit", "test.flow", "-s", "CRM", "-c", "x", "--payload", "{nope"], "not JSON"),
        (["submit", "test.flow", "-s", "CRM", "-c", "x"], "exactly one of --payload and --file"),
        (["messages", "show", "987654321"], "no message with id 987654321"),
        (["messages", "restart", "987654321"], "no message"),
        (["pause", "no.such"], "unknown route"),
        (["submit", "test.flow", "-s", "CRM", "-c", "a\x1b[2Jb", "--payload", "{}"], "control characters"),
        (["submit", "test.flow", "-s", "CRM", "-c", "x", "--payload", "[" * 100 + "]" * 100], "OPENHUB_MAX_NESTING"),
        (
            [
                "submit",
                "test.flow",
                "-s",
                "CRM",
                "-c",
                "x",
                "--payload",
                "{}",
                "--msg-timestamp",
                "9999-01-01T00:00:00Z",
            ],
            "OPENHUB_MAX_CLOCK_SKEW",
        ),
        (["messages", "list", "--from", "yesterday"], "not an ISO 8601 timestamp"),
        (["messages", "list", "--to", "9999-12-31T23:00:00-05:00"], "out of range"),
        (
            [
                "submit",
                "test.flow",
                "-s",
                "CRM",
                "-c",
                "x",
                "--payload",
                "{}",
                "--msg-timestamp",
                "0001-01-01T00:00+05:00",
            ],
            "out of range",
        ),
    ],
)
def test_errors_exit_1_with_a_message_and_no_traceback(backend, args, message):
    backend.activate()
    result = CliRunner().invoke(main, args)
    assert result.exit_code in (1, 2), result.output
    assert message in result.output or message in (result.stderr or "")
    assert "Traceback" not in result.output


def test_a_payload_refused_by_validation_names_the_field_and_why(backend):
    backends.activate(
        dict(backend.env, OPENHUB_ROUTES=f"{backend.env['OPENHUB_ROUTES']},tests.integration.api.extra_routes")
    )
    try:
        result = CliRunner().invoke(
            main, ["submit", "api.typed", "-s", "CRM", "-c", uuid.uuid4().hex, "--payload", '{"name": "Ada"}']
        )
    finally:
        backend.activate()
    assert result.exit_code == 1
    assert "api.typed: externalCustomerId: Field required" in result.output, result.output


@pytest.fixture
def held(backend):
    """test.held paused while the test runs: its messages stay live for the commands to act on (the
    suite's worker would otherwise finish one between the test's read of its state and its cancel)."""
    backend.activate()
    openhub.pause("test.held")
    yield "test.held"
    openhub.resume("test.held")


def test_messages_list_show_cancel_restart(cli, prefix, held):
    cid = uuid.uuid4().hex
    view = openhub.submit("test.held", {"prefix": prefix}, source_system="CLI", correlation_id=cid, process_id=cid)
    listed = cli("messages", "list", "--source-system", "CLI", "--correlation-id", cid, "--json")
    assert [m["id"] for m in json.loads(listed.output)] == [view.id]
    assert cli("messages", "count", "--process-id", cid).output == "1 message matches\n"
    table = cli("messages", "list", "--route", "test.held", "--limit", "5")
    assert table.exit_code == 0 and "test.held" in table.output and "correlation id" in table.output
    shown = json.loads(cli("messages", "show", str(view.id), "--json").output)
    assert shown["id"] == view.id and shown["history"][0]["event"] == "accepted" and "children" in shown
    assert "payload" in cli("messages", "show", str(view.id)).output
    conflict = CliRunner().invoke(main, ["messages", "restart", str(view.id)])
    assert conflict.exit_code == 1 and "only an OK, FAILED or CANCEL message can be restarted" in conflict.output
    cancelled = cli("messages", "cancel", str(view.id), "--json")
    assert json.loads(cancelled.output)["state"] == "CANCEL"
    again = CliRunner().invoke(main, ["messages", "cancel", str(view.id)])  # issue 40: "cancelled is not allowed
    assert again.exit_code == 1 and f"message {view.id} is already CANCEL" in again.output  # in state CANCEL"
    restarted = cli("messages", "restart", str(view.id), "--total")
    assert restarted.exit_code == 0 and f"message {view.id} restarted" in restarted.output
    # The history names the operator's restart, not only its move to PARTLY_FAILED (which reads as a failure).
    [entry] = [
        e
        for e in json.loads(cli("messages", "show", str(view.id), "--json").output)["history"]
        if e["event"] == "restarted"
    ]
    # issue 36: by whom (the CLI's local user)
    assert (entry["from_state"], entry["detail"]) == (
        "CANCEL",
        f"total restart by {audit.current_actor().name}: every call made again",
    )


def test_messages_respond_takes_the_waits_token(cli, hub, prefix, external):
    m = openhub.submit(
        "test.wait", {"prefix": prefix, "wait": 60}, source_system="CRM", correlation_id=uuid.uuid4().hex
    )
    wait_state(m.id, "WAITING_FOR_RES")
    (url,) = [c.body["url"] for c in external.calls if c.path == f"{prefix}/callback"]
    token = parse_qs(urlsplit(url).query)["token"][0]  # the question gave it to its responder
    answered = cli("messages", "respond", str(m.id), "--payload", '{"approved": true}', "--token", token, "--json")
    assert json.loads(answered.output)["duplicate"] is False, answered.output
    again = cli("messages", "respond", str(m.id), "--payload", '{"approved": false}', "--token", token)
    assert again.exit_code == 0 and "duplicate" in again.output, again.output
    assert wait_final(m.id).custom_data["answer"] == {"approved": True}
    stale = CliRunner().invoke(main, ["messages", "respond", str(m.id), "--payload", "{}", "--token", "1.nothing"])
    assert stale.exit_code == 1 and "no open wait" in stale.output, stale.output


def test_show_names_the_messages_trace_and_links_it(cli, prefix, held, monkeypatch):
    """Issue 23: a message submitted in a caller's trace shows its trace id, and the link OPENHUB_TRACE_URL makes."""
    from openhub.core.config import reset_settings

    monkeypatch.setenv("OPENHUB_TRACE_URL", "https://jaeger.example/trace/{trace_id}")
    reset_settings()
    trace = uuid.uuid4().hex
    try:
        view = openhub.submit(
            "test.held",
            {"prefix": prefix},
            source_system="CLI",
            correlation_id=uuid.uuid4().hex,
            traceparent=f"00-{trace}-{'b7ad6b7169203331'}-01",
        )
        shown = json.loads(cli("messages", "show", str(view.id), "--json").output)
        assert (shown["trace_id"], shown["trace_url"]) == (trace, f"https://jaeger.example/trace/{trace}")
        assert trace in cli("messages", "show", str(view.id)).output
        untraced = openhub.submit(
            "test.held",
            {"prefix": prefix},
            source_system="CLI",
            correlation_id=uuid.uuid4().hex,
            traceparent="not a traceparent",
        )
        shown = json.loads(cli("messages", "show", str(untraced.id), "--json").output)
        assert (shown["trace_id"], shown["trace_url"]) == (None, None)  # tracing off, and nothing valid given
    finally:
        monkeypatch.delenv("OPENHUB_TRACE_URL")
        reset_settings()


def test_show_calls_the_error_of_a_message_ok_after_a_retry_an_earlier_attempts(cli, hub, prefix, external):
    external.fail(f"{prefix}/b", times=1)
    view = openhub.submit("test.flow", {"prefix": prefix}, source_system="CLI", correlation_id=uuid.uuid4().hex)
    assert wait_final(view.id).state == "OK"
    shown = cli("messages", "show", str(view.id)).output
    assert "error of an earlier attempt (the message then ended OK)" in shown and "step_that_failed_earlier" in shown
    assert "last error" not in shown and "Traceback" not in shown
    # One line (issue 40), the whole text with --verbose.
    assert f"HTTP 503 from {external.url}{prefix}/b" in shown and "--verbose shows the whole texts" in shown
    verbose = cli("messages", "show", str(view.id), "--verbose").output
    assert "Traceback (most recent call last)" in verbose and "--verbose shows" not in verbose


def test_messages_cancel_and_restart_by_filter(cli, prefix, held):
    process = uuid.uuid4().hex
    ids = [
        openhub.submit(
            "test.held", {"prefix": prefix}, source_system="CLI", correlation_id=uuid.uuid4().hex, process_id=process
        ).id
        for _ in range(2)
    ]
    listed = cli("messages", "list", "--process-id", process, "--json")
    assert sorted(m["id"] for m in json.loads(listed.output)) == sorted(ids)
    assert json.loads(cli("messages", "count", "--process-id", process, "--json").output) == {"total": 2}
    assert cli("messages", "count", "--process-id", process, "--route", "test.held").output == "2 messages match\n"
    neither = CliRunner().invoke(main, ["messages", "cancel"])
    assert neither.exit_code == 2 and "either one MESSAGE_ID or filters" in neither.output
    both = CliRunner().invoke(main, ["messages", "cancel", str(ids[0]), "--process-id", process])
    assert both.exit_code == 2
    cancelled = json.loads(cli("messages", "cancel", "--process-id", process, "--json").output)
    assert cancelled == {"done": sorted(ids), "refused": [], "more": False}
    restarted = cli("messages", "restart", "--process-id", process, "--state", "cancel", "--limit", "1")
    assert restarted.exit_code == 0 and restarted.output == "1 message restarted; more match: run again\n"
    restarted = cli("messages", "restart", "--process-id", process, "--state", "cancel")
    assert restarted.exit_code == 0 and restarted.output == "1 message restarted\n"  # not "1 messages"
    cancelled = cli("messages", "cancel", "--process-id", process)
    assert cancelled.exit_code == 0 and cancelled.output == "2 messages cancelled\n"


def test_list_and_show_print_markup_and_control_characters_verbatim(cli, prefix):
    cid = f"[/]x[bold red]{uuid.uuid4().hex[:8]}"
    payload = {"prefix": prefix, "note": "[/red] closing tag", "esc": "\x1b[2J"}
    view = openhub.submit("test.held", payload, source_system="CLI", correlation_id=cid)
    table = cli("messages", "list", "--source-system", "CLI", "--correlation-id", cid)
    assert table.exit_code == 0 and cid in table.output, table.output
    shown = cli("messages", "show", str(view.id))
    assert shown.exit_code == 0 and cid in shown.output and "[/red] closing tag" in shown.output
    assert "\x1b" not in shown.output and "\\u001b[2J" in shown.output
    listed = json.loads(cli("messages", "list", "--correlation-id", cid, "--json").output)
    assert listed[0]["correlation_id"] == cid and "payload" not in listed[0]


def test_pause_resume_and_routes(cli):
    assert json.loads(cli("pause", "test.held", "--json").output) == {"route": "test.held", "paused": True}
    assert "test.held" in openhub.paused()
    resumed = json.loads(cli("resume", "test.held", "--json").output)
    assert resumed["paused"] is False and "test.held" not in openhub.paused()
    cli("pause", "test.held")
    assert cli("resume", "test.held").output == "test.held resumed; 0 postponed messages re-driven now\n"
    routes = json.loads(cli("routes", "--json").output)
    assert "test.flow" in {r["route"] for r in routes}


def _sample(text: str, start: str) -> float:
    lines = [line for line in text.splitlines() if line.startswith(start)]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


def test_serve_with_two_workers_adds_up_metrics(backend, prefix):
    backend.activate()
    port = backends.free_port()
    env = dict(
        os.environ,
        **backend.env,
        OPENHUB_API_KEYS=f"CRM={CLI_KEY}",
        OPENHUB_ADMIN_TOKEN=CLI_ADMIN,
        PYTHONPATH=str(PROJECT),
    )
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    server = subprocess.Popen(
        [OPENHUB, "serve", "--port", str(port), "--workers", "2"],
        env=env,
        cwd=PROJECT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            try:
                return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                assert server.poll() is None, server.stdout.read().decode()  # type: ignore[union-attr]
                return False

        wait_for(up, 60, "openhub serve to answer /healthz")
        with httpx.Client(base_url=base, timeout=10) as http:
            for _ in range(6):  # connections spread over both workers
                r = http.post(
                    "/api/v1/messages/test/flow",
                    json={"prefix": prefix},
                    headers={"Authorization": f"Bearer {CLI_KEY}", "X-Correlation-Id": uuid.uuid4().hex},
                )
                assert r.status_code == 202, r.text
            text = http.get("/metrics", headers={"Authorization": f"Bearer {CLI_ADMIN}"}).text
        assert _sample(text, 'openhub_messages_accepted_total{route="test.flow",source_system="CRM"}') == 6.0
        # Database-derived counters agree whichever worker answers the scrape, even a worker whose
        # first scrape comes after the event (only one worker has been scraped so far).
        finished = 'openhub_messages_finished_total{route="test.held",state="CANCEL"}'
        before = _sample(text, finished)
        openhub.pause("test.held")
        try:
            held = openhub.submit("test.held", {"prefix": prefix}, source_system="CRM", correlation_id=uuid.uuid4().hex)
            openhub.cancel(held.id)
        finally:
            openhub.resume("test.held")
        scrape = {"Authorization": f"Bearer {CLI_ADMIN}"}
        after = {
            _sample(httpx.get(f"{base}/metrics", headers=scrape, timeout=10).text, finished) for _ in range(12)
        }  # new connections
        assert after == {before + 1}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        out, _ = server.communicate(timeout=30)
    log = out.decode(errors="replace")
    assert CLI_KEY not in log and "correlation_id=" in log


def test_demo_runs_the_example_routes_to_final_states(tmp_path, external: ExternalSystem):
    """`openhub demo` on a fresh embedded hub with the example routes and a real worker."""
    env = dict(
        backends.TEST_SETTINGS,
        OPENHUB_ROUTES="routes",
        OPENHUB_VAR_DIR=str(tmp_path / "var"),
        OPENHUB_DATABASE_URL=f"sqlite:///{tmp_path / 'var' / 'openhub.db'}",
        OPENHUB_BROKER_URL="filesystem://",
        OPENHUB_EXAMPLE_URL=external.url,
    )
    full = {k: v for k, v in os.environ.items() if not k.startswith("OPENHUB_")}
    full.update(env, PYTHONPATH=str(PROJECT))
    subprocess.run([OPENHUB, "db", "upgrade"], env=full, cwd=PROJECT, check=True, capture_output=True)
    worker = Worker(env, tmp_path).start()
    try:
        done = subprocess.run(
            [OPENHUB, "demo", "--count", "6", "--timeout", "120", "--json"],
            env=full,
            cwd=PROJECT,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stdout + done.stderr + worker.log()[-3000:]
        summary = json.loads(done.stdout)
        assert summary["submitted"] == summary["final"] == 6
        assert sum(row["count"] for row in summary["by_route_and_state"]) == 6
        table = subprocess.run(
            [OPENHUB, "demo", "--count", "2", "--timeout", "120"],
            env=full,
            cwd=PROJECT,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert table.returncode == 0 and "customer.setCustomer" in table.stdout and "2/2 final" in table.stdout
    finally:
        worker.stop()


def test_tokens_add_list_revoke_and_the_audit_names_the_cli_user(cli):
    """Issue 36: named operator tokens from the command line; each change is in `openhub audit`."""
    from openhub.store import tokens

    name = f"cli-{uuid.uuid4().hex[:8]}"
    made = json.loads(cli("tokens", "add", name, "--role", "viewer", "--json").output)
    url = get_settings().database_url
    assert made["role"] == "viewer" and tokens.lookup(made["token"], url=url) == (name, "viewer")
    listed = cli("tokens", "list").output
    assert name in listed and made["token"] not in listed
    assert cli("tokens", "revoke", name).output == f"token {name} revoked\n"
    assert tokens.lookup(made["token"], url=url) is None
    again = CliRunner().invoke(main, ["tokens", "revoke", name])
    assert again.exit_code == 1 and "already revoked" in again.output
    bad = CliRunner().invoke(main, ["tokens", "add", "x", "--role", "root"])
    assert bad.exit_code == 2
    trail = json.loads(cli("audit", "--action", "token.revoke", "--json").output)
    assert trail[0]["target"] == name and trail[0]["who"] == audit.current_actor().name
    assert f"token.add  {name}" in cli("audit", "--who", audit.current_actor().name).output


def test_restart_from_a_step_retry_and_resubmit_from_the_cli(cli, hub, prefix, external):
    m = openhub.submit("test.flow", {"prefix": prefix}, source_system="CLI", correlation_id=uuid.uuid4().hex).id
    assert wait_final(m).state == "OK"
    unknown = CliRunner().invoke(main, ["messages", "restart", str(m), "--from-step", "zz"])
    assert unknown.exit_code == 1 and "has no step 'zz'" in unknown.output
    assert f"message {m} restarted from step c" in cli("messages", "restart", str(m), "--from-step", "c").output
    wait_for(
        lambda: openhub.get_message(m).state == "OK" and external.count(f"{prefix}/c") == 2, 60, "step c called again"
    )
    assert (external.count(f"{prefix}/a"), external.count(f"{prefix}/b")) == (1, 1)
    held = openhub.submit(
        "test.flow",
        {"prefix": prefix, "script": {"a": {"postpone_once": True, "postpone_for": 3600}}},
        source_system="CLI",
        correlation_id=uuid.uuid4().hex,
    ).id
    wait_state(held, "POSTPONED")
    assert f"message {held} due now" in cli("messages", "retry", str(held)).output
    assert wait_final(held, 30).state == "OK"
    failed = openhub.submit(
        "test.flow",
        {"prefix": prefix, "script": {"a": {"reject": True}}},
        source_system="CLI",
        correlation_id=uuid.uuid4().hex,
    ).id
    assert wait_final(failed).state == "FAILED"
    assert (
        f"message {failed} resubmitted"
        in cli("messages", "resubmit", str(failed), "--payload", json.dumps({"prefix": prefix, "fixed": 1})).output
    )
    assert wait_final(failed).state == "OK"
    assert openhub.get_message(failed).payload == {"prefix": prefix, "fixed": 1}


def test_breakers_list_open_reset(cli):
    listed = json.loads(cli("breakers", "list", "--json").output)
    assert "test-billing" in [b["system"] for b in listed]
    assert "open until" in cli("breakers", "open", "test-billing", "--reason", "maintenance", "--seconds", "30").output
    assert "maintenance" in cli("breakers", "list").output
    assert cli("breakers", "reset", "test-billing", "--reason", "back").output == "breaker of test-billing closed\n"
    unknown = CliRunner().invoke(main, ["breakers", "reset", "nope", "--reason", "x"])
    assert unknown.exit_code == 1 and "no step calls a system named 'nope'" in unknown.output


def test_errors_lists_every_code_the_hub_assigns_and_counts_a_failed_messages(cli, hub, prefix):
    """`openhub errors` (issue 38): every code the source assigns (the scan of tests/unit/test_codes.py), the
    routes' own, and how many messages carry each; a real worker fails one message with its route's E400."""
    from openhub.core import codes
    from tests.unit.test_codes import _assigned

    before = {e["code"]: e for e in json.loads(cli("errors", "--json").output)}
    view = openhub.submit(
        "test.flow",
        {"prefix": prefix, "script": {"a": {"reject": True}}},
        source_system="CLI",
        correlation_id=uuid.uuid4().hex,
    )
    assert wait_final(view.id).state == "FAILED"
    listed = {e["code"]: e for e in json.loads(cli("errors", "--json").output)}
    assert {c for _, _, c in _assigned()} | set(codes.CATALOGUE) <= set(listed)
    assert listed["E400"]["messages"] == before["E400"]["messages"] + 1 and listed["E400"]["declared"]
    assert listed["E400"]["search"] == "/api/v1/messages?error_code=E400"
    table = cli("errors")
    assert table.exit_code == 0 and "WORKER_LOST" in table.output and "ORDER_TIMEOUT" in table.output
    assert "E400" in table.output
    offline = cli("errors", "--no-counts", "--json")
    assert all(e["messages"] is None for e in json.loads(offline.output))
