"""Connection-level limits of a real `openhub serve` (uvicorn + openhub.api.server), not a TestClient.

413 readable by a client that sends its whole body first, 431 for oversized headers, 503 past the
concurrency limit, and an access log that no header can flood or forge.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.support import backends
from tests.support.waiting import wait_for
from tests.support.workers import PROJECT

OPENHUB = str(Path(sys.executable).with_name("openhub"))
KEY = "crm-" + secrets.token_hex(20)
ADMIN = "admin-" + secrets.token_hex(20)


class Served:
    """A running `openhub serve` and what it logged."""

    def __init__(self, port: int, process: subprocess.Popen) -> None:
        self.port, self.process, self.base = port, process, f"http://127.0.0.1:{port}"

    def stop(self) -> str:
        os.killpg(self.process.pid, signal.SIGTERM)
        out, _ = self.process.communicate(timeout=30)
        return out.decode(errors="replace")


@pytest.fixture
def served(backend: backends.Backend, request: pytest.FixtureRequest) -> Iterator[Served]:
    """`openhub serve` on the backend; a test's `@pytest.mark.serve_env(NAME=value)` adds to its environment."""
    backend.activate()
    port = backends.free_port()
    marker = request.node.get_closest_marker("serve_env")
    env = dict(
        os.environ,
        **backend.env,
        OPENHUB_API_KEYS=f"CRM={KEY}",
        OPENHUB_ADMIN_TOKEN=ADMIN,
        OPENHUB_MAX_CONCURRENCY="4",
        PYTHONPATH=str(PROJECT),
        **(marker.kwargs if marker else {}),
    )
    process = subprocess.Popen(
        [OPENHUB, "serve", "--port", str(port)],
        env=env,
        cwd=PROJECT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = Served(port, process)

    def up() -> bool:
        try:
            return httpx.get(f"{server.base}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            assert process.poll() is None, process.stdout.read().decode()  # type: ignore[union-attr]
            return False

    try:
        wait_for(up, 60, "openhub serve to answer /healthz")
        yield server
    finally:
        if process.poll() is None:
            server.stop()


def test_413_is_read_by_a_client_that_sends_the_whole_body_first(served):
    # urllib sends no `Expect: 100-continue` and asks for `Connection: close`.
    request = urllib.request.Request(
        f"{served.base}/api/v1/messages/test/flow",
        data=b"x" * (32 * 1024 * 1024),
        method="POST",
        headers={
            "Authorization": f"Bearer {KEY}",
            "X-Correlation-Id": uuid.uuid4().hex,
            "Content-Type": "application/json",
        },
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 413 and b"over the limit" in refused.value.read()
    assert httpx.get(f"{served.base}/healthz", timeout=5).status_code == 200


def test_oversized_headers_are_431_and_the_server_goes_on(served):
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        try:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 5_000_000 + b"\r\n\r\n")
        except OSError:
            pass  # the hub stopped reading: the answer is already on its way
        assert sock.recv(100).startswith(b"HTTP/1.1 431 ")
    ok = httpx.get(f"{served.base}/healthz", headers={"X-Fine": "a" * 30_000}, timeout=5)
    assert ok.status_code == 200


def test_past_the_concurrency_limit_the_answer_is_503_at_once(served):
    idle = [socket.create_connection(("127.0.0.1", served.port), timeout=10) for _ in range(4)]
    try:
        r = httpx.get(f"{served.base}/healthz", timeout=5)
        assert r.status_code == 503
    finally:
        for sock in idle:
            sock.close()
    wait_for(lambda: httpx.get(f"{served.base}/healthz", timeout=5).status_code == 200, 10, "connections freed")


def test_access_log_carries_no_forged_or_oversized_ids(served):
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    forged = "c-1 message_id=99 status=200"
    with httpx.Client(base_url=served.base, timeout=10) as http:
        http.post("/api/v1/messages/test/flow", content="{}", headers={**headers, "X-Correlation-Id": forged})
        http.post(
            "/api/v1/messages/test/flow",
            content="{}",
            headers={**headers, "X-Correlation-Id": "z" * 60_000, "Authorization": "Bearer wrong"},
        )
        http.get("/healthz", headers={"X-Correlation-Id": "a\x1b[31mred"})
    log = served.stop()
    lines = [line for line in log.splitlines() if "correlation_id=" in line]
    assert len(lines) >= 3 and max(len(line) for line in lines) < 400
    assert f"correlation_id={forged}" not in log and '"c-1 message_id=99 status=200"' in log
    assert "\x1b" not in log and "correlation_id=invalid" in log
    assert KEY not in log


def test_dev_ingress_refuses_oversized_headers_as_serve_does(backend):
    """Issue 27: `openhub dev` ran plain uvicorn, which read 5 MB of headers whole."""
    import threading

    from openhub.dev import _start_ingress

    backend.activate()
    port = backends.free_port()
    server = _start_ingress("127.0.0.1", port, lambda text: None)
    try:
        wait_for(lambda: server.started, 60, "the dev ingress to start")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            try:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 5_000_000 + b"\r\n\r\n")
            except OSError:
                pass  # the hub stopped reading: the answer is already on its way
            assert sock.recv(100).startswith(b"HTTP/1.1 431 ")
    finally:
        server.should_exit = True
        wait_for(lambda: not any(t.name == "ingress" for t in threading.enumerate()), 30, "the dev ingress to stop")


def _from(address: str | None, secret: str) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {secret}"}
    return {**headers, "X-Forwarded-For": address} if address else headers


@pytest.mark.serve_env(OPENHUB_AUTH_FAILURES="5", OPENHUB_TRUSTED_PROXIES="127.0.0.0/8")
def test_wrong_keys_behind_a_trusted_proxy_lock_out_neither_valid_keys_nor_other_clients(served):
    """Issue 34 H1: 20 wrong keys from one address made every source system's valid key and the admin
    token 429 for a minute; behind a proxy every client has its address, so anyone locked everyone out."""
    with httpx.Client(base_url=served.base, timeout=10) as http:
        guesses = [
            http.get("/api/v1/messages", headers=_from("203.0.113.7", f"wrong-{n}")).status_code for n in range(6)
        ]
        assert guesses == [401] * 5 + [429]
        # The same proxy (127.0.0.1) forwards another client: its own count, not the guesser's.
        assert http.get("/api/v1/messages", headers=_from("203.0.113.8", "wrong-x")).status_code == 401
        # A valid key and the admin token are let in even from the guesser's address.
        assert http.get("/api/v1/messages", headers=_from("203.0.113.7", KEY)).status_code == 200
        assert http.get("/api/v1/messages", headers=_from("203.0.113.7", ADMIN)).status_code == 200
        # One wrong secret tried from many addresses is limited by itself.
        same = [
            http.get("/api/v1/messages", headers=_from(f"198.51.100.{n}", "stale-old-key")).status_code
            for n in range(6)
        ]
        assert same == [401] * 5 + [429]


@pytest.mark.serve_env(OPENHUB_AUTH_FAILURES="5", OPENHUB_TRUSTED_PROXIES="192.0.2.1")
def test_forwarded_addresses_from_an_untrusted_peer_are_not_believed(served):
    """OPENHUB_TRUSTED_PROXIES reaches uvicorn: 127.0.0.1, trusted by uvicorn's own default, is not among
    them here, so whatever X-Forwarded-For it sends, every request counts against 127.0.0.1."""
    with httpx.Client(base_url=served.base, timeout=10) as http:
        answers = [
            http.get("/api/v1/messages", headers=_from(f"203.0.113.{n}", f"wrong-{n}")).status_code for n in range(6)
        ]
        assert answers == [401] * 5 + [429]
        assert http.get("/api/v1/messages", headers=_from("203.0.113.99", KEY)).status_code == 200


def test_an_id_header_that_is_not_utf8_is_400(served):
    """Issue 34 L1: header bytes are read as UTF-8 (a client's `ü` is two bytes); bytes that are not are refused."""
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    with httpx.Client(base_url=served.base, timeout=10) as http:
        refused = http.post(
            "/api/v1/messages/test/held",
            content="{}",
            headers={**headers, "X-Correlation-Id": b"latin-1-\xfc-not-utf-8"},
        )
        assert refused.status_code == 400 and refused.json()["detail"] == "X-Correlation-Id is not UTF-8 text"
        cid = f"bestellung-ü-{uuid.uuid4().hex[:6]}"
        accepted = http.post(
            "/api/v1/messages/test/held", content="{}", headers={**headers, "X-Correlation-Id": cid.encode()}
        )
        assert accepted.status_code == 202 and accepted.json()["correlation_id"] == cid, accepted.text
    import openhub

    openhub.cancel(accepted.json()["id"])  # test.held's message is not left for later tests' workers
