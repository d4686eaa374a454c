"""Fixtures of the HTTP API tests: the app on each backend, its clients and credentials."""

from __future__ import annotations

import uuid
from typing import Iterator

import pytest
from fastapi.testclient import TestClient  # on httpx2 (the dev extra), as Starlette asks: no warning

from openhub.api.app import create_app
from openhub.api.auth import Credentials
from openhub.core.config import get_settings
from tests.support import backends

CRM_KEY = "crm-" + uuid.uuid4().hex
SHOP_KEY = "shop-" + uuid.uuid4().hex
ADMIN_TOKEN = "admin-" + uuid.uuid4().hex
METRICS_TOKEN = "metrics-" + uuid.uuid4().hex
CREDENTIALS = Credentials({"CRM": CRM_KEY, "SHOP": SHOP_KEY}, ADMIN_TOKEN, metrics_token=METRICS_TOKEN)
EXTRA_ROUTES = "tests.integration.api.extra_routes"


def bearer(secret: str) -> dict[str, str]:
    """Authorization header for a key or token."""
    return {"Authorization": f"Bearer {secret}"}


CRM = bearer(CRM_KEY)
SHOP = bearer(SHOP_KEY)
ADMIN = bearer(ADMIN_TOKEN)
METRICS = bearer(METRICS_TOKEN)


@pytest.fixture
def api_env(backend: backends.Backend) -> Iterator[backends.Backend]:
    """The backend activated in this process with the API tests' extra route loaded too."""
    backends.activate(dict(backend.env, OPENHUB_ROUTES=f"{backend.env['OPENHUB_ROUTES']},{EXTRA_ROUTES}"))
    yield backend
    backend.activate()


def make_client(**kwargs) -> TestClient:
    """A TestClient over a fresh app with the test credentials (kwargs go to create_app)."""
    kwargs.setdefault("credentials", CREDENTIALS)
    return TestClient(create_app(**kwargs), raise_server_exceptions=False)


@pytest.fixture
def client(api_env: backends.Backend) -> Iterator[TestClient]:
    """An HTTP client of the ingress app on the current backend."""
    with make_client() as c:
        yield c


@pytest.fixture
def cid() -> str:
    """A unique correlation id."""
    return f"c-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def flow_payload(prefix: str) -> dict:
    """A payload of test.flow that a worker (if one runs) carries to OK."""
    return {"prefix": prefix, "n": 1}


def settings():
    """The active settings."""
    return get_settings()
