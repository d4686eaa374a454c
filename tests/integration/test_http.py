"""openhub.outbound.http.HttpCall against a real local HTTP server, run through LocalHub.

Each answer class (2xx, mapped 409, mapped 4xx Reject, unmapped 4xx, 5xx, 429 with and without
Retry-After, timeout, refused connection) ends in the state README.md gives it ("HTTP steps"), and a recorded
exchange keeps what was sent and received with secrets redacted.
"""

from __future__ import annotations

import json
import socket
import threading
from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from openhub.api.detail import message_detail
from openhub.core.errors import ConfigurationError
from openhub.core.redact import redact_headers
from openhub.engine.hub import current
from openhub.outbound.http import HttpCall, retry_after
from openhub.store.db import utcnow
from openhub.store.recordings import prune_exchanges, truncate_body
from openhub.testing import LocalHub
from tests.support.backends import free_port


class ScriptedServer:
    """Answers each path with the next (status, headers, body, delay) of its script, then 200."""

    def __init__(self) -> None:
        self.scripts: dict[str, list[tuple[int, dict[str, str], bytes, float]]] = defaultdict(list)
        self.requests: list[dict[str, Any]] = []
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                script = server.scripts[self.path]
                status, headers, answer, delay = script.pop(0) if script else (200, {}, b'{"id": "x-1"}', 0)
                if delay:
                    server.release.wait(delay)  # a slow system: released at the end of the test
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def answer(
        self, path: str, status: int, headers: dict[str, str] | None = None, body: bytes = b"{}", delay: float = 0
    ) -> None:
        self.scripts[path].append((status, headers or {}, body, delay))

    def stop(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedServer]:
    s = ScriptedServer()
    monkeypatch.setenv("OPENHUB_TEST_HTTP_URL", s.url)
    yield s
    s.stop()


@pytest.fixture
def hub() -> Iterator[LocalHub]:
    with LocalHub("tests.support.http_routes", OPENHUB_RETRY_INTERVAL="60", OPENHUB_HTTP_RECORD_BYTES="64") as h:
        yield h


def run(hub: LocalHub, payload: dict, correlation_id: str | None = None, **kwargs: Any) -> Any:
    view = hub.submit(kwargs.pop("route", "http.call"), payload, correlation_id=correlation_id, **kwargs)
    hub.run()
    return hub.get(view.id)


def test_success_sends_idempotency_correlation_and_process_ids_and_records(hub, server) -> None:
    view = run(hub, {"path": "/ok", "pad": "x" * 200}, correlation_id="corr-1", process_id="proc-9")
    assert view.state == "OK" and view.custom_data["id"] == "x-1"
    sent = server.requests[0]["headers"]
    assert sent["Idempotency-Key"] == "TEST/corr-1/call_api"
    assert sent["X-Correlation-Id"] == "corr-1" and sent["X-Process-Id"] == "proc-9"
    [x] = message_detail(current(), view.id)["http_exchanges"]
    assert (x["step"], x["attempt"], x["method"], x["status"]) == ("call_api", 1, "POST", 200)
    assert x["url"] == f"{server.url}/ok" and x["duration_ms"] >= 0 and x["error"] is None
    assert x["request_headers"]["authorization"] == "[redacted]" and x["request_headers"]["x-api-key"] == "[redacted]"
    assert x["request_headers"]["idempotency-key"] == "TEST/corr-1/call_api"
    assert x["request_body"].startswith('{"path":"/ok"') and "more bytes not recorded" in x["request_body"]
    assert x["response_body"] == '{"id": "x-1"}' and x["response_headers"]["content-type"] == "application/json"


def test_mapped_409_is_a_business_error_and_the_route_goes_on(hub, server) -> None:
    server.answer("/dup", 409, body=b'{"error": "exists"}')
    view = run(hub, {"path": "/dup"})
    assert view.state == "OK" and "id" not in view.custom_data
    [error] = view.business_errors
    assert error["code"] == "E409" and "answered 409" in error["text"] and "exists" in error["text"]


@pytest.mark.parametrize("status", [400, 404, 422])
def test_mapped_4xx_rejects_without_retry(hub, server, status: int) -> None:
    server.answer("/bad", status, body=b'{"error": "no such customer"}')
    view = run(hub, {"path": "/bad"})
    assert view.state == "FAILED" and f"[HTTP_{status}]" in view.failed_error and view.error_code == f"HTTP_{status}"
    assert hub.tick(seconds=3600).redriven == 0 and len(server.requests) == 1


