"""Issue 34: planted secrets read back from every place the hub writes text, as each role.

Real processes on both backends: `openhub serve`, a `celery -A tasks worker` with beat, tracing on to an
OTLP receiver, a confirmation receiver and an external system that echoes every request in its answers
(tests/support/planted.py). tests/support/secret_routes.py sends the planted secrets every way a route can;
every message ends, is confirmed and alerted on. Then no planted secret may appear in: any API answer about
the messages (as the source system and as the admin), the command line's (`messages show/list`,
`confirmations list`), the worker's and the ingress's logs, any exported span, any confirmation or alert
received, or any text the store keeps (every column of every table but the payload as submitted).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from sqlalchemy import inspect as db_inspect
from sqlalchemy import select

from openhub.store.schema import Base
from tests.support import backends
from tests.support.otlp import Receiver as TraceReceiver
from tests.support.planted import EchoSystem, Receiver, leaks, masked_payload, plant, read_back, submit_all
from tests.support.process_store import transaction
from tests.support.waiting import wait_final, wait_for
from tests.support.workers import PROJECT, Worker

OPENHUB = str(Path(sys.executable).with_name("openhub"))
KEY = "vault-" + secrets.token_hex(20)
ADMIN = "admin-" + secrets.token_hex(20)


@pytest.fixture(params=["embedded", "redis-pg"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[backends.Backend]:
    """A store and broker of this test's own (its routes are not the session worker's)."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("OPENHUB_")}
    with backends.backend(
        request.param, tmp_path / "store", {"OPENHUB_ROUTES": "tests.support.secret_routes", "OPENHUB_MAX_FAILS": "2"}
    ) as b:
        yield b
    backends.activate(saved)


def test_no_planted_secret_is_in_any_text_the_hub_keeps_shows_logs_exports_or_sends(store, tmp_path) -> None:
    planted = plant()
    echo, receiver, traces = EchoSystem(), Receiver(), TraceReceiver()
    env = {
        **store.env,
        "OPENHUB_TEST_PLANTED": json.dumps(planted),
        "OPENHUB_TEST_ECHO_URL": echo.url,
        "OPENHUB_TEST_RECEIVER_URL": receiver.url,
        "OPENHUB_API_KEYS": f"VAULT={KEY}",
        "OPENHUB_ADMIN_TOKEN": ADMIN,
        "OPENHUB_CONFIRM_SECRETS": f"VAULT=whsec_{'Q' * 43}=",
        "OPENHUB_WEBHOOK_SECRET": f"whsec_{'R' * 43}=",
        "OPENHUB_WEBHOOK_URL": f"{receiver.url}/stock?token={planted['receiver_token']}",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": traces.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    backends.activate({k: v for k, v in env.items() if k.startswith("OPENHUB_")})
    worker = Worker(env, tmp_path, beat=True, concurrency=2).start()
    port = backends.free_port()
    serve_log = tmp_path / "serve.log"
    with open(serve_log, "wb") as out:
        serve = subprocess.Popen(
            [OPENHUB, "serve", "--port", str(port)],
            env=dict(os.environ, **env, PYTHONPATH=str(PROJECT)),
            cwd=PROJECT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            assert serve.poll() is None, serve_log.read_text()
            try:
                return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 60, "openhub serve")
        ids = submit_all(base, KEY, planted, secrets.token_hex(4))
        ended = {route: wait_final(message_id, timeout=90).state for route, message_id in ids.items()}
        assert ended == {
            "fail": "FAILED",
            "conflict": "OK",
            "webhook": "FAILED",
            "newline": "FAILED",
            "card": "FAILED",
        }, ended
        # confirmations (5), the routes' alerts and the stock webhook's (4 FAILED each)
        wait_for(lambda: len(receiver.posts) >= 13, 60, "every confirmation and alert")
        texts = read_back(base, KEY, ADMIN, ids.values())
        detail = httpx.get(f"{base}/api/v1/messages/{ids['card']}", headers={"Authorization": f"Bearer {ADMIN}"})
        assert detail.json()["payload"]["card"] == masked_payload(planted)
        cli = {}
        for args in [["messages", "show", str(i)] for i in ids.values()] + [
            ["messages", "list", "--json", "--limit", "100"],
            ["confirmations", "list"],
        ]:
            shown = subprocess.run(
                [OPENHUB, *args],
                env=dict(os.environ, **env, PYTHONPATH=str(PROJECT)),
                cwd=PROJECT,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert shown.returncode == 0, shown.stderr
            cli[f"openhub {' '.join(args)}"] = shown.stdout + shown.stderr
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGTERM)
            serve.wait(timeout=30)
        worker.stop()  # its processes export the spans they still hold
    try:
        sent = json.dumps(echo.requests)  # (a URL's fragment is not sent; its userinfo goes as Basic auth)
        assert [k for k, v in planted.items() if v not in sent] == [
            "userinfo",
            "fragment",
            "newline_token",
            "card_pin",
            "card_cvc",
            "receiver_token",
        ]
        stored = {}
        with transaction() as conn:
            for table in Base.metadata.sorted_tables:
                columns = [c for c in table.columns if not (table.name == "messages" and c.name == "payload")]
                stored[f"store {table.name}"] = repr(conn.execute(select(*columns)).all())
        assert set(db_inspect(conn.engine).get_table_names()) >= {t.name for t in Base.metadata.sorted_tables}
        spans = {f"span {s.name} {n}": s.texts() for n, s in enumerate(traces.spans)}
        assert any(name.startswith("span step secret.") for name in spans), list(spans)[:20]
        received = {
            f"received {p['path'].split('?')[0]} {n}": json.dumps([p["headers"], p["body"]])
            for n, p in enumerate(receiver.posts)
        }
        found = leaks(
            {
                **texts,
                **cli,
                **stored,
                **spans,
                **received,
                "worker log": worker.log(),
                "serve log": serve_log.read_text(),
            },
            planted,
        )
        assert found == [], "\n".join(found)
    finally:
        echo.stop()
        receiver.stop()
        traces.stop()
