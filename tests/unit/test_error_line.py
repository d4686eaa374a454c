"""The one line a list shows of a stored error: the exception that ended it, said usefully."""

from __future__ import annotations

import traceback

import httpx
import pytest

from openhub.context import error_line


def _traceback_of(fn) -> str:  # noqa: ANN001
    try:
        fn()
    except Exception:  # noqa: BLE001 - the text is what is tested
        return traceback.format_exc()
    raise AssertionError("no exception")


def _answered(status: int) -> None:
    request = httpx.Request("POST", "https://billing.example/api/customers")
    httpx.Response(status, request=request).raise_for_status()


def test_an_httpx_status_error_is_its_status_and_url_not_the_mdn_link() -> None:
    text = _traceback_of(lambda: _answered(503))
    assert "developer.mozilla.org" in text.strip().splitlines()[-1]  # what lists showed before
    assert error_line(text) == "HTTP 503 from https://billing.example/api/customers"


def test_a_chained_traceback_is_summarised_by_the_exception_that_ended_it() -> None:
    def chained() -> None:
        try:
            {}["billing_id"]
        except KeyError as exc:
            raise RuntimeError("billing answered without an id\nsecond line") from exc

    assert error_line(_traceback_of(chained)) == "RuntimeError: billing answered without an id"


@pytest.mark.parametrize("text, line", [
    (None, None),
    ("", None),
    ("lease expired in step run r1: its worker is gone", "lease expired in step run r1: its worker is gone"),
    ("\n  Reject: no such customer [E404]\n", "Reject: no such customer [E404]"),
    ("x" * 600, "x" * 499 + "…"),
])
def test_plain_texts_are_their_first_line_bounded(text: str | None, line: str | None) -> None:
    assert error_line(text) == line