def test_unmapped_4xx_rejects_too_the_request_itself_is_wrong(hub, server) -> None:
    server.answer("/forbidden", 403, body=b"no")
    view = run(hub, {"path": "/forbidden"})
    assert (view.state, view.error_code) == ("FAILED", "HTTP_403")
    assert hub.tick(seconds=3600).redriven == 0 and len(server.requests) == 1


@pytest.mark.parametrize("status", [500, 503, 408, 429])
def test_5xx_408_and_bare_429_are_transient_then_retried(hub, server, status: int) -> None:
    server.answer("/flaky", status, body=b"down")
    view = run(hub, {"path": "/flaky"})
    assert view.state == "PARTLY_FAILED" and view.failed_count == 1 and view.error_code == f"HTTP_{status}"
    assert f"answered {status}" in view.failed_error and "TransientError" in view.failed_error
    hub.tick(seconds=61)
    view = hub.get(view.id)
    assert view.state == "OK" and len(server.requests) == 2
    attempts = [(x["attempt"], x["status"]) for x in message_detail(current(), view.id)["http_exchanges"]]
    assert attempts == [(1, status), (2, 200)]
    assert len({r["headers"]["Idempotency-Key"] for r in server.requests}) == 1  # the same key each attempt


def test_429_with_retry_after_postpones_without_counting_a_failure(hub, server) -> None:
    server.answer("/busy", 429, headers={"Retry-After": "120"})
    view = run(hub, {"path": "/busy"})
    assert view.state == "POSTPONED" and view.failed_count == 0
    assert hub.tick(seconds=60).redriven == 0  # not before the server said
    hub.tick(seconds=121)
    assert hub.get(view.id).state == "OK"


def test_timeout_and_refused_connection_are_transient_and_recorded(hub, server, monkeypatch) -> None:
    server.answer("/slow", 200, delay=10)  # the route's timeout is 2 s
    view = run(hub, {"path": "/slow"})
    assert view.state == "PARTLY_FAILED" and "ReadTimeout" in view.failed_error
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    monkeypatch.setenv("OPENHUB_TEST_HTTP_URL", f"http://127.0.0.1:{closed}")
    refused = run(hub, {"path": "/gone"})
    assert refused.state == "PARTLY_FAILED" and "ConnectError" in refused.failed_error
    [x] = message_detail(current(), refused.id)["http_exchanges"]
    assert x["status"] is None and x["error"].startswith("ConnectError") and x["response_body"] is None


def test_each_failure_is_one_line_of_status_method_and_url_in_every_list(hub, server, monkeypatch) -> None:
    # Issue 40: lists showed `openhub.core.errors.TransientError: POST ... answered 503: ...` for these, `HTTP 503
    # from <url>` for httpx's raise_for_status() and, on the overview, a whole traceback.
    from openhub.api.summary import message_summaries
    from openhub.store.queries import MessageFilter

    server.answer("/flaky", 503, body=b'{"error": "down"}')
    server.answer("/bad", 422, body=b'{"error": "no such customer"}')
    transient, rejected = run(hub, {"path": "/flaky"}), run(hub, {"path": "/bad"})
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    monkeypatch.setenv("OPENHUB_TEST_HTTP_URL", f"http://127.0.0.1:{closed}")
    refused = run(hub, {"path": "/gone"})
    lines = {m["id"]: m["failed_error"] for m in message_summaries(current(), MessageFilter(), 10)}
    assert lines[transient.id] == f'HTTP 503 from POST {server.url}/flaky: {{"error": "down"}}'
    assert lines[rejected.id] == f'HTTP 422 from POST {server.url}/bad: {{"error": "no such customer"}}'
    assert lines[refused.id].startswith(f"ConnectError on POST http://127.0.0.1:{closed}/gone: ")
    detail = message_detail(current(), transient.id)
    assert detail["failed_error_line"] == lines[transient.id] and "Traceback" in detail["failed_error"]  # the whole
    [call] = detail["ext_calls"]
    assert call["last_error_line"] == lines[transient.id]


def test_nothing_is_recorded_unless_asked(hub, server) -> None:
    view = run(hub, {"path": "/q"}, route="http.quiet")
    assert view.state == "OK" and message_detail(current(), view.id)["http_exchanges"] == []
    assert server.requests[0]["headers"]["Idempotency-Key"].endswith("/call_quietly")


def test_retention_prunes_old_exchanges_only(hub, server) -> None:
    view = run(hub, {"path": "/ok"})
    assert hub.hub is not None
    assert prune_exchanges(hub.hub.settings, days=14) == 0
    assert prune_exchanges(hub.hub.settings, now=utcnow() + timedelta(days=15), days=14) == 1
    assert message_detail(current(), view.id)["http_exchanges"] == []


