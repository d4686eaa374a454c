"""Answers bound to their wait (issue 33): each ask of a waiting step has a token, and an answer is taken
for the ask its token names, never by its content.

In-process on LocalHub, on both stores, with each answer placed where it hurt: a responder's retry of
answer 1 while the route goes on to question 2, a genuine early answer to question 2 equal to answer 1,
an answer to an ask that timed out and was asked again. Chain and batch routes alike (`p.batch_waits`
carries its messages in one task).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterator

import pytest
from sqlalchemy import select

import openhub
from openhub.core.errors import OpenHubError, ResponseTokenNeeded, StaleResponse, StateConflict
from openhub.store.schema import transitions, waits
from openhub.testing import LocalHub
from tests.support import promise_routes as routes
from tests.support.process_store import transaction

TWO_WAITS = ["p.two_waits", "p.batch_waits"]  # wait_reply, second, wait_again, use_answer
HOUR = 3600  # the test routes' response timeout


@pytest.fixture
def hub(local_store_env: dict[str, str]) -> Iterator[LocalHub]:
    with routes.local_hub(
        OPENHUB_RETRY_INTERVAL="60", OPENHUB_LEASE_GRACE="300", OPENHUB_MAX_FAILS="3", **local_store_env
    ) as local:
        yield local


def _history(message_id: int) -> list[str]:
    with transaction() as conn:
        return list(
            conn.execute(
                select(transitions.c.event).where(transitions.c.message_id == message_id).order_by(transitions.c.id)
            ).scalars()
        )


def _refused(answer: Callable[[], Any]) -> OpenHubError | None:
    """The error `answer` was refused with (None: it was not), so a step's hook can answer without failing."""
    try:
        answer()
    except OpenHubError as exc:
        return exc
    return None


# --- (a) a retry of answer 1 while the route waits for answer 2 ------------------------------------------


@pytest.mark.parametrize("route", TWO_WAITS)
def test_a_retried_first_answer_does_not_answer_the_second_wait(route: str, hub: LocalHub) -> None:
    view = hub.submit(route, {})
    hub.run()
    assert hub.get(view.id).state == "WAITING_FOR_RES"
    first = routes.token(view.id, "waits")
    retries = []
    # The responder sends answer 1 again (an HTTP retry after a lost reply), its keys in another order:
    # while the next step runs, and once the route waits for answer 2.
    routes.HOOKS["second"] = lambda ctx: retries.append(
        openhub.respond(ctx.message.id, {"to": "bank", "answer": 1}, token=first)
    )
    openhub.respond(view.id, {"answer": 1, "to": "bank"}, token=first)
    hub.run()
    assert hub.get(view.id).state == "WAITING_FOR_RES", "the second wait took the first answer's retry"
    retries.append(openhub.respond(view.id, {"to": "bank", "answer": 1}, token=first))
    assert [r.duplicate for r in retries] == [True, True]  # a clear answer, not an error
    assert hub.get(view.id).state == "WAITING_FOR_RES", "the second wait took the first answer's retry"
    routes.HOOKS.pop("second")
    taken = openhub.respond(view.id, {"answer": 2}, token=routes.token(view.id, "waits_again"))
    assert not taken.duplicate
    hub.run()
    assert hub.get(view.id).state == "OK" and routes.ANSWERS == [{"answer": 2}]
    assert _history(view.id).count("response_duplicate") == 2


@pytest.mark.parametrize("route", TWO_WAITS)
def test_a_retried_first_answer_without_a_token_is_refused_at_the_second_wait(route: str, hub: LocalHub) -> None:
    """Without tokens (a responder that never sends one) the first answer is taken: one wait open, none
    answered. Its retry at the second wait could be either answer, so it is refused, not taken as answer 2."""
    view = hub.submit(route, {})
    hub.run()
    openhub.respond(view.id, {"answer": 1, "to": "bank"})
    hub.run()
    assert hub.get(view.id).state == "WAITING_FOR_RES"
    with pytest.raises(ResponseTokenNeeded, match="token"):
        openhub.respond(view.id, {"to": "bank", "answer": 1})
    assert hub.get(view.id).state == "WAITING_FOR_RES", "the second wait took the first answer's retry"
    assert _history(view.id)[-1] == "response_refused"
    openhub.respond(view.id, {"answer": 2}, token=routes.token(view.id, "waits_again"))
    hub.run()
    assert hub.get(view.id).state == "OK" and routes.ANSWERS == [{"answer": 2}]


