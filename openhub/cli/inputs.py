"""Option values the commands share, parsed once: a JSON payload given as text or in a file, an ISO 8601
timestamp; a bad one ends the command as a usage error, never a traceback."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def json_input(what: str) -> Callable[[F], F]:
    """The --payload/-p and --file/-f options of a command taking a JSON value (`what` names it in the
    help), passed as `payload` and `payload_file`; read them with json_given."""

    def options(command: F) -> F:
        command = click.option(
            "--file",
            "-f",
            "payload_file",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            help=f"A file holding {what} as JSON.",
        )(command)
        return click.option("--payload", "-p", help=f"{what[0].upper()}{what[1:]} as JSON text.")(command)

    return options


def json_given(payload: str | None, payload_file: Path | None) -> Any:
    """The JSON value given as --payload text or in a --file (exactly one of them)."""
    if (payload is None) == (payload_file is None):
        raise click.UsageError("give exactly one of --payload and --file")
    text = payload if payload is not None else payload_file.read_text(encoding="utf-8")  # type: ignore[union-attr]
    try:
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--payload/--file") from None


def timestamp(value: str | None, option: str) -> Any:
    """An ISO 8601 option as naive UTC; a clean usage error when it is not one."""
    from openhub.engine.intake import to_utc

    try:
        return to_utc(value, option)
    except OverflowError:
        raise click.BadParameter("out of range once converted to UTC", param_hint=option) from None
