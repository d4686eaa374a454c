"""Fan-out (issue 37, part 2): a message for a `Topic` becomes one message per subscribed route, with real
workers on both backends: each receiver called exactly once, each with its own fate, restarted alone, and
none of them where the accept rolled back."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy import select

import openhub
from openhub.core.errors import StateConflict
from openhub.store.schema import confirmations, transitions
from tests.support import backends
from tests.support.caller import ORDERS, orders_engine
from tests.support.process_store import transaction
from tests.support.waiting import wait_final, wait_for, wait_state

pytestmark = pytest.mark.usefixtures("hub")
TOPIC = "dlv.published"
RECEIVERS = ("dlvsub.billing", "dlvsub.crm", "dlvsub.warehouse")  # its subscribers (tests/support/delivery_routes.py)


def _publish(prefix: str, source_system: str = "CRM", **payload) -> openhub.MessageView:
    return openhub.submit(
        TOPIC, {"prefix": prefix, **payload}, source_system=source_system, correlation_id=uuid.uuid4().hex
    )


def _receivers(family_id: int) -> list[openhub.MessageView]:
    return sorted(openhub.list_messages(parent_id=family_id), key=lambda v: v.id)


def _events(message_id: int) -> list[str]:
    with transaction() as conn:
        return list(
            conn.execute(
                select(transitions.c.event).where(transitions.c.message_id == message_id).order_by(transitions.c.id)
            ).scalars()
        )


def test_each_of_three_subscribers_is_called_exactly_once(prefix, external) -> None:
    family = _publish(prefix)
    assert family.state == "OK" and family.route == TOPIC  # fanned out at accept: nothing of its own to do
    receivers = _receivers(family.id)
    assert [r.route for r in receivers] == list(RECEIVERS)
    assert [r.correlation_id for r in receivers] == [f"{family.correlation_id}#0.{n}" for n in (1, 2, 3)]
    for receiver in receivers:
        done = wait_final(receiver.id)
        assert done.state == "OK", (receiver.route, done.state, done.failed_error)
        assert done.source_system == "CRM" and done.parent_id == family.id
    assert [external.count(f"{prefix}/{r.split('.')[1]}") for r in RECEIVERS] == [1, 1, 1]
    assert _events(family.id) == ["accepted", "fanned_out"]
    with pytest.raises(StateConflict, match="fan-out family"):  # its receivers are what is restarted
        openhub.restart(family.id)


def test_each_receiver_is_confirmed_to_the_source_system_and_the_family_is_not(prefix, external) -> None:
    family = _publish(prefix, source_system="CONFIRMED")  # its confirmer POSTs to <prefix>/confirm
    receivers = _receivers(family.id)
    for receiver in receivers:
        wait_final(receiver.id)
    wait_for(lambda: external.count(f"{prefix}/confirm") >= 3, 60, "the three confirmations")
    with transaction() as conn:
        confirmed = conn.execute(
            select(confirmations.c.message_id).where(
                confirmations.c.message_id.in_([family.id, *(r.id for r in receivers)])
            )
        ).scalars()
        assert sorted(confirmed) == [r.id for r in receivers]


def test_one_failing_receiver_leaves_the_others_and_a_restart_restarts_only_it(prefix, external) -> None:
    external.fail(f"{prefix}/crm", 1, status=400)  # a refusal: FAILED at once
    family = _publish(prefix)
    billing, crm, warehouse = _receivers(family.id)
    assert wait_final(crm.id).state == "FAILED"
    assert wait_final(billing.id).state == "OK" and wait_final(warehouse.id).state == "OK"
    assert openhub.get_message(family.id).state == "OK"  # not failed with it
    before = {m.id: _events(m.id) for m in (billing, warehouse)}
    openhub.restart(crm.id)
    again = wait_for(lambda: (lambda v: v if v.state == "OK" else None)(openhub.get_message(crm.id)), 60, "crm again")
    assert again.state == "OK"
    # crm: its refused call and the one its restart made; the others: their one call
    assert [external.count(f"{prefix}/{r.split('.')[1]}") for r in RECEIVERS] == [1, 2, 1]
    assert {m.id: _events(m.id) for m in (billing, warehouse)} == before  # its siblings were not touched
    assert _events(family.id) == ["accepted", "fanned_out"]


def test_cancelling_one_receiver_cancels_only_it(prefix, external) -> None:
    family = _publish(prefix, wait="warehouse")
    billing, crm, warehouse = _receivers(family.id)
    wait_state(warehouse.id, "POSTPONED")
    assert openhub.cancel(warehouse.id).state == "CANCEL"
    assert wait_final(billing.id).state == "OK" and wait_final(crm.id).state == "OK"
    assert openhub.get_message(family.id).state == "OK"
    assert external.count(f"{prefix}/warehouse") == 0


def test_adding_a_subscriber_affects_only_new_messages(prefix) -> None:
    from openhub.core.registry import get_registry

    registry = get_registry()
    first = _publish(prefix)
    # Subscribed in this process only, on a queue no worker takes: its message waits there, and is cancelled.
    late = openhub.Route("dlvsub.late", steps=list(registry.route("dlvsub.crm").steps), subscribes=TOPIC, queue="none")
    registry.add(late, "a test")
    try:
        second = _publish(prefix)
    finally:
        del registry.routes["dlvsub.late"]
    assert [r.route for r in _receivers(first.id)] == list(RECEIVERS)
    routes = [r.route for r in _receivers(second.id)]
    assert routes == [*RECEIVERS[:2], "dlvsub.late", RECEIVERS[2]]  # by name
    openhub.cancel(_receivers(second.id)[2].id)
    for receiver in _receivers(first.id) + _receivers(second.id):
        assert wait_final(receiver.id).state in ("OK", "CANCEL")


@pytest.fixture
def engine(hub: backends.Backend):
    """The caller's own engine on the hub's database, with its table of orders."""
    with orders_engine(hub.database_url) as engine:
        yield engine


def test_a_rolled_back_submit_to_a_topic_leaves_no_message_and_a_committed_one_reaches_all(
    engine, prefix, external
) -> None:
    ids = {}
    for order, commit in ((f"{prefix}-rolled", False), (f"{prefix}-kept", True)):
        with engine.connect() as conn:
            conn.execute(sa.insert(ORDERS).values(id=order))
            family = openhub.submit(
                TOPIC, {"prefix": f"{prefix}/{order}"}, source_system="CALLER", correlation_id=order, connection=conn
            )
            ids[order] = family.id
            conn.commit() if commit else conn.rollback()
    kept = openhub.list_messages(correlation_id=f"{prefix}-kept", source_system="CALLER")
    assert [m.id for m in kept] == [ids[f"{prefix}-kept"]]
    for receiver in _receivers(kept[0].id):
        assert wait_final(receiver.id).state == "OK", receiver.route
    assert openhub.list_messages(correlation_id=f"{prefix}-rolled", source_system="CALLER") == []
    for n in (1, 2, 3):  # nor any of its receivers
        assert openhub.list_messages(correlation_id=f"{prefix}-rolled#0.{n}", source_system="CALLER") == []
    assert [external.count(f"{prefix}/{prefix}-rolled/{r.split('.')[1]}") for r in RECEIVERS] == [0, 0, 0]
    assert [external.count(f"{prefix}/{prefix}-kept/{r.split('.')[1]}") for r in RECEIVERS] == [1, 1, 1]


def test_receivers_count_against_their_source_systems_backlog_cap(hub: backends.Backend, prefix) -> None:
    """A family is final at once; its receivers are what stays live: they count against the cap of the source
    system (OPENHUB_BACKLOG_LIMITS), so a flood of one topic is held back as any other (issue 37, part 6)."""
    from openhub.core.errors import Backlogged

    backends.activate(dict(hub.env, OPENHUB_BACKLOG_LIMITS="FANCAP=4"))  # this process's (the accepting) only
    try:
        for name in RECEIVERS:
            openhub.pause(name)  # their messages wait, not final, until resumed
        first = _publish(prefix, source_system="FANCAP")
        with pytest.raises(Backlogged, match="FANCAP"):  # three live, three more: past four
            _publish(prefix, source_system="FANCAP")
        assert openhub.count_messages(source_system="FANCAP") == 4  # nothing of the second stored
    finally:
        for name in RECEIVERS:
            openhub.resume(name)
        hub.activate()
    for receiver in _receivers(first.id):
        assert wait_final(receiver.id).state == "OK"


def test_a_receiver_refusing_the_payload_refuses_the_accept_and_nothing_is_stored(prefix) -> None:
    from openhub.core.errors import InputError
    from openhub.core.registry import get_registry

    registry = get_registry()
    steps = list(registry.route("dlvsub.crm").steps)
    picky = openhub.Route("dlvsub.picky", steps=steps, subscribes=TOPIC, validate=lambda p: "bad" not in p)
    registry.add(picky, "a test")
    cid = uuid.uuid4().hex
    try:
        with pytest.raises(InputError, match="receiver dlvsub.picky of topic dlv.published: payload refused"):
            openhub.submit(TOPIC, {"prefix": prefix, "bad": 1}, source_system="CRM", correlation_id=cid)
    finally:
        del registry.routes["dlvsub.picky"]
    assert openhub.list_messages(correlation_id=cid, source_system="CRM") == []
    assert [openhub.list_messages(correlation_id=f"{cid}#0.{n}") for n in (1, 2, 3, 4)] == [[], [], [], []]
