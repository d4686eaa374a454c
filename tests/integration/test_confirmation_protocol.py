"""The stock confirmation protocol (issue 38), set up per source system by settings alone, on real workers
on both backends: a real receiver gets exactly one accepted, signed confirmation per final message, which
verifies with the published secret (by the `standardwebhooks` package) and matches the published JSON
Schema (or, in the SOAP variant, its XSD); it is retried until the receiver answers 2xx (`forever`, past
OPENHUB_CONFIRM_MAX_FAILS); states an endpoint does not confirm are not sent; a @confirmation overrides
an endpoint."""

from __future__ import annotations

import base64
import json
import os
import secrets
import threading
import uuid
from email.message import Message
from pathlib import Path
from typing import Iterator

import jsonschema
import pytest
import xmlschema
from lxml import etree
from standardwebhooks.webhooks import Webhook

import openhub
from openhub.core.soapxml import CONFIRMATION, CONFIRMATION_XSD
from openhub.outbound import protocol
from openhub.outbound.notify import verify_signature
from tests.support import backends
from tests.support.stubs import PostStub
from tests.support.waiting import wait_final, wait_for
from tests.support.workers import Worker

SECRETS = {
    system: "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    for system in ("ERP", "LEGACY", "OKONLY", "OWN")
}
FAILS_FIRST = 5  # more than OPENHUB_CONFIRM_MAX_FAILS (3): only `forever` gets past them


class Receiver(PostStub):
    """Keeps every POST; answers 503 to the first FAILS_FIRST of each path, then 200."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, str], bytes, int]] = []
        self.lock = threading.Lock()
        super().__init__("confirmation-receiver")

    def received(self, path: str, headers: Message, body: bytes) -> tuple[int, str | None, bytes]:
        with self.lock:
            seen = sum(1 for p in self.posts if p[0] == path)
            status = 503 if seen < FAILS_FIRST and path != "/own" else 200
            self.posts.append((path, dict(headers.items()), body, status))
        return status, None, b""

    def accepted(self, path: str) -> list[tuple[dict[str, str], bytes]]:
        with self.lock:
            return [(h, b) for p, h, b, status in self.posts if p == path and status == 200]


@pytest.fixture(params=["embedded", "redis-pg"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[backends.Backend]:
    """A store and broker of this test's own (its settings and routes are not the session worker's)."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("OPENHUB_")}
    with backends.backend(request.param, tmp_path / "store", {"OPENHUB_ROUTES": "tests.support.protocol_routes"}) as b:
        yield b
    backends.activate(saved)


def test_each_final_message_gets_one_signed_confirmation_retried_until_2xx(store, tmp_path) -> None:
    receiver = Receiver()
    endpoints = {
        "ERP": {
            "url": f"{receiver.url}/erp",
            "max_fails": "forever",
            "interval": 0.2,
            "timeout": 5,
            "headers": {"Authorization": "Bearer erp-token"},
        },
        "LEGACY": {"url": f"{receiver.url}/legacy", "format": "soap", "max_fails": "forever", "interval": 0.2},
        "OKONLY": {"url": f"{receiver.url}/okonly", "states": ["OK"], "max_fails": "forever", "interval": 0.2},
        "OWN": f"{receiver.url}/never",
    }
    env = {
        **store.env,
        "OPENHUB_CONFIRM_ENDPOINTS": json.dumps(endpoints),
        "OPENHUB_CONFIRM_SECRETS": ",".join(f"{s}={v}" for s, v in SECRETS.items()),
        "OPENHUB_TEST_RECEIVER_URL": receiver.url,
    }
    backends.activate({k: v for k, v in env.items() if k.startswith("OPENHUB_")})
    worker = Worker(env, tmp_path, beat=True, concurrency=2).start()
    try:
        sent = {}
        for system in SECRETS:
            for route in ("proto.ok", "proto.fail"):
                view = openhub.submit(route, {"n": 1}, source_system=system, correlation_id=f"{system}-{uuid.uuid4()}")
                sent[(system, route)] = view.id
        ended = {key: wait_final(message_id, timeout=90).state for key, message_id in sent.items()}
        assert {k[1]: v for k, v in ended.items()} == {"proto.ok": "OK", "proto.fail": "FAILED"}
        wait_for(
            lambda: (
                len(receiver.accepted("/erp")) == 2
                and len(receiver.accepted("/legacy")) == 2
                and len(receiver.accepted("/okonly")) == 1
                and len(receiver.accepted("/own")) == 2
            ),
            90,
            "every confirmation accepted",
        )
        schema = protocol.schema()
        for path, system in (("/erp", "ERP"), ("/okonly", "OKONLY")):
            got = {}
            for headers, body in receiver.accepted(path):
                Webhook(SECRETS[system]).verify(body, headers)  # the published secret verifies it
                confirmation = json.loads(body)
                jsonschema.validate(confirmation, schema)
                assert confirmation["delivery_id"] == headers["webhook-id"] == headers["Idempotency-Key"]
                got[confirmation["id"]] = confirmation["state"]
            expected = {
                sent[(system, r)]: ended[(system, r)]
                for r in ("proto.ok", "proto.fail")
                if system != "OKONLY" or r == "proto.ok"
            }
            assert got == expected, path
        assert all(h["Authorization"] == "Bearer erp-token" for h, _ in receiver.accepted("/erp"))
        # retried past OPENHUB_CONFIRM_MAX_FAILS, every attempt of one confirmation under one webhook-id
        erp = [(h["webhook-id"], status) for p, h, _, status in receiver.posts if p == "/erp"]
        assert len({wid for wid, _ in erp}) == 2 and len(erp) == FAILS_FIRST + 2
        failures = [sum(1 for w, status in erp if w == wid and status != 200) for wid in {w for w, _ in erp}]
        assert max(failures) >= 3  # OPENHUB_CONFIRM_MAX_FAILS would have parked it: `forever` sent it on
        xsd = xmlschema.XMLSchema(CONFIRMATION_XSD)
        for headers, body in receiver.accepted("/legacy"):
            verify_signature(SECRETS["LEGACY"], headers, body)  # (standardwebhooks' verify parses JSON)
            element = etree.fromstring(body).find(f".//{{{CONFIRMATION}}}confirmation")
            xsd.validate(etree.tostring(element))
            assert element.findtext(f"{{{CONFIRMATION}}}deliveryId") == headers["webhook-id"]
        assert not [p for p in receiver.posts if p[0] == "/never"]  # OWN's @confirmation overrides its endpoint
        assert not [p for p in receiver.posts if p[0] == "/okonly" and b'"FAILED"' in p[2]]
    finally:
        worker.stop()
        receiver.stop()
