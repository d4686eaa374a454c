"""The one line a list shows of a stored error: the exception that ended it, said usefully."""

from __future__ import annotations

import traceback

import httpx
import pytest

from openhub.core.context import error_line


def _traceback_of(fn) -> str:
    try:
        fn()
    except Exception:
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


@pytest.mark.parametrize(
    "text, line",
    [
        (None, None),
        ("", None),
        ("lease expired in step run r1: its worker is gone", "lease expired in step run r1: its worker is gone"),
        ("\n  Reject: no such customer [E404]\n", "Reject: no such customer [E404]"),
        ("x" * 600, "x" * 499 + "…"),
    ],
)
def test_plain_texts_are_their_first_line_bounded(text: str | None, line: str | None) -> None:
    assert error_line(text) == line


@pytest.mark.parametrize(
    "text, line",
    [
        # HttpCall's transient failure, as a traceback ends with it
        (
            'Traceback (most recent call last):\n  File "x.py", line 1, in f\n    billing.post(ctx, url)\n'
            "openhub.core.errors.TransientError: POST https://billing.example/customers answered 503: "
            '{"error": "down"}\n',
            'HTTP 503 from POST https://billing.example/customers: {"error": "down"}',
        ),
        # its rejection, as the engine stores a Reject
        (
            "Reject: PUT https://crm.example/x answered 422: bad field [HTTP_422]",
            "HTTP 422 from PUT https://crm.example/x: bad field",
        ),
        # a 429's postponement
        (
            "GET https://api.example/rates answered 429, Retry-After 5",
            "HTTP 429 from GET https://api.example/rates, Retry-After 5",
        ),
        (
            "openhub.core.errors.TransientError: GET https://api.example/a answered 502",
            "HTTP 502 from GET https://api.example/a",
        ),
        # no answer at all
        (
            "openhub.errors.TransientError: POST https://billing.example/c: "
            "ConnectError: [Errno 111] Connection refused",
            "ConnectError on POST https://billing.example/c: [Errno 111] Connection refused",
        ),
        # the hub's own exceptions without their module; a user's Reject as it was
        ("openhub.core.errors.TransientError: billing is down", "TransientError: billing is down"),
        ("openhub.errors.TransientError: billing is down", "TransientError: billing is down"),  # stored before
        ("Reject: no such customer [E404]", "Reject: no such customer [E404]"),
    ],
)
def test_one_format_for_every_http_failure(text: str, line: str) -> None:
    # Issue 40: three formats (httpx's, HttpCall's TransientError, a traceback) for one kind of failure.
    assert error_line(text) == line
