"""Which step failures count against a system's circuit breaker (issue 27): only the system's own
transport errors, timeouts and overload answers, never a bug in the step's code."""

from __future__ import annotations

import httpx
import pytest

from openhub.core.errors import Reject, TransientError
from openhub.outbound.breaker import counts_against_system


def _status_error(status: int) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://billing.example/x")
    return httpx.HTTPStatusError("bad", request=request, response=httpx.Response(status, request=request))


def _raised_from(exc: Exception, cause: BaseException) -> Exception:
    exc.__cause__ = cause
    return exc


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ConnectError("refused"),
        httpx.ReadTimeout("slow"),
        httpx.RemoteProtocolError("cut"),
        _status_error(500),
        _status_error(503),
        _status_error(408),
        _status_error(425),
        _status_error(429),
        ConnectionError("reset"),
        TimeoutError("slow"),
        TransientError("billing is down"),
        _raised_from(TransientError("POST http://b/x: ConnectError"), httpx.ConnectError("refused")),
    ],
)
def test_the_systems_own_faults_count(exc: Exception) -> None:
    assert counts_against_system(exc)


@pytest.mark.parametrize(
    "exc",
    [
        KeyError("missing"),
        ValueError("bad"),
        TypeError("bug"),
        ZeroDivisionError(),
        Reject("no"),
        _status_error(400),
        _status_error(404),
        _status_error(409),
        _raised_from(RuntimeError("wrapped"), KeyError("missing")),
        # Issue 34 M4: refused by this process before a byte reached the system (a newline in a header value)
        httpx.LocalProtocolError("Illegal header value b'x\\n'"),
        httpx.UnsupportedProtocol("ftp"),
        httpx.PoolTimeout("no free connection"),
        _raised_from(TransientError("POST http://b/x: LocalProtocolError"), httpx.LocalProtocolError("header")),
    ],
)
def test_other_errors_do_not(exc: Exception) -> None:
    assert not counts_against_system(exc)
