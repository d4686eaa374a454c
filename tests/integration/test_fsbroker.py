"""The embedded broker keeps the order messages were sent in (a split's children go in list order)."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

from openhub.core.config import reset_settings

PROJECT = Path(__file__).resolve().parents[2]


@pytest.fixture
def broker(tmp_path, monkeypatch) -> Any:
    """A connection to the embedded broker as celeryconfig.py names it (its URL, transport and folders)."""
    monkeypatch.setenv("OPENHUB_BROKER_URL", "filesystem://")
    monkeypatch.setenv("OPENHUB_VAR_DIR", str(tmp_path))
    reset_settings()
    try:
        config = runpy.run_path(str(PROJECT / "celeryconfig.py"))
    finally:
        monkeypatch.undo()
        reset_settings()
    with Connection(
        config["broker_url"], transport=config["broker_transport"], transport_options=config["broker_transport_options"]
    ) as conn:
        yield conn


def test_it_is_openhubs_transport(broker: Connection) -> None:
    from openhub.celery.fsbroker import Transport

    assert isinstance(broker.transport, Transport)


def test_messages_sent_in_one_millisecond_are_read_in_the_order_sent(broker: Connection) -> None:
    channel = broker.default_channel
    for n in range(300):  # far more than one millisecond holds
        channel._put("q", {"n": n})
    assert [channel._get("q")["n"] for _ in range(300)] == list(range(300))


def test_its_url_names_a_host_so_kombu_warns_of_none(broker: Connection, caplog) -> None:
    # kombu warned "No hostname was supplied" on every connection: noise in every worker's console.
    with caplog.at_level("WARNING", logger="kombu.connection"):
        broker.info()
    assert "No hostname" not in caplog.text
