"""Fuzz the running HTTP API with schemathesis, as a source system and as the admin, then plant secrets
and look for them everywhere: not a CI test.

    PYTHONPATH=. .venv/bin/python bench/fuzz_api.py [--examples 100] [--workers 2] [--planted-only]

Starts `openhub serve` on a fresh embedded store (a temporary OPENHUB_VAR_DIR) on a free port, with
the example routes and tests/support/secret_routes.py, source systems' keys (CRM; VAULT for the secret
routes) and an admin token, a worker with beat, tracing to an OTLP receiver, then runs `st run` over its
/openapi.json twice: once with CRM's key, once with the admin token. Every check schemathesis has runs (no 5xx,
responses match the documented schema and status codes, ...). The auth-failure limit is raised for
the run: schemathesis also sends requests without credentials on purpose.

Then the planted secrets (tests/support/planted.py): a message to each secret route, sending them every
way a route can to an external system that echoes them back; once every message has ended, every answer
of the API about them as the source system and as the admin, the ingress's and the worker's logs, every
exported span and every confirmation and alert received are searched for them.
Prints each part's summary, and exits 1 when one found a failure or a secret.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SOURCE_KEY = "fuzz-source-key-0123456789abcdef"
ADMIN_TOKEN = "fuzz-admin-token-0123456789abcdef"
VAULT_KEY = "fuzz-vault-key-0123456789abcdefgh"  # the source system of tests/support/secret_routes.py


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _planted(base: str, worker_log: Path, serve_log: Path, planted: dict[str, str], echo, receiver, traces) -> bool:
    """Submit the secret routes' messages, wait for their end and search every text; True when clean."""
    import httpx

    from tests.support.planted import leaks, read_back, submit_all

    print("== planted secrets: a message per secret route", flush=True)
    ids = submit_all(base, VAULT_KEY, planted, f"planted-{int(time.time())}")
    deadline = time.monotonic() + 180
    with httpx.Client(base_url=base, timeout=10, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
        while time.monotonic() < deadline:
            states = {route: http.get(f"/api/v1/messages/{i}").json()["state"] for route, i in ids.items()}
            if all(state in ("OK", "FAILED") for state in states.values()) and len(receiver.posts) >= 9:
                break
            time.sleep(1)
    print(f"== planted: ended {states}, {len(receiver.posts)} notifications received", flush=True)
    texts = read_back(base, VAULT_KEY, ADMIN_TOKEN, ids.values())
    time.sleep(2)  # the processes' span exporters send every 0.1 s
    texts.update({f"span {n} {s.name}": s.texts() for n, s in enumerate(traces.spans)})
    texts.update({f"received {n}": json.dumps([p["headers"], p["body"]]) for n, p in enumerate(receiver.posts)})
    texts.update(
        {"serve log": serve_log.read_text(errors="replace"), "worker log": worker_log.read_text(errors="replace")}
    )
    found = leaks(texts, planted)
    print(
        f"== planted: {len(planted)} secrets searched in {len(texts)} texts ({len(traces.spans)} spans): "
        f"{len(found)} found",
        flush=True,
    )
    for where in found:
        print("   ", where)
    return not found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=100, help="examples per operation (st run -n)")
    parser.add_argument("--workers", type=int, default=2, help="schemathesis workers (st run -w)")
    parser.add_argument("--planted-only", action="store_true", help="skip schemathesis, plant secrets only")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from bench.served import served
    from tests.support.otlp import Receiver as TraceReceiver
    from tests.support.planted import EchoSystem, Receiver, plant

    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    planted, echo, receiver, traces = plant(), EchoSystem(), Receiver(), TraceReceiver()
    with tempfile.TemporaryDirectory(prefix="openhub-fuzz-") as var:
        env = {
            **os.environ,
            "OPENHUB_VAR_DIR": var,
            "OPENHUB_API_KEYS": f"CRM={SOURCE_KEY},VAULT={VAULT_KEY}",
            "OPENHUB_ADMIN_TOKEN": ADMIN_TOKEN,
            "OPENHUB_AUTH_FAILURES": "1000000",
            "OPENHUB_ROUTES": "routes,tests.support.secret_routes",
            "OPENHUB_MAX_FAILS": "2",
            "OPENHUB_RETRY_INTERVAL": "1",
            "OPENHUB_POLL_INTERVAL": "1",
            "PYTHONPATH": str(ROOT),
            "OPENHUB_TEST_PLANTED": json.dumps(planted),
            "OPENHUB_TEST_ECHO_URL": echo.url,
            "OPENHUB_TEST_RECEIVER_URL": receiver.url,
            "OPENHUB_WEBHOOK_URL": f"{receiver.url}/stock?token={planted['receiver_token']}",
            "OPENHUB_CONFIRM_SECRETS": f"VAULT=whsec_{'Q' * 43}=",
            "OPENHUB_WEBHOOK_SECRET": f"whsec_{'R' * 43}=",
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": traces.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        serve_log, worker_log = Path(var) / "serve.log", Path(var) / "worker.log"
        stack = contextlib.ExitStack()
        stack.enter_context(served(env, port, log_level="info", output=serve_log))
        with open(worker_log, "wb") as out:
            worker = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "tasks",
                    "worker",
                    "-B",
                    "--loglevel",
                    "INFO",
                    "--concurrency",
                    "2",
                    "--schedule",
                    str(Path(var) / "beat"),
                ],
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        failed = False
        try:
            roles = (
                ("source system CRM", f"Authorization: Bearer {SOURCE_KEY}"),
                ("admin", f"Authorization: Bearer {ADMIN_TOKEN}"),
            )
            for who, header in () if args.planted_only else roles:
                print(f"== schemathesis as the {who}: {args.examples} examples per operation", flush=True)
                started = time.monotonic()
                run = subprocess.run(
                    [
                        BIN / "st",
                        "run",
                        f"{base}/openapi.json",
                        "--checks",
                        "all",
                        "-n",
                        str(args.examples),
                        "-w",
                        str(args.workers),
                        "-H",
                        header,
                        "--generation-deterministic",
                        "--no-color",
                    ],
                    cwd=var,
                )  # its cache stays out
                print(f"== {who}: exit {run.returncode} in {time.monotonic() - started:.0f} s", flush=True)
                failed |= run.returncode != 0
            failed |= not _planted(base, worker_log, serve_log, planted, echo, receiver, traces)
        finally:
            stack.close()
            worker.terminate()
            worker.wait(timeout=60)
            for stopped in (echo, receiver, traces):
                stopped.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