# --- (b) a genuine early answer to question 2 equal to answer 1 --------------------------------------------


@pytest.mark.parametrize("route", TWO_WAITS)
def test_an_early_answer_like_the_first_one_answers_the_second_wait(route: str, hub: LocalHub) -> None:
    view = hub.submit(route, {})
    hub.run()
    openhub.respond(view.id, {"answer": 1}, token=routes.token(view.id, "waits"))
    # Question 2's responder answers while its step still asks, and its answer is the same as answer 1.
    early = []
    routes.HOOKS["waits_again"] = lambda ctx: early.append(
        openhub.respond(ctx.message.id, {"answer": 1}, token=ctx.wait_token)
    )
    hub.run()  # no tick: nothing may wait for the hour-long response timeout
    assert hub.get(view.id).state == "OK", _history(view.id)
    assert [(v.state, v.duplicate) for v in early] == [("PROCESSING", False)]
    assert routes.ANSWERS == [{"answer": 1}]
    assert routes.calls("waits") == 1 and routes.calls("waits_again") == 1  # each question asked once


def test_an_early_answer_is_kept_for_its_own_ask_only(hub: LocalHub) -> None:
    """The question is answered while it is asked, then its step fails: the retry asks again, with a new
    token, and waits for its own answer; the early one answered an ask that ended."""

    def answer_then_fail(ctx) -> None:
        if not routes.MOST.get("failed"):
            routes.MOST["failed"] = 1
            openhub.respond(ctx.message.id, {"answer": "early"}, token=ctx.wait_token)
            raise RuntimeError("the question's system answered 503")

    routes.HOOKS["waits"] = answer_then_fail
    view = hub.submit("p.two_waits", {})
    hub.run()
    assert hub.get(view.id).state == "PARTLY_FAILED"
    hub.tick(seconds=120)  # the retry asks again
    assert hub.get(view.id).state == "WAITING_FOR_RES"
    failed, asked = (routes.token(view.id, "waits", n) for n in (0, 1))
    assert failed != asked
    assert openhub.respond(view.id, {"answer": "early"}, token=failed).duplicate  # received before: said so
    assert hub.get(view.id).state == "WAITING_FOR_RES"
    openhub.respond(view.id, {"answer": 1}, token=asked)
    hub.run(seconds=120)
    assert hub.get(view.id).state == "WAITING_FOR_RES" and routes.calls("waits_again") == 1


# --- (c) an answer for a wait that has ended ------------------------------------------------------------------


@pytest.mark.parametrize("route", TWO_WAITS)
def test_an_answer_for_a_wait_that_timed_out_is_refused(route: str, hub: LocalHub) -> None:
    view = hub.submit(route, {})
    hub.run()
    old = routes.token(view.id, "waits")
    hub.tick(seconds=HOUR + 1)  # no answer within the response timeout: a transient failure
    assert hub.get(view.id).state == "PARTLY_FAILED"
    hub.tick(seconds=HOUR + 120)  # the retry asks again, with a new token
    assert hub.get(view.id).state == "WAITING_FOR_RES" and routes.calls("waits") == 2
    new = routes.token(view.id, "waits")
    assert new != old
    with pytest.raises(StaleResponse, match="no open wait"):
        openhub.respond(view.id, {"answer": "late"}, token=old)
    assert hub.get(view.id).state == "WAITING_FOR_RES" and _history(view.id)[-1] == "response_refused"
    with pytest.raises(StaleResponse):
        openhub.respond(view.id, {"answer": "made up"}, token="1.0123456789abcdef01234567")
    openhub.respond(view.id, {"answer": 1}, token=new)
    hub.run(seconds=HOUR + 120)
    assert hub.get(view.id).state == "WAITING_FOR_RES" and routes.calls("second") == 1


