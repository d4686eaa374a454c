"""`openhub dev`: the whole hub on the embedded default in one command.

It starts the simulated external systems the example routes call, a Celery worker with an
embedded beat (`celery -A tasks worker -B`, a subprocess: only tasks/ talks to Celery) and,
when the HTTP face is installed, the ingress on http://127.0.0.1:8000.
"""

from __future__ import annotations

import base64
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from openhub.core import logs
from openhub.testing import ExternalSystem

EXAMPLE_PORT = 8765
READY_TIMEOUT = 60  # seconds to wait for the worker before printing how to use the hub anyway


def run_dev(
    host: str = "127.0.0.1",
    port: int = 8000,
    concurrency: int = 2,
    failure_rate: float = 0.2,
    announce: Any = print,
    example_port: int = EXAMPLE_PORT,
) -> int:
    """Run the simulator, a worker with beat and the ingress until interrupted; returns an exit code: 0
    when stopped (Ctrl+C, SIGTERM), the worker's when it ended on its own."""
    external = ExternalSystem(failure_rate=failure_rate).start(port=example_port)
    env = dict(os.environ)
    env.setdefault("OPENHUB_EXAMPLE_URL", external.url)
    env.setdefault("OPENHUB_RETRY_INTERVAL", "5")
    env.setdefault("OPENHUB_POLL_INTERVAL", "1")
    shown = ["OPENHUB_EXAMPLE_URL", "OPENHUB_RETRY_INTERVAL", "OPENHUB_POLL_INTERVAL"]
    if "OPENHUB_CONFIRM_ENDPOINTS" not in env and "OPENHUB_CONFIRM_SECRETS" not in env:
        # The example CRM takes the stock confirmation protocol (README), signed with a secret of this run's.
        env["OPENHUB_CONFIRM_ENDPOINTS"] = f"CRM={external.url}/crm/confirmations"
        env["OPENHUB_CONFIRM_SECRETS"] = "CRM=whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
        shown += ["OPENHUB_CONFIRM_ENDPOINTS", "OPENHUB_CONFIRM_SECRETS"]
    os.environ.update({k: env[k] for k in shown})
    if _root():
        # Celery warns a worker run as root in a paragraph at every start: right for a deployment (deploy/
        # runs workers as an unprivileged user), noise for trying the hub out in a container. Said once here.
        # (PYTHONWARNINGS takes no category of a package's, so the warning is told by its first words.)
        env["PYTHONWARNINGS"] = ",".join(
            filter(None, [env.get("PYTHONWARNINGS"), "ignore:You're running the worker with superuser"])
        )
        announce(
            "openhub dev: running as root, fine for trying openhub out; run the workers of a real hub as "
            "an unprivileged user (deploy/ does)"
        )
    heartbeat = _heartbeat_file(env)
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
            str(concurrency),
        ],
        env=env,
    )
    announce(
        f"openhub dev: external systems simulated at {external.url} "
        f"({int(failure_rate * 100)}% of calls fail with 503, to show retries)"
    )
    announce("openhub dev: worker + beat started (celery -A tasks worker -B)")
    credentials: list[str] = []
    server = _start_ingress(host, port, lambda text: (announce(text), credentials.append(text)))
    stop = threading.Event()  # set when asked to stop: Ctrl+C or SIGTERM
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        # The worker's start-up banner and the ingress's lines come after the credentials: once the worker
        # is ready, they are printed again with what to do next, as the last lines on the screen.
        for _ in range(READY_TIMEOUT * 5):
            if heartbeat.exists() or worker.poll() is not None or stop.wait(0.2):
                break
        announce(_ready_box(host, port, server is not None, credentials))
        while not stop.is_set() and worker.poll() is None:
            stop.wait(0.5)
    except KeyboardInterrupt:
        stop.set()
    finally:
        # A second Ctrl+C while the worker shuts down is the worker's (Celery's cold shutdown, from the
        # terminal), not a traceback of this process's.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if server is not None:
            server.should_exit = True
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
        external.stop()
    # Asked to stop, the worker's own status on the way out (1 after the terminal's Ctrl+C and this SIGTERM
    # met in its shutdown) is no failure: `make run` would end in make's "Error 1".
    return 0 if stop.is_set() else worker.wait() or 0


def _root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _heartbeat_file(env: dict[str, str]) -> Path:
    """The file the worker touches once it is ready (tasks/heartbeat.py), removed so a stale one does not count."""
    from openhub.core.config import get_settings

    default = Path(get_settings().var_dir) / "dev-worker.heartbeat"
    path = Path(env.setdefault("OPENHUB_WORKER_HEARTBEAT_FILE", str(default)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    return path


def _ready_box(host: str, port: int, serving: bool, credentials: list[str]) -> str:
    """What a newcomer needs once everything runs: where, with which secrets, and the first commands."""
    rule = "=" * 78
    lines = [rule, "openhub dev is ready."]
    if serving:
        lines.append(f"  HTTP API http://{host}:{port}   admin page http://{host}:{port}/admin   OpenAPI /docs")
    lines += [
        line.replace("openhub dev: ", "")
        for text in credentials
        for line in text.splitlines()
        if "API key" in line or "admin token" in line
    ]
    lines += [
        "Submit a message from another terminal:",
        "  .venv/bin/openhub submit customer.setCustomer --source-system CRM --correlation-id c-1 \\",
        '      --payload \'{"externalCustomerId": "42", "name": "Ada"}\'',
        "  .venv/bin/openhub messages list      .venv/bin/openhub demo      .venv/bin/openhub status --watch",
        "Press Ctrl+C to stop.",
        rule,
    ]
    return "\n".join(lines)


def _start_ingress(host: str, port: int, announce: Any) -> Any:
    try:
        import uvicorn

        from openhub.api.app import create_app  # the HTTP face
        from openhub.api.server import uvicorn_options
    except ImportError:
        announce("openhub dev: HTTP ingress not available; submit from Python or the CLI")
        return None
    # The same header bound, protocol and concurrency limit as `openhub serve`: dev may listen beyond loopback.
    config = uvicorn.Config(
        create_app(dev=True, announce=announce), host=host, port=port, log_level="info", **uvicorn_options()
    )
    # Its lines redacted and about their message as `openhub serve`'s are (openhub.core.logs; the worker's own).
    from openhub.core.config import get_settings

    handlers = [h for name in ("uvicorn", "uvicorn.access") for h in logging.getLogger(name).handlers]
    logs.install(handlers, get_settings().log_format)
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    threading.Thread(target=server.run, name="ingress", daemon=True).start()
    announce(f"openhub dev: HTTP API on http://{host}:{port} (admin page: /admin, OpenAPI: /openapi.json)")
    return server
