"""Fuzz the running HTTP API with schemathesis, as a source system and as the admin: not a CI test.

    PYTHONPATH=. .venv/bin/python bench/fuzz_api.py [--examples 100] [--workers 2]

Starts `openhub serve` on a fresh embedded store (a temporary OPENHUB_VAR_DIR) on a free port, with
the example routes, a source system's key (CRM) and an admin token, then runs `st run` over its
/openapi.json twice: once with the source system's key, once with the admin token. Every check
schemathesis has runs (no 5xx, responses match the documented schema and status codes, ...).
Prints each run's summary, and exits 1 when either run found a failure. The auth-failure limit is
raised for the run: schemathesis also sends requests without credentials on purpose.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SOURCE_KEY = "fuzz-source-key-0123456789abcdef"
ADMIN_TOKEN = "fuzz-admin-token-0123456789abcdef"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"the API did not answer {url} in time")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=100, help="examples per operation (st run -n)")
    parser.add_argument("--workers", type=int, default=2, help="schemathesis workers (st run -w)")
    args = parser.parse_args()
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="openhub-fuzz-") as var:
        env = {**os.environ, "OPENHUB_VAR_DIR": var, "OPENHUB_API_KEYS": f"CRM={SOURCE_KEY}",
               "OPENHUB_ADMIN_TOKEN": ADMIN_TOKEN, "OPENHUB_AUTH_FAILURES": "1000000"}
        subprocess.run([BIN / "openhub", "db", "upgrade"], env=env, check=True, cwd=ROOT, capture_output=True)
        server = subprocess.Popen([BIN / "openhub", "serve", "--port", str(port), "--log-level", "warning"],
                                  env=env, cwd=ROOT)
        failed = False
        try:
            _wait_ready(f"{base}/healthz", time.monotonic() + 60)
            for who, header in (("source system CRM", f"Authorization: Bearer {SOURCE_KEY}"),
                                ("admin", f"Authorization: Bearer {ADMIN_TOKEN}")):
                print(f"== schemathesis as the {who}: {args.examples} examples per operation", flush=True)
                started = time.monotonic()
                run = subprocess.run([BIN / "st", "run", f"{base}/openapi.json", "--checks", "all",
                                      "-n", str(args.examples), "-w", str(args.workers), "-H", header,
                                      "--generation-deterministic", "--no-color"], cwd=var)  # its cache stays out
                print(f"== {who}: exit {run.returncode} in {time.monotonic() - started:.0f} s", flush=True)
                failed |= run.returncode != 0
        finally:
            server.terminate()
            server.wait(timeout=30)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
