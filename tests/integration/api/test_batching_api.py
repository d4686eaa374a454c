"""Concurrent single submissions are stored in groups, yet each request keeps its own answer."""

from __future__ import annotations

import asyncio
import uuid

import httpx

import openhub
from openhub.api.app import create_app
from tests.integration.api.conftest import CREDENTIALS, CRM, SHOP
from tests.integration.api.test_messages_api import stored


def test_concurrent_requests_get_their_own_answers(api_env, prefix):
    app = create_app(credentials=CREDENTIALS)
    run = uuid.uuid4().hex[:8]
    requests = [("test/flow", {"prefix": prefix, "i": i}, f"{run}-{i}", CRM) for i in range(40)]
    requests += [
        ("test/flow", {"prefix": prefix}, f"{run}-7", CRM),  # duplicate of #7
        ("test/flow", {"prefix": prefix}, f"{run}-7", SHOP),  # same id, other system: new
        ("api/validated", {"nope": 1}, f"{run}-bad", CRM),  # refused by validation
        ("no/such", {"prefix": prefix}, f"{run}-unknown", CRM),
    ]  # unknown route

    async def fire() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as client:
            return await asyncio.gather(
                *(
                    client.post(f"/api/v1/messages/{route}", json=payload, headers={**auth, "X-Correlation-Id": cid})
                    for route, payload, cid, auth in requests
                )
            )

    answers = asyncio.run(fire())
    statuses = [r.status_code for r in answers]
    assert statuses[:40].count(202) + statuses[:40].count(200) == 40
    assert statuses[40] in (200, 202) and sorted([statuses[7], statuses[40]]) == [200, 202]
    assert answers[40].json()["id"] == answers[7].json()["id"]
    assert statuses[41] == 202 and answers[41].json()["id"] != answers[7].json()["id"]
    assert statuses[42:] == [400, 404]
    for i in range(40):
        view = openhub.get_message(answers[i].json()["id"])
        assert view.correlation_id == f"{run}-{i}" and (view.payload.get("i") == i or i == 7)
    assert stored(f"{run}-7") == 2 and stored(f"{run}-bad") == 0
    assert app.state.batcher.largest_batch > 1  # they really were grouped


def test_store_down_fails_the_whole_group_and_stores_nothing(api_env, prefix):
    from tests.support import backends

    backends.activate(
        dict(api_env.env, OPENHUB_DATABASE_URL=f"postgresql+psycopg://u@127.0.0.1:{backends.free_port()}/x")
    )
    run = uuid.uuid4().hex[:8]
    try:
        app = create_app(credentials=CREDENTIALS)

        async def fire() -> list[httpx.Response]:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ingress") as client:
                return await asyncio.gather(
                    *(
                        client.post(
                            "/api/v1/messages/test/flow",
                            json={"prefix": prefix},
                            headers={**CRM, "X-Correlation-Id": f"{run}-{i}"},
                        )
                        for i in range(10)
                    )
                )

        assert [r.status_code for r in asyncio.run(fire())] == [503] * 10
    finally:
        api_env.activate()
    assert all(stored(f"{run}-{i}") == 0 for i in range(10))
