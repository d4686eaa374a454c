"""A route's `secret_fields`: the values at dotted paths of a JSON-like payload, to redact from what a step
sends and says (`secret_values`, given to `openhub.core.redact.secrets_scope`), and masked where a payload
is shown (`mask_fields`). A path goes through lists: `lines.pin` is every line's pin."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from openhub.core.redact import REDACTED


def secret_values(document: Any, paths: Iterable[str]) -> list[Any]:
    """The leaf values at dotted `paths` of a JSON-like document."""
    return [leaf for path in paths for value in _at(document, path.split(".")) for leaf in _leaves(value)]


def _at(value: Any, parts: list[str]) -> Iterator[Any]:
    if not parts:
        yield value
    elif isinstance(value, dict) and parts[0] in value:
        yield from _at(value[parts[0]], parts[1:])
    elif isinstance(value, list):  # a path goes through lists: `lines.pin` is every line's pin
        for item in value:
            yield from _at(item, parts)


def _leaves(value: Any) -> Iterator[Any]:
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif item is not None:
            yield item


def mask_fields(document: Any, paths: Iterable[str]) -> Any:
    """A copy of `document` with the values at dotted `paths` replaced by `[redacted]` (a payload shown to
    readers: the route marked those fields secret)."""
    split = [p.split(".") for p in paths]
    if not split:
        return document
    copy = json.loads(json.dumps(document))
    for parts in split:
        _mask(copy, parts)
    return copy


def _mask(value: Any, parts: list[str]) -> None:
    if isinstance(value, list):
        for item in value:
            _mask(item, parts)
    elif isinstance(value, dict) and parts[0] in value:
        if len(parts) == 1:
            value[parts[0]] = REDACTED
        else:
            _mask(value[parts[0]], parts[1:])