def test_declaration_fails_fast_on_codes_it_cannot_map() -> None:
    for bad in (
        {"business_errors": {500: "E"}},
        {"reject": {429}},
        {"reject": {200}},
        {"business_errors": {409: "E"}, "reject": {409}},
    ):
        with pytest.raises(ConfigurationError):
            HttpCall(**bad)


def test_redaction_truncation_and_retry_after_parsing() -> None:
    headers = redact_headers(
        [
            ("Authorization", "Bearer x"),
            ("Cookie", "a=b"),
            ("Set-Cookie", "s"),
            ("X-Auth-Token", "t"),
            ("X-Client-Secret", "s"),
            ("Accept", "json"),
        ]
    )
    assert headers == {
        "Authorization": "[redacted]",
        "Cookie": "[redacted]",
        "Set-Cookie": "[redacted]",
        "X-Auth-Token": "[redacted]",
        "X-Client-Secret": "[redacted]",
        "Accept": "json",
    }
    assert truncate_body(b"abcdef", 4) == "abcd… [2 more bytes not recorded]" and truncate_body(None, 4) is None
    assert retry_after("30") == timedelta(seconds=30)
    assert retry_after(
        "Mon, 23 Nov 2026 08:01:00 GMT", now=datetime.fromisoformat("2026-11-23T08:00:00+00:00")
    ) == timedelta(minutes=1)
    assert retry_after("soon") is None and retry_after(None) is None


def test_messages_show_prints_each_exchange_per_step_and_attempt(hub, server) -> None:
    from click.testing import CliRunner

    from openhub.cli import main

    server.answer("/twice", 503, body=b"busy")
    view = run(hub, {"path": "/twice"})
    hub.tick(seconds=61)
    shown = CliRunner().invoke(main, ["messages", "show", str(view.id)], catch_exceptions=False)
    assert shown.exit_code == 0, shown.output
    assert f"step call_api attempt 1: POST {server.url}/twice -> 503" in shown.output
    assert f"step call_api attempt 2: POST {server.url}/twice -> 200" in shown.output
    assert "authorization: [redacted]" in shown.output and "s3cret" not in shown.output
    as_json = CliRunner().invoke(main, ["messages", "show", str(view.id), "--json"], catch_exceptions=False)
    assert [x["status"] for x in json.loads(as_json.output)["http_exchanges"]] == [503, 200]


def test_messages_show_prints_an_exchange_as_text_with_control_characters_escaped(hub, server) -> None:
    """Issue 27: a URL with `[/]` crashed rich's markup parser; a C1 CSI in a body reached the terminal."""
    from click.testing import CliRunner

    from openhub.cli import main

    server.answer("/x[/]y[bold]", 503, headers={"X-Note": "[/red]"}, body="busy \x9b2J \x1b[31m".encode())
    view = run(hub, {"path": "/x[/]y[bold]"})
    shown = CliRunner().invoke(main, ["messages", "show", str(view.id)], catch_exceptions=False)
    assert shown.exit_code == 0, shown.output
    assert f"POST {server.url}/x[/]y[bold] -> 503" in shown.output and "x-note: [/red]" in shown.output
    assert "busy \\x9b2J \\x1b[31m" in shown.output
    assert "\x9b" not in shown.output and "\x1b" not in shown.output


def test_exchanges_prune_command(hub, server) -> None:
    from click.testing import CliRunner

    from openhub.cli import main

    run(hub, {"path": "/ok"})
    kept = CliRunner().invoke(main, ["exchanges", "prune", "--json"], catch_exceptions=False)
    assert json.loads(kept.output) == {"deleted": 0}
    gone = CliRunner().invoke(main, ["exchanges", "prune", "--days", "-1"], catch_exceptions=False)
    assert gone.exit_code == 0 and "1 recorded HTTP exchanges deleted" in gone.output


def test_a_urls_credentials_reach_neither_the_record_nor_the_errors(hub, server, monkeypatch) -> None:
    import json

    monkeypatch.setenv("OPENHUB_TEST_HTTP_URL", server.url.replace("http://", "http://svc:hunter2@"))
    server.answer("/boom?api_key=k-999&page=2", 503, body=b'{"error": "down"}')
    view = run(hub, {"path": "/boom?api_key=k-999&page=2"})
    assert view.state == "PARTLY_FAILED"
    detail = message_detail(current(), view.id)
    [x] = detail["http_exchanges"]
    assert x["url"] == f"{server.url.replace('http://', 'http://***@')}/boom?api_key=***&page=2"
    detail.pop("payload"), x.pop("request_body")  # the source system's own payload, as it sent it
    stored = json.dumps([detail, view.failed_error], default=str)
    assert "hunter2" not in stored and "k-999" not in stored, stored
    assert "api_key=***" in (view.failed_error or "")


