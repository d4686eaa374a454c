"""Issue 36: operators signed in through an OpenID Connect provider (openhub.api.oidc).

A real HTTP server plays the provider (its discovery document and key set, an RSA key made here); tokens are
signed with PyJWT. A valid token is an operator of the role its claim maps to, named `oidc:<sub>` in the
audit trail; every other token (expired, another issuer or audience, another key, HMAC signed with the
public key, no role) is refused like a wrong key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Iterator
from email.message import Message
from typing import Any

import pytest

from openhub.core.config import get_settings
from openhub.store import audit
from tests.integration.api.conftest import bearer, make_client
from tests.support.stubs import PostStub

jwt = pytest.importorskip("jwt")
rsa = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.rsa")
serialization = pytest.importorskip("cryptography.hazmat.primitives.serialization")

AUDIENCE = "openhub-tests"


class Provider(PostStub):
    """An OpenID Connect provider's public side: /.well-known/openid-configuration and /jwks, counting fetches."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        self.jwks = {"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]}
        self.fetches = 0
        super().__init__("oidc-provider")
        self.issuer = self.url

    def received(self, path: str, headers: Message, body: bytes) -> tuple[int, str | None, bytes]:
        if path == "/.well-known/openid-configuration":
            answer: Any = {"issuer": self.issuer, "jwks_uri": self.issuer + "/jwks"}
        elif path == "/jwks":
            self.fetches += 1
            answer = self.jwks
        else:
            return 404, None, b""
        return 200, "application/json", json.dumps(answer).encode()

    def token(self, key: Any = None, kid: str = "k1", algorithm: str = "RS256", **claims: Any) -> str:
        now = int(time.time())
        body = {"iss": self.issuer, "aud": AUDIENCE, "sub": "alice", "iat": now, "exp": now + 300, **claims}
        body = {k: v for k, v in body.items() if v is not None}
        return jwt.encode(body, key if key is not None else self.key, algorithm=algorithm, headers={"kid": kid})


def _forged(header: dict[str, Any], claims: dict[str, Any], sign: Any) -> str:
    """A JWT put together by hand (PyJWT refuses to make these): header.claims.signature, base64url."""

    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signed = f"{part(json.dumps(header).encode())}.{part(json.dumps(claims).encode())}"
    return f"{signed}.{part(sign(signed.encode()))}"


@pytest.fixture
def provider() -> Iterator[Provider]:
    p = Provider()
    yield p
    p.stop()


def _client(provider: Provider, **more: Any):
    settings = get_settings()
    import dataclasses

    return make_client(
        settings=dataclasses.replace(settings, oidc_issuer=provider.issuer, oidc_audience=AUDIENCE, **more)
    )


def test_a_providers_token_is_an_operator_of_the_role_its_claim_maps_to(api_env, provider: Provider) -> None:
    with _client(provider, oidc_roles={"ops": "operator", "ops-admins": "admin"}) as client:
        operator = bearer(provider.token(roles=["staff", "ops"]))
        assert client.get("/api/v1/whoami", headers=operator).json() == {
            "name": "oidc:alice",
            "role": "operator",
            "source_system": None,
        }
        # the highest role the claim maps to; a claim given as one string is read too
        both = bearer(provider.token(sub="bob", roles=["ops", "ops-admins"]))
        assert client.get("/api/v1/whoami", headers=both).json()["role"] == "admin"
        single = bearer(provider.token(sub="carol", roles="ops-admins"))
        assert client.get("/api/v1/whoami", headers=single).json()["role"] == "admin"

        assert client.post("/api/v1/tokens", headers=operator, json={"name": "x", "role": "viewer"}).status_code == 403
        reason = f"oidc-{uuid.uuid4().hex[:8]}"
        done = client.post("/api/v1/breakers/test-billing:reset", headers=operator, json={"reason": reason})
        assert done.status_code == 200, done.text
        entry = next(
            e
            for e in audit.entries(who="oidc:alice", limit=20, url=get_settings().database_url)
            if reason in json.dumps(e)
        )
        assert entry["role"] == "operator"
    assert provider.fetches == 1  # the key set is cached between requests


def test_tokens_the_provider_did_not_issue_for_this_hub_are_refused(api_env, provider: Provider) -> None:
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public_pem = provider.key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    refused = {
        "expired": provider.token(roles=["operator"], iat=int(time.time()) - 900, exp=int(time.time()) - 600),
        "another issuer": provider.token(roles=["operator"], iss="https://evil.example.com"),
        "another audience": provider.token(roles=["operator"], aud="someone-else"),
        "no subject": provider.token(roles=["operator"], sub=None),
        "no role": provider.token(),
        "a role this hub does not map": provider.token(roles=["root"]),
        "signed by another key": provider.token(other, roles=["admin"]),
        "an unknown key id": provider.token(other, kid="k2", roles=["admin"]),
        # the public key used as an HMAC secret: a verifier that let the token choose its algorithm takes it
        "HS256 with the public key": _forged(
            {"alg": "HS256", "kid": "k1"},
            {"iss": provider.issuer, "aud": AUDIENCE, "sub": "eve", "exp": int(time.time()) + 300, "roles": "admin"},
            lambda signed: hmac.new(public_pem, signed, hashlib.sha256).digest(),
        ),
        "unsigned": _forged(
            {"alg": "none", "kid": "k1"},
            {"iss": provider.issuer, "aud": AUDIENCE, "sub": "eve", "exp": int(time.time()) + 300, "roles": "admin"},
            lambda signed: b"",
        ),
    }
    with _client(provider) as client:
        assert client.get("/api/v1/whoami", headers=bearer(provider.token(roles=["viewer"]))).status_code == 200
        for what, token in refused.items():
            answer = client.get("/api/v1/whoami", headers=bearer(token))
            assert answer.status_code == 401, f"{what}: {answer.status_code} {answer.text}"
    # made-up key ids fetch the key set again at most once per cooldown, not once per token
    assert provider.fetches <= 2


def test_a_provider_setting_that_cannot_work_stops_the_start(api_env, provider: Provider) -> None:
    import dataclasses

    from openhub.api.app import create_app
    from openhub.core.errors import ConfigurationError
    from tests.integration.api.conftest import CREDENTIALS

    settings = get_settings()
    with pytest.raises(ConfigurationError, match="OPENHUB_OIDC_AUDIENCE"):
        create_app(settings=dataclasses.replace(settings, oidc_issuer=provider.issuer), credentials=CREDENTIALS)
    with pytest.raises(ConfigurationError, match="OPENHUB_OIDC_ROLES"):
        create_app(
            settings=dataclasses.replace(
                settings, oidc_issuer=provider.issuer, oidc_audience=AUDIENCE, oidc_roles={"ops": "root"}
            ),
            credentials=CREDENTIALS,
        )
