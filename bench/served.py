"""`openhub serve` for a benchmark: the schema migrated, the API on a loopback port, answering /healthz.

with served(env, workers=2) as (server, port):
    ...  # http://127.0.0.1:{port}/ answers; server.pid leads a session of its own (its workers)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.backends import free_port
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]
OPENHUB = Path(sys.executable).with_name("openhub")
READY_SECONDS = 60


@contextmanager
def served(
    env: dict[str, str],
    port: int | None = None,
    *,
    workers: int = 1,
    log_level: str = "warning",
    output: Path | None = None,
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """Run `openhub db upgrade`, then `openhub serve` with `env` on `port` (a free one by default), its
    output to `output` (default: this process's); yields (the server, its port) once /healthz answers 200,
    and stops the server's whole session after the block."""
    subprocess.run([OPENHUB, "db", "upgrade"], env=env, cwd=ROOT, check=True, capture_output=True)
    port = port or free_port()
    command = [str(OPENHUB), "serve", "--port", str(port), "--workers", str(workers), "--log-level", log_level]
    log = open(output, "wb") if output is not None else None
    try:
        server = subprocess.Popen(
            command, env=env, cwd=ROOT, start_new_session=True, stdout=log, stderr=subprocess.STDOUT if log else None
        )
    finally:
        if log is not None:
            log.close()  # the server holds its own copy

    def up() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, READY_SECONDS, "openhub serve")
        yield server, port
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
