"""Issue 36: restart from a step, retry now, edit and resubmit, through the API with a real worker.

Effects are counted at the external system: restart from step b of test.flow (a, b, c) calls b and c
once more and a never; a POSTPONED message made due now runs at once; an edited payload is the one the
external system receives, and the old one is in the message's history.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import update

import openhub
from openhub.core.config import get_settings
from openhub.store import tokens
from openhub.store.schema import messages
from tests.integration.api.conftest import bearer
from tests.support.process_store import transaction
from tests.support.waiting import wait_final, wait_for, wait_state


@pytest.fixture
def operator_token() -> dict[str, str]:
    name = f"oncall-{uuid.uuid4().hex[:8]}"
    return {"name": name, "headers": bearer(tokens.add(name, "operator", url=get_settings().database_url))}


def _submit(payload: dict) -> int:
    return openhub.submit("test.flow", payload, source_system="CRM", correlation_id=uuid.uuid4().hex).id


def _calls(external, prefix: str, step: str) -> list:
    return [c for c in external.calls if c.path == f"{prefix}/{step}"]


def test_restart_from_step_b_calls_b_and_c_once_more_and_a_never(hub, client, external, prefix, operator_token):
    m = _submit({"prefix": prefix, "n": 1})
    assert wait_final(m).state == "OK"
    assert [len(_calls(external, prefix, s)) for s in "abc"] == [1, 1, 1]
    headers = operator_token["headers"]
    r = client.post(f"/api/v1/messages/{m}:restart", json={"from_step": "b"}, headers=headers)
    assert r.status_code == 200, r.text
    wait_for(
        lambda: openhub.get_message(m).state == "OK" and len(_calls(external, prefix, "c")) == 2,
        60,
        "the restarted message to call c again and end OK",
    )
    assert [len(_calls(external, prefix, s)) for s in "abc"] == [1, 2, 2]
    first_b, second_b = _calls(external, prefix, "b")
    assert first_b.key != second_b.key and not second_b.replay  # new idempotency keys for the repeated steps
    history = client.get(f"/api/v1/messages/{m}", headers=headers).json()
    [cleared] = [h for h in history["history"] if h["event"] == "calls_cleared"]
    assert cleared["detail"].startswith(f"cleared by {operator_token['name']}: the call records of steps b, c")
    assert [a["action"] for a in history["operator_actions"]] == ["message.restart_from"]


def test_restart_from_step_is_refused_clearly(hub, client, external, prefix, operator_token):
    headers = operator_token["headers"]
    m = _submit({"prefix": prefix, "n": 1})
    assert wait_final(m).state == "OK"
    unknown = client.post(f"/api/v1/messages/{m}:restart", json={"from_step": "zz"}, headers=headers)
    assert unknown.status_code == 400 and "route test.flow has no step 'zz'; its steps are a, b, c" in unknown.text
    both = client.post(f"/api/v1/messages/{m}:restart", json={"from_step": "b", "total": True}, headers=headers)
    assert both.status_code == 400
    held = _submit({"prefix": prefix, "n": 2, "script": {"a": {"postpone_once": True, "postpone_for": 3600}}})
    wait_state(held, "POSTPONED")
    live = client.post(f"/api/v1/messages/{held}:restart", json={"from_step": "b"}, headers=headers)
    assert live.status_code == 409 and "only an OK, FAILED or CANCEL message" in live.text
    # A split parent whose child is not final: the parent is made FAILED and given a live child here.
    with transaction() as conn:
        conn.execute(update(messages).where(messages.c.id == m).values(state="FAILED"))
        conn.execute(update(messages).where(messages.c.id == held).values(parent_id=m))
    parent = client.post(f"/api/v1/messages/{m}:restart", json={"from_step": "b"}, headers=headers)
    assert parent.status_code == 409 and "1 split children not final yet" in parent.text
    assert openhub.get_message(m).state == "FAILED"  # nothing was done
    assert client.post(f"/api/v1/messages/{held}:cancel", headers=headers).status_code == 200


def test_retry_now_runs_a_postponed_message_at_once(hub, client, external, prefix, operator_token):
    m = _submit({"prefix": prefix, "n": 1, "script": {"a": {"postpone_once": True, "postpone_for": 3600}}})
    before = wait_state(m, "POSTPONED")
    assert client.post(f"/api/v1/messages/{m}:retry", headers=operator_token["headers"]).status_code == 200
    done = wait_final(m, 30)  # a poll interval on a loaded box; the back-off was an hour
    assert done.state == "OK" and done.failed_count == before.failed_count
    again = client.post(f"/api/v1/messages/{m}:retry", headers=operator_token["headers"])
    assert again.status_code == 409 and "only a PARTLY_FAILED or POSTPONED message" in again.text


def test_an_edited_payload_reaches_the_external_system_and_the_old_one_stays_in_the_history(
    hub, client, external, prefix, operator_token
):
    m = _submit({"prefix": prefix, "n": 1, "script": {"a": {"reject": True}}})
    assert wait_final(m).state == "FAILED"
    headers = operator_token["headers"]
    deep: list = []
    for _ in range(80):
        deep = [deep]
    refused = client.post(f"/api/v1/messages/{m}:resubmit", json={"payload": deep}, headers=headers)
    assert refused.status_code == 400 and "OPENHUB_MAX_NESTING" in refused.text
    fixed = {"prefix": prefix, "n": 1, "fixed": True}
    r = client.post(f"/api/v1/messages/{m}:resubmit", json={"payload": fixed}, headers=headers)
    assert r.status_code == 200, r.text
    assert wait_final(m).state == "OK"
    assert _calls(external, prefix, "a")[-1].body == fixed and _calls(external, prefix, "c")[-1].body == fixed
    detail = client.get(f"/api/v1/messages/{m}", headers=headers).json()
    assert detail["payload"] == fixed
    [edited] = [h for h in detail["history"] if h["event"] == "payload_edited"]
    assert '"reject":true' in edited["detail"] and operator_token["name"] in edited["detail"]
    ok = client.post(f"/api/v1/messages/{m}:resubmit", json={"payload": fixed}, headers=headers)
    assert ok.status_code == 409  # only a FAILED message's payload is edited
