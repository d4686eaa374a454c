"""Named operator tokens (`openhub tokens add|list|revoke`, /api/v1/tokens): a role each, kept hashed.

Kept in the store whose `url` the driver gives (the API's served hub's, the CLI's process database).

A token is 32 random bytes; the store keeps only its SHA-256 (a secret of that entropy needs no slow
hash), so the secret is shown once, when it is made. A revoked token is refused at once and kept,
so the audit entries naming it still say who it was. Every change is audited.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import Any

from sqlalchemy import select, update

from openhub.core.context import aware
from openhub.core.errors import InputError, NotFound, StateConflict
from openhub.store import audit
from openhub.store.db import store_now, transaction
from openhub.store.schema import operator_tokens

T = operator_tokens.c
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,99}")
RESERVED = ("admin",)  # the static OPENHUB_ADMIN_TOKEN's name in the trail; `local:` names the CLI's user


def digest(secret: str) -> str:
    """The hex SHA-256 a token is kept and looked up by."""
    return hashlib.sha256(secret.encode()).hexdigest()


def add(name: str, role: str, *, url: str) -> str:
    """Make a token `name` with `role`; the secret, shown this once."""
    if not isinstance(name, str) or not NAME.fullmatch(name) or name in RESERVED:
        raise InputError(
            f"a token's name is 1-100 letters, digits or ._@- (not {', '.join(RESERVED)}), "
            f"starting with a letter or digit: {name!r}"
        )
    if role not in audit.ROLES:
        raise InputError(f"role must be one of {', '.join(audit.ROLES)}, not {role!r}")
    secret = "ohk_" + secrets.token_urlsafe(32)
    with transaction(url) as conn:
        if conn.execute(select(T.name).where(T.name == name)).first() is not None:
            raise StateConflict(f"a token named {name!r} exists (revoked ones keep their name for the audit)")
        now = store_now(url)
        conn.execute(
            operator_tokens.insert().values(
                name=name, role=role, digest=digest(secret), created_at=now, created_by=audit.current_actor().name[:100]
            )
        )
        audit.record(conn, "token.add", target=name, new={"role": role}, now=now)
    return secret


def revoke(name: str, *, url: str) -> None:
    """Revoke the token `name`: refused from now on."""
    with transaction(url) as conn:
        row = conn.execute(select(operator_tokens).where(T.name == name)).first()
        if row is None:
            raise NotFound(f"no token named {name!r}")
        if row.revoked_at is not None:
            raise StateConflict(f"token {name!r} is already revoked")
        now = store_now(url)
        conn.execute(update(operator_tokens).where(T.name == name).values(revoked_at=now))
        audit.record(conn, "token.revoke", target=name, old={"role": row.role}, new={"revoked": True}, now=now)


def listing(*, url: str) -> list[dict[str, Any]]:
    """Every token (never its secret or digest), oldest first."""
    with transaction(url) as conn:
        rows = conn.execute(select(operator_tokens).order_by(T.created_at, T.name)).all()
    return [
        {
            "name": r.name,
            "role": r.role,
            "created_at": aware(r.created_at).isoformat(),
            "created_by": r.created_by,
            "revoked_at": aware(r.revoked_at).isoformat() if r.revoked_at else None,
        }
        for r in rows
    ]


def lookup(secret: str, *, url: str) -> tuple[str, str] | None:
    """(name, role) of the live token with this secret, or None."""
    with transaction(url) as conn:
        row = conn.execute(select(T.name, T.role).where(T.digest == digest(secret), T.revoked_at.is_(None))).first()
    return (row.name, row.role) if row is not None else None
