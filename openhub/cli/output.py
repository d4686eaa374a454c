"""How the commands print: rich consoles and tables for people, stored data shown verbatim (never read as
markup, control characters escaped), and the one-line answers the commands share."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import click

from openhub.core.states import State


def make_console() -> Any:
    from rich.console import Console

    # Piped output keeps whole ids and routes instead of rich's 80 columns.
    return Console() if sys.stdout.isatty() else Console(width=200)


_STATE_STYLE = {
    State.OK: "green",
    State.FAILED: "red",
    State.PARTLY_FAILED: "yellow",
    State.POSTPONED: "yellow",
    State.CANCEL: "dim",
    State.SKIPPED: "dim",
}


def state_text(state: Any) -> Any:
    from rich.text import Text

    return Text(str(state), style=_STATE_STYLE.get(str(state), ""))


# Control characters would move the cursor or recolour the terminal; they are shown escaped.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def escaped(value: Any) -> str:
    """Stored data as plain text with its control characters escaped (`\\x9b`), for click.echo."""
    text = "" if value is None else str(value)
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def verbatim(value: Any, style: str = "") -> Any:
    """Stored data as a rich Text: printed as it is (never read as markup), control characters escaped."""
    from rich.text import Text

    return Text(escaped(value), style=style)


def short(text: str, limit: int = 120) -> str:
    from openhub.core.context import error_line

    return error_line(text, limit) or ""


def print_error(console: Any, line: str, whole: str, verbose: bool) -> bool:
    """Print an error as its line (with --verbose, its whole text); whether the whole text says more."""
    more = whole.strip() != line
    console.print(verbatim(whole.strip() if verbose else line), highlight=False)
    return more


def counted(n: int, noun: str) -> str:
    """`1 message`, `0 messages`, `2 messages`."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def echo_done(view: Any, verb: str, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(view.as_dict(), ensure_ascii=False))
    else:
        click.echo(f"message {view.id} {verb}: now {view.state}")