def test_an_answer_for_a_cancelled_messages_wait_is_refused(hub: LocalHub) -> None:
    view = hub.submit("p.two_waits", {})
    hub.run()
    openhub.cancel(view.id)
    with pytest.raises(StaleResponse):
        openhub.respond(view.id, {"answer": 1}, token=routes.token(view.id, "waits"))
    assert hub.get(view.id).state == "CANCEL" and _history(view.id)[-1] == "response_refused"


# --- (d) duplicates -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("route", TWO_WAITS)
def test_a_second_answer_with_the_same_token_is_a_duplicate_whatever_it_says(route: str, hub: LocalHub) -> None:
    view = hub.submit(route, {})
    hub.run()
    first = routes.token(view.id, "waits")
    assert not openhub.respond(view.id, {"answer": 1}, token=first).duplicate
    assert openhub.respond(view.id, {"answer": "something else"}, token=first).duplicate
    hub.run()
    second = routes.token(view.id, "waits_again")
    assert not openhub.respond(view.id, {"answer": 2}, token=second).duplicate
    hub.run()
    assert hub.get(view.id).state == "OK" and routes.ANSWERS == [{"answer": 2}]
    # After the end too: a retry that comes late is still a duplicate, not an error.
    assert openhub.respond(view.id, {"answer": 2}, token=second).duplicate
    assert openhub.respond(view.id, {"answer": 1}, token=first).duplicate
    with transaction() as conn:
        kept = dict(conn.execute(select(waits.c.token, waits.c.answer).where(waits.c.message_id == view.id)).all())
    assert {t: json.loads(a) for t, a in kept.items()} == {first: {"answer": 1}, second: {"answer": 2}}
    assert _history(view.id).count("response_duplicate") == 3


# --- answers without a token ---------------------------------------------------------------------------------


def test_an_answer_without_a_token_is_taken_only_where_it_cannot_be_mistaken(hub: LocalHub) -> None:
    view = hub.submit("p.two_waits", {})
    while_asked: list[OpenHubError | None] = []
    routes.HOOKS["waits"] = lambda ctx: while_asked.append(_refused(lambda: openhub.respond(ctx.message.id, {})))
    hub.run()
    assert [type(e) for e in while_asked] == [ResponseTokenNeeded]  # early, or a repeat of an earlier one?
    openhub.respond(view.id, {"answer": 1})  # one wait open, none answered: taken
    hub.run()
    assert hub.get(view.id).state == "WAITING_FOR_RES"
    with pytest.raises(ResponseTokenNeeded, match="an earlier wait of it was answered"):
        openhub.respond(view.id, {"answer": 2})
    openhub.respond(view.id, {"answer": 2}, token=routes.token(view.id, "waits_again"))
    hub.run()
    assert hub.get(view.id).state == "OK"
    with pytest.raises(StateConflict, match="not waiting for a response"):
        openhub.respond(view.id, {"answer": 3})
    assert _history(view.id).count("response_refused") == 2


def test_a_question_asked_again_after_its_timeout_takes_an_answer_without_a_token(hub: LocalHub) -> None:
    view = hub.submit("p.two_waits", {})
    hub.run()
    hub.tick(seconds=HOUR + 1)
    hub.tick(seconds=HOUR + 120)
    assert hub.get(view.id).state == "WAITING_FOR_RES" and routes.calls("waits") == 2
    openhub.respond(view.id, {"answer": 1})  # nothing was ever answered: it can only be this question's
    hub.run(seconds=HOUR + 120)
    assert routes.calls("second") == 1


def test_a_wait_token_is_new_for_every_ask() -> None:
    with routes.local_hub() as hub:
        views = [hub.submit("p.two_waits", {}) for _ in range(2)]
        hub.run()
        for view in views:
            openhub.respond(view.id, {"answer": 1}, token=routes.token(view.id, "waits"))
        hub.run()
        tokens = [t for _, _, t in routes.ASKS]
        assert len(tokens) == 4 and len(set(tokens)) == 4
        with pytest.raises(openhub.InputError):
            openhub.respond(views[0].id, {}, token="x" * 65)
