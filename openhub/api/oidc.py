"""Operators signed in through an OpenID Connect provider: a JWT bearer token, verified with PyJWT against
the issuer's published keys (JWKS), is an operator's token whose role is read from a claim.

    OPENHUB_OIDC_ISSUER=https://login.example.com/realms/ops    # the `iss` every token must carry
    OPENHUB_OIDC_AUDIENCE=openhub                               # the `aud` it must name
    OPENHUB_OIDC_JWKS_URL=                # empty: `jwks_uri` of the issuer's /.well-known/openid-configuration
    OPENHUB_OIDC_ROLE_CLAIM=roles         # a string or a list of strings
    OPENHUB_OIDC_ROLES=ops-readers=viewer,ops=operator,ops-admins=admin   # empty: the role names themselves

A token is taken only when it is signed with an asymmetric algorithm by a key of that set (never `none`
nor a shared-secret HMAC, which would let anyone holding the public key sign), has not expired (30 s of
leeway for the clocks), and names the issuer and the audience; its subject (`sub`) is the operator's name
in the audit trail (`oidc:<sub>`), and the highest role its claim maps to is its role. A token that fails
any of that is refused like a wrong key (401, counted by the failure limit). Keys are cached for five
minutes; a token naming a key the set does not hold fetches the set again at most once per 30 s, so
tokens with made-up key ids cannot make the hub hammer the provider.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import httpx

from openhub.core.config import Settings
from openhub.core.errors import ConfigurationError

log = logging.getLogger("openhub.api.oidc")

ROLES = ("viewer", "operator", "admin")  # lowest first, as openhub.store.audit.ROLES
ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]
LEEWAY = 30  # seconds of clock difference allowed on exp, nbf and iat
KEYS_LIFESPAN = 300  # seconds a fetched key set is used before it is fetched again
REFETCH_COOLDOWN = 30  # seconds between fetches for a key id the set does not hold
FETCH_TIMEOUT = 5  # seconds for the provider's discovery document or key set


class OidcVerifier:
    """Verifies operators' JWTs for one issuer; `identify` is safe to call from several threads."""

    def __init__(self, settings: Settings) -> None:
        try:
            import jwt  # noqa: F401 - the optional dependency, checked when the hub starts
        except ImportError as exc:
            raise ConfigurationError("OPENHUB_OIDC_ISSUER needs PyJWT: pip install 'openhub[oidc]'") from exc
        if not settings.oidc_audience:
            raise ConfigurationError("OPENHUB_OIDC_ISSUER is set: OPENHUB_OIDC_AUDIENCE must name this hub")
        unknown = sorted(role for role in settings.oidc_roles.values() if role not in ROLES)
        if unknown:
            raise ConfigurationError(f"OPENHUB_OIDC_ROLES maps to {unknown}: roles are {', '.join(ROLES)}")
        self.issuer = settings.oidc_issuer or ""
        self.audience = settings.oidc_audience
        self.claim = settings.oidc_role_claim
        self.roles = dict(settings.oidc_roles) or {role: role for role in ROLES}
        self._jwks_url = settings.oidc_jwks_url
        self._keys: Any = None
        self._lock = threading.Lock()

    def identify(self, token: str) -> tuple[str, str] | None:
        """(`oidc:<sub>`, role) of a valid token; None for anything else (not a JWT, a bad signature, expired,
        another issuer or audience, no role this hub knows). Blocking: it may fetch the provider's keys."""
        import jwt

        if token.count(".") != 2 or not token.startswith("eyJ"):
            return None  # not a JWT: an API key or a wrong token, refused without asking the provider
        try:
            key = self._key_set().get_signing_key_from_jwt(token)
            claims = jwt.decode(
                token,
                key.key,
                algorithms=ALGORITHMS,
                audience=self.audience,
                issuer=self.issuer,
                leeway=LEEWAY,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except (jwt.PyJWTError, httpx.HTTPError, ValueError) as exc:
            log.info("an OIDC token was refused: %s", type(exc).__name__)
            return None
        role = self._role(claims.get(self.claim))
        if role is None:
            log.info("the OIDC token of %r has no role of this hub in its %r claim", claims["sub"], self.claim)
            return None
        return f"oidc:{str(claims['sub'])[:80]}", role

    def _role(self, value: Any) -> str | None:
        values = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        found = [self.roles[v] for v in values if isinstance(v, str) and v in self.roles]
        return max(found, key=ROLES.index) if found else None

    def _key_set(self) -> Any:
        with self._lock:
            if self._keys is None:
                import jwt

                url = self._jwks_url or _discovered_jwks_url(self.issuer)
                self._keys = jwt.PyJWKClient(
                    url,
                    cache_keys=True,
                    lifespan=KEYS_LIFESPAN,
                    timeout=FETCH_TIMEOUT,
                    cooldown_duration=REFETCH_COOLDOWN,
                )
            return self._keys


def _discovered_jwks_url(issuer: str) -> str:
    """`jwks_uri` of the issuer's OpenID Connect discovery document."""
    answer = httpx.get(issuer.rstrip("/") + "/.well-known/openid-configuration", timeout=FETCH_TIMEOUT)
    answer.raise_for_status()
    url = answer.json().get("jwks_uri")
    if not isinstance(url, str) or not url:
        raise ValueError("the issuer's discovery document has no jwks_uri")
    return url


def verifier(settings: Settings) -> OidcVerifier | None:
    """The verifier OPENHUB_OIDC_ISSUER asks for; None when it is not set."""
    return OidcVerifier(settings) if settings.oidc_issuer else None