def test_an_echoed_secret_is_redacted_before_the_error_text_is_cut(hub, server) -> None:
    """Issue 34 M1: the error kept 300 characters of the answer's body unredacted; redacted after the cut, a
    secret the cut splits would leave its head (`s3c…`) where no whole value can be recognised any more."""
    body = "x" * 296 + "s3cret and more"  # the step's own Authorization: Bearer s3cret, across the 300th character
    server.answer("/echoed", 503, body=body.encode())
    view = run(hub, {"path": "/echoed"})
    assert view.state == "PARTLY_FAILED"
    line = view.failed_error.splitlines()[-1]
    assert "s3c" not in line and "[re" in line, line


def test_a_source_systems_view_has_no_exchanges_tracebacks_or_workers(hub, server) -> None:
    import json

    from openhub.api.detail import source_view

    server.answer("/boom", 503, body=b'{"error": "down"}')
    view = run(hub, {"path": "/boom"})
    shown = source_view(message_detail(current(), view.id))
    assert (
        "http_exchanges" not in shown
        and shown["failed_error"] == f'HTTP 503 from POST {server.url}/boom: {{"error": "down"}}'
    )
    text = json.dumps(shown, default=str)
    assert "Traceback" not in text and '"worker"' not in text and 'last_error"' not in text


def test_recorded_exchanges_keep_no_secret_in_headers_or_bodies(server) -> None:
    import json

    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJodWIifQ.c2lnLTE"
    answer = json.dumps({"id": "x-1", "access_token": jwt, "profile": {"name": "n", "refresh_token": "r-7"}})
    secrets = ["s3cret", "k-123", "v-ref-9", "up-8", jwt, "r-7", "p4ss-1", "cs-2", "cs-3"]
    with LocalHub("tests.support.http_routes", OPENHUB_REDACT_HEADERS="x-vendor-ref, X-Other") as hub:
        for path in ("/json", "/form", "/bare"):
            server.answer(path, 200, {"X-Vendor-Ref": "v-ref-9", "X-Upstream": "Bearer up-8"}, answer.encode())
        json_view = run(
            hub,
            {
                "path": "/json",
                "user": "ann",
                "auth": {"password": "p4ss-1"},
                "lines": [{"sku": "s-1", "client_secret": "cs-2"}],
            },
        )
        form_view = run(hub, {"path": "/form", "secret": "cs-3"}, route="http.token")
        bare_view = run(hub, {"path": "/bare", "password": "p4ss-1"}, route="http.headers_only")
        assert {json_view.state, form_view.state, bare_view.state} == {"OK"}
        # The calls themselves went out with every secret in them: only the record is redacted.
        assert b"cs-3" in server.requests[1]["body"] and server.requests[0]["headers"]["X-Api-Key"] == "k-123"
        [sent] = message_detail(current(), json_view.id)["http_exchanges"]
        [form] = message_detail(current(), form_view.id)["http_exchanges"]
        [bare] = message_detail(current(), bare_view.id)["http_exchanges"]
    stored = json.dumps([sent, form, bare])
    for secret in secrets:
        assert secret not in stored, (secret, stored)
    assert json.loads(sent["request_body"]) == {
        "path": "/json",
        "user": "ann",
        "auth": "[redacted]",
        "lines": [{"sku": "s-1", "client_secret": "[redacted]"}],
    }
    assert json.loads(sent["response_body"])["profile"] == {"name": "n", "refresh_token": "[redacted]"}
    assert sent["response_headers"]["x-vendor-ref"] == "[redacted]" == sent["response_headers"]["x-upstream"]
    assert form["request_body"] == "grant_type=client_credentials&client_secret=[redacted]"
    assert bare["request_body"] is None and bare["response_body"] is None and bare["status"] == 200
    with pytest.raises(ConfigurationError):
        HttpCall(record="bodies")  # type: ignore[arg-type]


GREEN_POOL_SCRIPT = """
from gevent import monkey; monkey.patch_all()
import gevent, gevent.pywsgi, sys
from openhub.outbound import http

def answer(environ, start_response):
    gevent.sleep(0.5)  # every call is in flight at once
    start_response("200 OK", [("Content-Length", "2")])
    return [b"{}"]

server = gevent.pywsgi.WSGIServer(("127.0.0.1", 0), answer, log=None)
server.start()
url = f"http://127.0.0.1:{server.server_port}/"
calls = int(sys.argv[1])
call = lambda: http.pooled_client().get(url, timeout=30).raise_for_status()
gevent.joinall([gevent.spawn(call) for _ in range(calls)])
clients = http._clients[__import__("os").getpid()]
clients = clients if isinstance(clients, list) else [clients]
print(len(clients), max(len(c._transport._pool.connections) for c in clients))
"""


