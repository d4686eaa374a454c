"""How a secret is recognised: by the name it is kept under (a header, query parameter or field: built-in
words, OPENHUB_REDACT_NAMES and OPENHUB_REDACT_HEADERS) or by its value's shape (an auth scheme, a JWT, a
well-known key prefix, a random-looking token). redact.py applies them to what leaves the hub's hands.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from functools import lru_cache

REDACTED = "[redacted]"

_SECRET_PARTS = re.compile(
    r"token|secret|passw(?:or)?d|passphrase|api[-_]?key|access[-_]?key|private[-_]?key"
    r"|session|signature|subscription|credential|auth|cookie",
    re.IGNORECASE,
)
_SECRET_WORDS = frozenset({"pass", "pwd", "pin", "otp", "jwt", "apikey", "privatekey", "accesskey"})
_SECRET_WHOLE = frozenset({"sig", "key"})
_NOT_SECRET = frozenset({"idempotency-key", "idempotency_key", "idempotencykey"})
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")


def is_secret_name(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether a header, query parameter or field called `name` holds a credential (module docstring)."""
    lower = name.strip().strip("\"'").lower()
    if extra and lower in {e.lower() for e in extra}:
        return True
    return _is_secret_name(name, lower, configured_names())


@lru_cache(maxsize=4096)
def _is_secret_name(name: str, lower: str, configured: frozenset[str]) -> bool:
    if not lower or lower in _NOT_SECRET:
        return False
    if lower in _SECRET_WHOLE or lower in configured or _SECRET_PARTS.search(lower):
        return True
    words = [w.lower() for w in _WORDS.findall(name)]
    return bool(words) and (words[-1] == "key" or any(w in _SECRET_WORDS for w in words))


_configured: frozenset[str] = frozenset()  # the process's settings' names (`configure`)


def configure(names: frozenset[str]) -> None:
    """Recognise `names` (lower case) as secret from now on: the process's OPENHUB_REDACT_NAMES and
    OPENHUB_REDACT_HEADERS, handed down by openhub.core.config wherever the process's settings are set (read
    from the environment, a hub installed by a driver, changed live)."""
    global _configured
    _configured = frozenset(names)


def configured_names() -> frozenset[str]:
    """The names `configure` was last given (lower case): OPENHUB_REDACT_NAMES and OPENHUB_REDACT_HEADERS."""
    return _configured


# Header values that are a credential whatever the header is called: an HTTP auth scheme and its
# credentials, or a JWT (base64url of `{"...` twice, so `eyJ` then `.eyJ`) anywhere in the value.
SECRET_VALUE = re.compile(
    r"^\s*(?:bearer|basic|digest|negotiate)\s+\S|eyJ[A-Za-z0-9_-]*\.eyJ[A-Za-z0-9_-]*\.", re.IGNORECASE
)
# Well-known credential forms, matched whole: a JWT, Stripe/GitHub/Slack/AWS/Google keys, a webhook secret.
_PREFIXED = (
    r"eyJ[A-Za-z0-9_-]*\.eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*"
    r"|\b(?:sk|pk|rk)_(?:live|test)_[A-Za-z0-9]{8,}|\bgh[pousr]_[A-Za-z0-9]{20,}|\bxox[abprse]-[A-Za-z0-9-]{10,}"
    r"|\bAKIA[0-9A-Z]{16}\b|\bwhsec_[A-Za-z0-9+/=]{8,}|\bAIza[A-Za-z0-9_-]{30,}"
)
PREFIXED_TOKEN = re.compile(_PREFIXED)
# What a text must hold for a pattern to be worth running (most texts hold none: the passes stay cheap).
_PREFIX_MARKS = ("eyJ", "_live_", "_test_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "xox", "AKIA", "whsec_", "AIza")
_SCHEME_MARKS = ("bearer", "basic", "digest", "negotiate")
_SCHEMES = re.compile(r"(?P<scheme>\b(?i:Bearer|Basic|Digest|Negotiate)\s+)[A-Za-z0-9._~+/=-]{8,}")
_RUN = re.compile(r"(?<![A-Za-z0-9+=_-])[A-Za-z0-9+=_-]{24,}+")  # a run from its start, taken whole


def redact_shapes(text: str) -> str:
    """`text` with the credential forms (an auth scheme's credentials, prefixed keys, random tokens) redacted."""
    lower = text.lower()
    if any(mark in lower for mark in _SCHEME_MARKS):
        text = _SCHEMES.sub(lambda m: m["scheme"] + REDACTED, text)
    if any(mark in text for mark in _PREFIX_MARKS):
        text = PREFIXED_TOKEN.sub(REDACTED, text)
    return _RUN.sub(lambda m: REDACTED if looks_like_a_token(m.group()) else m.group(), text)


def looks_like_a_token(text: str) -> bool:
    """24+ characters mixing upper case, lower case and digits, with the entropy of random text (base64 and
    base62 keys); not hex (trace ids, digests, UUIDs), words, identifiers or paths."""
    if len(text) < 24 or not (
        any(c.isupper() for c in text) and any(c.islower() for c in text) and sum(c.isdigit() for c in text) >= 2
    ):
        return False
    counts = Counter(text)
    entropy = -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())
    return entropy >= 3.5
