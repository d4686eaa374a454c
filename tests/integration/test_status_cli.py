"""`openhub status`: the overview in the terminal, as tables and as JSON, once and with --watch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from openhub.cli import main
from openhub.store.db import utcnow
from tests.support.traffic import EXPECTED, fresh_store, write_known_traffic
from tests.support.waiting import wait_for
from tests.support.workers import PROJECT

OPENHUB = str(Path(sys.executable).with_name("openhub"))


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    with fresh_store(request.param, tmp_path) as url:
        yield url


def test_status_tables_and_json(store: str) -> None:
    ids = write_known_traffic(utcnow())
    shown = CliRunner().invoke(main, ["status", "--no-workers"], catch_exceptions=False)
    assert shown.exit_code == 0, shown.output
    out = shown.output
    assert "finished last hour: 11" in out and "failed 2 (18.2%)" in out
    assert "PARTLY_FAILED 2" in out and "order.bookLine (warehouse closed)" in out
    assert "parked (FAILED_END) messages: " in out and all(str(i) in out for i in ids["failed"])
    assert str(ids["oldest_partly_failed"]) in out and "30m" in out
    as_json = CliRunner().invoke(main, ["status", "--json", "--no-workers"], catch_exceptions=False)
    figures = json.loads(as_json.output)
    assert figures["live_by_state"] == EXPECTED["live"] and figures["workers"] is None


def test_status_and_drain_print_an_operators_reason_as_text(store: str) -> None:
    """Issue 27: a reason with `[/]` crashed rich's markup parser; its control characters reached the terminal."""
    from openhub.service import actions as operator

    operator.drain("upgrade [/] \x9b2J")
    try:
        shown = CliRunner().invoke(main, ["status", "--no-workers"], catch_exceptions=False)
        told = CliRunner().invoke(main, ["drain", "--status"], catch_exceptions=False)
    finally:
        operator.undrain()
    assert shown.exit_code == 0 and told.exit_code == 0, shown.output + told.output
    assert "draining (upgrade [/] \\x9b2J)" in shown.output and "draining (upgrade [/] \\x9b2J)" in told.output
    assert "\x9b" not in shown.output + told.output


def test_status_says_when_workers_cannot_be_asked(store: str, monkeypatch) -> None:
    from openhub.celery import dispatch
    from openhub.core.config import reset_settings

    monkeypatch.setenv("OPENHUB_BROKER_URL", "redis://127.0.0.1:9/0")
    reset_settings()
    dispatch.reset_app()
    try:
        shown = CliRunner().invoke(main, ["status"], catch_exceptions=False)
        assert "workers: unknown (the broker could not be asked)" in shown.output
    finally:
        dispatch.reset_app()
        reset_settings()


def test_status_watch_redraws_until_interrupted(store: str, tmp_path: Path) -> None:
    write_known_traffic(utcnow())
    env = {**os.environ, "OPENHUB_DATABASE_URL": store, "PYTHONPATH": str(PROJECT)}
    out = tmp_path / "out.jsonl"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [OPENHUB, "status", "--watch", "0.2", "--json", "--no-workers"],
            env=env,
            cwd=PROJECT,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for(lambda: out.read_text().count("\n") >= 3, 60, "three refreshes")
        finally:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=30) == 0  # Ctrl-C ends it cleanly, no traceback
    lines = out.read_text().splitlines()
    assert all(json.loads(line)["finished"]["hour_total"]["finished"] == 11 for line in lines[:3])


def test_status_watch_writes_each_refresh_to_a_pipe(store: str, tmp_path: Path) -> None:
    # Issue 40: without --json, `openhub status --watch | tee` showed nothing (rich's Live redraws in place).
    write_known_traffic(utcnow())
    env = {**os.environ, "OPENHUB_DATABASE_URL": store, "PYTHONPATH": str(PROJECT)}
    out = tmp_path / "out.txt"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [OPENHUB, "status", "--watch", "0.2", "--no-workers"],
            env=env,
            cwd=PROJECT,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for(lambda: out.read_text().count("openhub status at") >= 2, 60, "two refreshes")
        finally:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=30) == 0
    assert "finished last hour: 11" in out.read_text() and "Traceback" not in out.read_text()