def test_a_gevent_process_spreads_its_calls_over_clients_whose_pools_stay_small() -> None:
    """httpcore scans every connection of its pool for each request: one client per gevent process held
    one connection per call in flight, and that scan stalled a worker under load (issue 42). Each of
    GREEN_SHARDS clients now holds its share; a process without gevent keeps one client."""
    pytest.importorskip("gevent")
    import subprocess
    import sys

    from openhub.outbound import http

    calls = 10 * http.GREEN_SHARDS
    done = subprocess.run(
        [sys.executable, "-c", GREEN_POOL_SCRIPT, str(calls)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    clients, largest_pool = map(int, done.stdout.split())
    assert clients == http.GREEN_SHARDS
    assert largest_pool <= calls // http.GREEN_SHARDS, f"one pool held {largest_pool} of {calls} connections"
    assert http.pooled_client() is http.pooled_client()  # this process runs no greenlets: one client


HELD_SCRIPT = """
from gevent import monkey; monkey.patch_all()
import gevent, gevent.pywsgi, sys
from datetime import datetime, timezone
from openhub.core.context import MessageInfo, StepContext
from openhub.outbound import http

def answer(environ, start_response):
    gevent.sleep(0.5)  # every call of a wave is in flight at once
    start_response("200 OK", [("Content-Length", "2")])
    return [b"{}"]

server = gevent.pywsgi.WSGIServer(("127.0.0.1", 0), answer, log=None)
server.start()
url = f"http://127.0.0.1:{server.server_port}/"
at = datetime.now(timezone.utc)
call = http.HttpCall(timeout=30)
seen = {}

def one(i):
    message = MessageInfo(i, f"c-{i}", "S", "s", "o", None, None, None, 0, at, at, None)
    ctx = StepContext(payload={}, message=message, idempotency_key=f"S/c-{i}/k", attempt=1, redelivered=False,
                      custom_data={})
    call.get(ctx, url)

calls = int(sys.argv[1])
for wave in range(2):
    gevent.joinall([gevent.spawn(one, i) for i in range(calls)], raise_error=True)
    clients = [c for _, c in http._idle[__import__("os").getpid()]]
    seen[wave] = {id(c) for c in clients}
    pools = [len(c._transport._pool.connections) for c in clients]
contexts = {id(c._transport._pool._ssl_context) for c in clients}
print(len(seen[0]), len(seen[1]), len(seen[0] & seen[1]), max(pools), len(contexts))
"""


def test_httpcall_holds_a_client_per_call_in_flight_whose_pool_holds_one_connection() -> None:
    """Round 16 clients, a gevent process with hundreds of calls in flight still had each pool scan dozens of
    connections per request (httpcore), and HttpCall cost 0.6 ms of CPU per message more than a bench client
    sharded twice as finely (issue 42, bench/RESULTS.md). Each HttpCall call now holds a client of its own:
    as many clients as calls in flight, each with one connection, the same clients again in the next wave,
    all on the process's one TLS context (httpx reads the CA bundle for each client otherwise: ~60 ms)."""
    pytest.importorskip("gevent")
    import subprocess
    import sys

    calls = 60
    done = subprocess.run([sys.executable, "-c", HELD_SCRIPT, str(calls)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    first, second, both, largest_pool, contexts = map(int, done.stdout.split())
    assert first == calls and second == calls and both == calls, done.stdout
    assert largest_pool == 1 and contexts == 1, done.stdout


def test_a_held_client_goes_back_after_a_failed_call_and_one_idle_too_long_is_closed(monkeypatch, server) -> None:
    from openhub.outbound import http

    with http.held_client() as first:
        with http.held_client() as second:
            assert first is not second  # a client is one call's while it is held
        with pytest.raises(httpx.ConnectError):
            with http.held_client() as again:
                assert again is second  # the one given back last
                again.get(f"http://127.0.0.1:{free_port()}/", timeout=5)
    with http.held_client() as client:
        assert client is first  # the failed call gave its client back: `second` waits under it
        client.post(f"{server.url}/ok").raise_for_status()
    monkeypatch.setattr(http, "IDLE_CLOSE", 0.0)
    with http.held_client() as client:
        assert client is first
    assert second.is_closed and not first.is_closed  # closed as `first` came back, after IDLE_CLOSE unused
    with http.held_client() as client:
        assert client is first and not client.is_closed
