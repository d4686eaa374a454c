"""Split options (issue 13, part 9) on LocalHub: children in list order one after another, a
cancelled parent's family cancelled with it, and children confirmed only when their split asks."""

from __future__ import annotations

import logging
from typing import Iterator

import pytest

import openhub
from openhub import Reject
from openhub.testing import LocalHub
from tests.support import promise_routes as routes


@pytest.fixture
def hub() -> Iterator[LocalHub]:
    with routes.local_hub() as local:
        yield local


def _children(parent_id: int) -> list[openhub.MessageView]:
    return sorted(openhub.list_messages(parent_id=parent_id), key=lambda v: v.id)


def _child_number(ctx) -> int:
    return int(ctx.message.correlation_id.rsplit(".", 1)[1])


def test_a_sequential_split_runs_its_children_one_after_another_in_list_order(hub: LocalHub) -> None:
    published_meanwhile = []

    def note_the_queue(ctx):
        published_meanwhile.append((_child_number(ctx), len(hub.publisher.chains)))

    routes.HOOKS["first"] = note_the_queue
    parent = hub.submit("p.sequence", {"children": 3})
    hub.run()
    assert hub.get(parent.id).state == "OK"
    assert [c.state for c in _children(parent.id)] == ["OK", "OK", "OK"]
    assert published_meanwhile == [(1, 0), (2, 0), (3, 0)]  # in order; no sibling's chain waiting meanwhile
    hub.tick()
    assert routes.CONFIRMED == [(parent.id, "OK")]  # the children are not confirmed: the source never sent them


def test_a_failed_child_of_a_sequential_split_cancels_the_rest_and_a_restart_goes_on(hub: LocalHub) -> None:
    def second_refused_once(ctx):
        if _child_number(ctx) == 2 and not routes.MOST.get("refused"):
            routes.MOST["refused"] = 1
            raise Reject("the warehouse refused line 2")

    routes.HOOKS["first"] = second_refused_once
    parent = hub.submit("p.sequence", {"children": 3})
    hub.run()
    assert [c.state for c in _children(parent.id)] == ["OK", "FAILED", "CANCEL"]
    assert hub.get(parent.id).state == "FAILED" and routes.calls("first") == 1
    openhub.restart(parent.id)
    hub.run()
    hub.tick()
    hub.run()
    assert [c.state for c in _children(parent.id)] == ["OK", "OK", "OK"]
    assert hub.get(parent.id).state == "OK" and routes.calls("first") == 3


def test_cancelling_a_parent_cancels_its_children_not_yet_final(hub: LocalHub) -> None:
    parent = hub.submit("p.big", {"children": 3})

    def cancel_the_parent(ctx):
        if _child_number(ctx) == 1:
            openhub.cancel(parent.id)

    routes.HOOKS["first"] = cancel_the_parent
    hub.run()
    assert hub.get(parent.id).state == "CANCEL"
    assert [c.state for c in _children(parent.id)] == ["CANCEL", "CANCEL", "CANCEL"]
    assert routes.calls("first") == 1  # the call in flight ended; its siblings never called out
    hub.tick()
    assert routes.CONFIRMED == [(parent.id, "CANCEL")]


def test_children_are_confirmed_when_their_split_asks(hub: LocalHub) -> None:
    parent = hub.submit("p.told", {"children": 2})
    hub.run()
    hub.tick()
    children = [c.id for c in _children(parent.id)]
    assert sorted(routes.CONFIRMED) == sorted([(children[0], "OK"), (children[1], "OK"), (parent.id, "OK")])


def test_a_split_child_ending_is_not_logged_at_info_as_unconfirmed(hub: LocalHub, caplog) -> None:
    # Issue 40: every child of a split logged "not confirmed (no confirmer for CRM, or a split child)" at INFO.
    caplog.set_level(logging.INFO, logger="openhub")
    parent = hub.submit("p.big", {"children": 3})
    hub.run()
    assert hub.get(parent.id).state == "OK"
    assert [
        r.getMessage() for r in caplog.records if "not confirmed" in r.getMessage() and r.levelno >= logging.INFO
    ] == []
    alone = hub.submit("p.flow", {}, source_system="NOBODY")  # a source system without a confirmer is still told
    hub.run()
    assert [r.getMessage() for r in caplog.records if "not confirmed" in r.getMessage()] == [
        f"message {alone.id} ({alone.correlation_id}) ended OK; not confirmed: no confirmer for NOBODY"
    ]
