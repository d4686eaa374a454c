"""What every entry refuses before anything is stored (producer checks), through Python on both backends.

The HTTP ingress, the CLI and split children go through the same `producer.prepare`; the HTTP
side of each refusal is in tests/integration/api/test_hostile_input_api.py.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy.exc import DataError

import openhub
from openhub.api.app import with_settings
from openhub.core.errors import InputError
from openhub.engine.intake import insert_new_many, nesting_depth, prepare
from tests.support import promise_routes
from tests.support.process_store import transaction


@pytest.fixture
def active(backend):
    backend.activate()
    return backend


def nested(depth: int) -> object:
    value: object = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def test_nesting_depth_is_measured_without_recursion():
    assert nesting_depth("x", 5) == 0 and nesting_depth({"a": [1]}, 5) == 2
    assert nesting_depth(nested(100_000), 64) == 65  # stops counting past the limit


@pytest.mark.parametrize("payload", [nested(65), nested(255), nested(5000)])
def test_payload_nested_past_the_limit_is_refused(active, payload):
    cid = uuid.uuid4().hex
    with pytest.raises(InputError, match="OPENHUB_MAX_NESTING"):
        openhub.submit("test.flow", payload, source_system="CRM", correlation_id=cid)
    assert openhub.list_messages(correlation_id=cid) == []


def test_payload_at_the_limit_is_accepted_and_readable(active):
    view = openhub.submit(
        "test.flow", {"prefix": "/x", "deep": nested(60)}, source_system="CRM", correlation_id=uuid.uuid4().hex
    )
    assert openhub.get_message(view.id).payload["deep"] == nested(60)


@pytest.mark.parametrize("field", ["correlation_id", "process_id", "source_system"])
@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\x1b[31mb", "a\x00b", "a\x85b", "a\u2028b", "a\x7fb"])
def test_control_characters_in_ids_are_refused(active, field, bad):
    item = {"route": "test.flow", "payload": {}, "source_system": "CRM", "correlation_id": uuid.uuid4().hex, field: bad}
    with pytest.raises(InputError, match="control characters"):
        openhub.submit_many([item])


def test_markup_and_split_separator_in_ids_are_kept_verbatim(active):
    cid = f"[bold red]x[/]#1.2-{uuid.uuid4().hex}"
    view = openhub.submit("test.flow", {}, source_system="CRM", correlation_id=cid)
    assert openhub.get_message(view.id).correlation_id == cid


def test_an_entity_type_longer_than_its_column_is_refused(active):
    # A split child's entity type comes from route code: refused with a reason (the split rejects the
    # parent with it), not cut short by the store or failing there.
    with pytest.raises(InputError, match="entity_type is longer than 100 characters"):
        prepare("test.flow", {}, source_system="CRM", correlation_id=uuid.uuid4().hex, entity_type="e" * 101)


def test_a_value_longer_than_its_column_is_refused_on_postgresql_not_cut_short(local_store):
    # The batch insert passes one array per column: an array cast to VARCHAR(100)[] would cut a longer
    # value short without a word where the column itself refuses it.
    with promise_routes.local_hub(OPENHUB_DATABASE_URL=local_store):
        row = prepare("p.flow", {}, source_system="CRM", correlation_id=uuid.uuid4().hex)
        with pytest.raises(DataError, match="too long"), transaction() as conn:
            insert_new_many(conn, [dict(row, entity_type="e" * 150)])
        assert openhub.list_messages(correlation_id=row["correlation_id"]) == []


def test_timestamp_beyond_the_clock_skew_is_refused(active):
    now = datetime.now(timezone.utc)
    for far in (now + timedelta(seconds=301), "9999-12-31T23:59:59Z"):
        cid = uuid.uuid4().hex
        with pytest.raises(InputError, match="OPENHUB_MAX_CLOCK_SKEW"):
            openhub.submit("test.flow", {}, source_system="CRM", correlation_id=cid, msg_timestamp=far)
        assert openhub.list_messages(correlation_id=cid) == []
    ok = openhub.submit(
        "test.flow",
        {},
        source_system="CRM",
        correlation_id=uuid.uuid4().hex,
        msg_timestamp=now + timedelta(seconds=200),
    )
    assert ok.msg_timestamp is not None


def test_clock_skew_is_configurable(active, monkeypatch):
    monkeypatch.setenv("OPENHUB_MAX_CLOCK_SKEW", "0")
    from openhub.core.config import Settings

    assert Settings.from_env().max_clock_skew == timedelta(0)
    from openhub.engine.hub import current

    hub = dataclasses.replace(current(), settings=with_settings(max_clock_skew=timedelta(0)))
    with pytest.raises(InputError):
        openhub.submit(
            "test.flow",
            {},
            source_system="CRM",
            correlation_id=uuid.uuid4().hex,
            msg_timestamp=datetime.now(timezone.utc) + timedelta(seconds=5),
            hub=hub,
        )


def test_a_funnel_belongs_to_its_source_system(active):
    shop = openhub.submit("test.funnel", {"group": "g"}, source_system="SHOP", correlation_id=uuid.uuid4().hex)
    crm = openhub.submit("test.funnel", {"group": "g"}, source_system="CRM", correlation_id=uuid.uuid4().hex)
    assert shop.funnel != crm.funnel


def test_a_response_nested_past_the_limit_is_refused(active):
    view = openhub.submit("test.flow", {}, source_system="CRM", correlation_id=uuid.uuid4().hex)
    with pytest.raises(InputError, match="response is nested deeper"):
        openhub.respond(view.id, nested(65))
