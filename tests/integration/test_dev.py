"""`openhub dev` (what `make run` runs): it starts, says it is ready, and Ctrl+C ends it cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support import backends
from tests.support.waiting import wait_for
from tests.support.workers import PROJECT

OPENHUB = str(Path(sys.executable).with_name("openhub"))


def test_ctrl_c_ends_openhub_dev_with_status_0_and_no_traceback(tmp_path: Path) -> None:
    # Issue 40: Ctrl+C on `make run` ended in make's "Error 1" (the worker's status on its way out, passed
    # on), and as root Celery's SecurityWarning paragraph filled the screen at every start.
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENHUB_")}  # the embedded default
    env.update(OPENHUB_VAR_DIR=str(tmp_path / "var"), PYTHONPATH=str(PROJECT))
    out = tmp_path / "dev.log"
    with out.open("w") as sink:
        # Its own process group, as a terminal's foreground job: Ctrl+C is SIGINT to every process of it.
        proc = subprocess.Popen(
            [OPENHUB, "dev", "--port", str(backends.free_port()), "--example-port", "0"],
            env=env,
            cwd=PROJECT,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_for(
                lambda: (
                    "celery@" in out.read_text()
                    and "ready." in out.read_text()
                    and "Press Ctrl+C to stop" in out.read_text()
                ),
                180,
                "openhub dev to be ready",
            )
            os.killpg(proc.pid, signal.SIGINT)
            time.sleep(0.5)  # the person presses Ctrl+C again while the worker shuts down: what is tested
            os.killpg(proc.pid, signal.SIGINT)
            code = proc.wait(timeout=90)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    text = out.read_text()
    assert code == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    if os.geteuid() == 0:
        assert "SecurityWarning" not in text and "running as root, fine for trying openhub out" in text
