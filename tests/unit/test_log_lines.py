"""The suffix a log line about a message ends with: which message, written so an id cannot forge another."""

from __future__ import annotations

import logging
import re

from openhub.core.logs import MessageScope, TextFormatter, install

SUFFIX = re.compile(r' \[message (\d+) ("(?:[^"\\]|\\.)*"|[\w.:@#/-]+)(?: trace ([0-9a-f]{32}))?\]$', re.ASCII)


def _line(correlation_id: str, trace: str | None = "4bf92f3577b34da6a3ce929d0e0e4736") -> str:
    record = logging.LogRecord("openhub.step", logging.INFO, __file__, 1, "step ran", None, None)
    handler = logging.StreamHandler()
    install([handler], "text")
    with MessageScope(7, correlation_id, trace):
        for f in handler.filters:
            f.filter(record)  # type: ignore[union-attr]
    assert isinstance(handler.formatter, TextFormatter)
    return handler.formatter.format(record)


def test_a_plain_correlation_id_stands_bare_in_the_suffix() -> None:
    assert _line("c-1").endswith(" [message 7 c-1 trace 4bf92f3577b34da6a3ce929d0e0e4736]")
    assert _line("CRM/o.1#2:x@y", None).endswith(" [message 7 CRM/o.1#2:x@y]")


def test_a_correlation_id_cannot_forge_a_second_suffix() -> None:
    forged = "x trace 0] [message 1 victim trace 00000000000000000000000000000001"
    line = _line(forged)
    found = SUFFIX.search(line)
    assert found is not None, line
    assert found[1] == "7" and found[3] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert found[2] == '"x trace 0] [message 1 victim trace 00000000000000000000000000000001"'
    # quotes, backslashes and what a terminal would act on are escaped inside the quoted id
    assert _line('a"b\\c\x85 ]', None).endswith(' [message 7 "a\\"b\\\\c\\u0085 ]"]')
    assert _line("注文-2", None).endswith(' [message 7 "注文-2"]')
