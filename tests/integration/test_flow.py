"""The core behaviour (README.md, "How it works" and "Defining routes") with real workers, on both backends."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select

import openhub
from openhub.store.schema import messages, transitions
from tests.support.process_store import transaction
from tests.support.waiting import wait_final, wait_for, wait_state

pytestmark = pytest.mark.usefixtures("hub")


def submit(route: str, prefix: str, source: str = "CRM", **payload) -> openhub.MessageView:
    return openhub.submit(
        route, {"prefix": prefix, **payload}, source_system=source, correlation_id=f"c-{uuid.uuid4().hex}"
    )


def events(message_id: int) -> list[tuple[str, str]]:
    with transaction() as conn:
        rows = conn.execute(
            select(transitions.c.event, transitions.c.to_state)
            .where(transitions.c.message_id == message_id)
            .order_by(transitions.c.id)
        )
        return [(e, s) for e, s in rows]


def test_three_steps_reach_ok_each_called_once(svc, prefix, external) -> None:
    m = submit(f"{svc}.flow", prefix)
    assert m.state in ("NEW", "IN_QUEUE") and not m.duplicate
    done = wait_final(m.id)
    assert done.state == "OK" and done.failed_count == 0, (done.state, done.failed_count, done.failed_error)
    assert [external.count(f"{prefix}/{s}") for s in "abc"] == [1, 1, 1]
    assert [(c.step, c.state) for c in done.ext_calls] == [("a", "OK"), ("b", "OK"), ("c", "OK")]
    assert events(m.id)[0] == ("accepted", "NEW")
    assert ("claimed", "PROCESSING") in events(m.id) and events(m.id)[-1] == ("completed", "OK")


def test_transient_failure_resumes_at_the_failed_step(svc, prefix, external) -> None:
    external.fail(f"{prefix}/b", times=1)
    m = submit(f"{svc}.flow", prefix)
    done = wait_final(m.id)
    assert done.state == "OK" and done.failed_count == 1
    # a succeeded once and was not called again; b failed once, then succeeded.
    assert external.count(f"{prefix}/a") == 1
    assert external.count(f"{prefix}/b", 503) == 1 and external.count(f"{prefix}/b", 200) == 1
    assert external.count(f"{prefix}/c") == 1
    assert done.custom_data["a_attempt"] == 1 and done.custom_data["b_attempt"] == 2
    assert "503" in (done.failed_error or "")
    assert [e for e, _ in events(m.id)].count("transient") == 1
    with transaction() as conn:  # each claim names the step its attempt starts at: the retry's is b
        claimed = (
            conn.execute(
                select(transitions.c.step_key)
                .where(transitions.c.message_id == m.id, transitions.c.event == "claimed")
                .order_by(transitions.c.id)
            )
            .scalars()
            .all()
        )
    assert claimed == ["a", "b"]


def test_failing_past_max_fails_is_failed(svc, prefix, external) -> None:
    external.fail(f"{prefix}/fragile", times=10)
    m = submit(f"{svc}.fragile", prefix)
    done = wait_final(m.id)
    assert done.state == "FAILED"
    assert done.failed_count == 3  # max_fails=2: the third failure fails the message
    assert external.count(f"{prefix}/fragile") == 3 and external.count(f"{prefix}/a") == 1
    assert done.failed_step == "fragile" and "HTTPStatusError" in done.failed_error


def test_reject_fails_at_once_and_is_a_dead_letter(svc, prefix, external) -> None:
    m = submit(f"{svc}.flow", prefix, script={"b": {"reject": True}})
    done = wait_final(m.id)
    assert done.state == "FAILED" and done.failed_count == 1
    assert "Reject: b refuses this message [E400]" in done.failed_error
    assert external.count(f"{prefix}/b") == 1 and external.count(f"{prefix}/c") == 0
    assert m.id in [v.id for v in openhub.list_messages(state="FAILED", limit=1000)]


def test_no_effect_retries_without_counting(svc, prefix, external) -> None:
    m = submit(f"{svc}.flow", prefix, script={"b": {"no_effect_once": True}})
    done = wait_final(m.id)
    assert done.state == "OK" and done.failed_count == 0
    assert ("no_effect", "PARTLY_FAILED") in events(m.id)
    assert external.count(f"{prefix}/b") == 1


def test_postpone_then_ok(svc, prefix, external) -> None:
    m = submit(f"{svc}.flow", prefix, script={"c": {"postpone_once": True}})
    done = wait_final(m.id)
    assert done.state == "OK" and done.failed_count == 0
    assert ("postponed", "POSTPONED") in events(m.id)
    assert [external.count(f"{prefix}/{s}") for s in "abc"] == [1, 1, 1]


def test_business_error_is_recorded_and_route_goes_on(svc, prefix, external) -> None:
    m = submit(f"{svc}.flow", prefix, script={"a": {"business_error": "E410"}})
    done = wait_final(m.id)
    assert done.state == "OK"
    assert done.business_errors == [{"code": "E410", "text": "a refused part of it"}]
    assert external.count(f"{prefix}/c") == 1


def test_step_over_its_timeout_is_transient(svc, prefix, external) -> None:
    external.delay(f"{prefix}/slow", 4)  # the step's timeout is 2 s
    m = submit(f"{svc}.slow", prefix)
    wait_for(lambda: openhub.get_message(m.id).failed_count >= 1, 60, "the slow step to time out")
    external.delay(f"{prefix}/slow", 0)
    done = wait_final(m.id)
    assert done.state == "OK" and done.failed_count >= 1
    assert "TimeLimitExceeded" in (done.failed_error or "")
    assert external.count(f"{prefix}/a") == 1


def test_duplicate_correlation_id_stores_nothing(prefix) -> None:
    cid = f"dup-{uuid.uuid4().hex}"
    first = openhub.submit("test.flow", {"prefix": prefix}, source_system="CRM", correlation_id=cid)
    again = openhub.submit("test.flow", {"prefix": prefix, "other": 1}, source_system="CRM", correlation_id=cid)
    assert again.duplicate and again.id == first.id and again.payload == {"prefix": prefix}
    with transaction() as conn:
        assert conn.execute(select(func.count()).where(messages.c.correlation_id == cid)).scalar() == 1
    other_system = openhub.submit("test.flow", {"prefix": prefix}, source_system="SHOP", correlation_id=cid)
    assert not other_system.duplicate and other_system.id != first.id
    wait_final(first.id)
    wait_final(other_system.id)


def _count() -> int:
    with transaction() as conn:
        return conn.execute(select(func.count()).select_from(messages)).scalar()


@pytest.mark.parametrize(
    "route, payload, kwargs, error, text",
    [
        ("nope.route", {}, {}, openhub.UnknownRouteError, "unknown route 'nope.route'"),
        ("test.flow", {"x": {1, 2}}, {}, openhub.InputError, "not JSON-serialisable"),
        ("test.flow", {"x": float("nan")}, {}, openhub.InputError, "NaN"),
        ("test.flow", {}, {"correlation_id": ""}, openhub.InputError, "correlation_id is required"),
        ("test.flow", {}, {"source_system": None}, openhub.InputError, "source_system is required"),
        ("test.flow", {"big": "x" * 2_000_000}, {}, openhub.PayloadTooLarge, "OPENHUB_MAX_PAYLOAD_BYTES"),
        ("test.flow", {}, {"msg_timestamp": "yesterday"}, openhub.InputError, "ISO 8601"),
        ("test.entity", {"noid": 1}, {}, openhub.InputError, "cannot compute object_id"),
        ("test.flow", {"x": "\ud800"}, {}, openhub.InputError, "not valid Unicode"),
        ("test.flow", {}, {"msg_timestamp": "9999-12-31T23:59:59-05:00"}, openhub.InputError, "out of range"),
    ],
)
def test_bad_input_is_refused_and_stores_nothing(route, payload, kwargs, error, text) -> None:
    before = _count()
    args = dict(source_system="CRM", correlation_id=f"bad-{uuid.uuid4().hex}") | kwargs
    with pytest.raises(error, match=text):
        openhub.submit(route, payload, **args)
    assert _count() == before


def test_submit_many_is_all_or_nothing(prefix) -> None:
    before = _count()
    good = {"route": "test.flow", "payload": {"prefix": prefix}, "source_system": "CRM"}
    with pytest.raises(openhub.UnknownRouteError, match="message #2"):
        openhub.submit_many(
            [good | {"correlation_id": f"m-{uuid.uuid4().hex}"}, {**good, "route": "nope.x", "correlation_id": "x"}]
        )
    assert _count() == before
    views = openhub.submit_many([good | {"correlation_id": f"m-{uuid.uuid4().hex}"} for _ in range(3)])
    assert _count() == before + 3
    assert all(wait_final(v.id).state == "OK" for v in views)


def test_entity_message_older_than_a_done_one_is_skipped(svc, prefix, external) -> None:
    entity = uuid.uuid4().hex
    now = datetime.now(timezone.utc)
    newer = openhub.submit(
        f"{svc}.entity",
        {"prefix": prefix, "id": entity},
        source_system="CRM",
        correlation_id=f"n-{entity}",
        msg_timestamp=now,
    )
    assert wait_final(newer.id).state == "OK"
    older = openhub.submit(
        f"{svc}.entity",
        {"prefix": prefix, "id": entity},
        source_system="CRM",
        correlation_id=f"o-{entity}",
        msg_timestamp=now - timedelta(minutes=5),
    )
    assert wait_final(older.id).state == "SKIPPED"
    assert external.count(f"{prefix}/sync") == 1
    newest = openhub.submit(
        f"{svc}.entity",
        {"prefix": prefix, "id": entity},
        source_system="CRM",
        correlation_id=f"x-{entity}",
        msg_timestamp=now + timedelta(minutes=5),
    )
    assert wait_final(newest.id).state == "OK"
    assert external.count(f"{prefix}/sync") == 2  # a newer version of the entity is carried again


def test_custom_scope_key_groups_messages(svc, prefix, external) -> None:
    account = uuid.uuid4().hex
    now = datetime.now(timezone.utc)
    first = openhub.submit(
        f"{svc}.custom",
        {"prefix": prefix, "account": account},
        source_system="CRM",
        correlation_id=f"a-{account}",
        msg_timestamp=now,
    )
    assert wait_final(first.id).state == "OK"
    stale = openhub.submit(
        f"{svc}.custom",
        {"prefix": prefix, "account": account},
        source_system="CRM",
        correlation_id=f"b-{account}",
        msg_timestamp=now - timedelta(seconds=1),
    )
    assert wait_final(stale.id).state == "SKIPPED"
    other = openhub.submit(
        f"{svc}.custom",
        {"prefix": prefix, "account": account + "x"},
        source_system="CRM",
        correlation_id=f"c-{account}",
        msg_timestamp=now - timedelta(seconds=1),
    )
    assert wait_final(other.id).state == "OK"
    assert external.count(f"{prefix}/charge") == 2


def test_restart_resumes_and_total_restart_calls_again(svc, prefix, external) -> None:
    external.fail(f"{prefix}/fragile", times=3)
    m = submit(f"{svc}.fragile", prefix)
    assert wait_final(m.id).state == "FAILED"
    with pytest.raises(openhub.StateConflict):
        openhub.cancel(m.id)
    restarted = openhub.restart(m.id)
    assert restarted.failed_count == 0
    done = wait_final(m.id)
    assert done.state == "OK" and done.failed_count == 0
    assert external.count(f"{prefix}/a") == 1 and external.effects(f"{prefix}/fragile") == 1
    openhub.restart(m.id, total=True)
    assert wait_final(m.id).state == "OK"
    # Every call made again, with new idempotency keys so the external system applies them.
    assert external.effects(f"{prefix}/a") == 2 and external.effects(f"{prefix}/fragile") == 2


def test_operator_actions_refused_in_wrong_states(svc, prefix) -> None:
    m = submit(f"{svc}.wait", prefix, wait=60)
    wait_state(m.id, "WAITING_FOR_RES")
    with pytest.raises(
        openhub.StateConflict,
        match=f"message {m.id} is WAITING_FOR_RES: only an OK, FAILED or CANCEL message can be restarted",
    ):
        openhub.restart(m.id)
    assert openhub.cancel(m.id).state == "CANCEL"
    # Issue 40: a second cancel said "cancelled is not allowed in state CANCEL".
    with pytest.raises(openhub.StateConflict, match=f"^message {m.id} is already CANCEL: only a message not final"):
        openhub.cancel(m.id)
    with pytest.raises(openhub.NotFound):
        openhub.restart(10**12)


def test_unpublished_new_message_is_redriven_by_the_poller(svc, prefix, external) -> None:
    from openhub.engine.intake import insert_new, prepare
    from openhub.store.db import utcnow

    row = prepare(f"{svc}.flow", {"prefix": prefix}, source_system="CRM", correlation_id=f"lost-{uuid.uuid4().hex}")
    row["due_at"] = utcnow()  # as if the publishing process crashed after commit, a grace period ago
    with transaction() as conn:
        message_id = insert_new(conn, row)
    done = wait_final(message_id)
    assert done.state == "OK" and done.failed_count == 0
    assert [external.count(f"{prefix}/{s}") for s in "abc"] == [1, 1, 1]


def test_duplicate_and_stale_chains_have_no_effect(svc, prefix, external) -> None:
    from openhub.core.registry import get_registry
    from openhub.engine.hub import current

    external.delay(f"{prefix}/a", 0.5)
    m = submit(f"{svc}.flow", prefix)
    with transaction() as conn:
        token = conn.execute(select(messages.c.attempt_id).where(messages.c.id == m.id)).scalar()
    route = get_registry().route(f"{svc}.flow")
    current().publisher.publish_many([(route, m.id, token, 0, None, None)])  # the same chain delivered twice
    current().publisher.publish_many([(route, m.id, "stale-token", 0, None, None)])  # a chain from an earlier attempt
    done = wait_final(m.id)
    assert done.state == "OK"
    assert [external.effects(f"{prefix}/{s}") for s in "abc"] == [1, 1, 1]
    with transaction() as conn:
        completed = conn.execute(
            select(func.count()).where(transitions.c.message_id == m.id, transitions.c.event == "completed")
        ).scalar()
    assert completed == 1


def test_confirmation_sent_once(svc, prefix, external) -> None:
    m = submit(f"{svc}.flow", prefix, source="CONFIRMED")
    assert wait_final(m.id).state == "OK"
    wait_for(lambda: external.count(f"{prefix}/confirm") == 1, 30, "the confirmation")
    body = external.calls[[c.path for c in external.calls].index(f"{prefix}/confirm")].body
    assert body["state"] == "OK" and body["correlation_id"] == m.correlation_id


@pytest.mark.parametrize("base", ["bestellung-ü-1", "注文-2"])
def test_a_non_ascii_correlation_id_is_carried_to_the_external_system(prefix, external, base) -> None:
    """Issue 34 L1: such an id was accepted, then every HttpCall step failed with UnicodeEncodeError and the
    message ended FAILED. Its headers go out percent-encoded (UTF-8), as its idempotency key does."""
    from urllib.parse import unquote

    cid = f"{base}/{uuid.uuid4().hex[:6]}"
    m = openhub.submit(
        "test.pooled", {"prefix": prefix}, source_system="CRM", correlation_id=cid, process_id="prozess-ß"
    )
    done = wait_final(m.id)
    assert done.state == "OK" and done.correlation_id == cid, done.failed_error
    [call] = [c for c in external.calls if c.path == f"{prefix}/pooled"]
    assert call.headers["x-correlation-id"].isascii() and unquote(call.headers["x-correlation-id"]) == cid
    assert unquote(call.headers["x-process-id"]) == "prozess-ß"
    assert call.key.isascii() and call.key == f"CRM/{unquote(cid).replace('/', '%2F')}/pooled".replace(
        base, "".join(c if c.isascii() else "".join(f"%{b:02X}" for b in c.encode()) for c in base)
    )
