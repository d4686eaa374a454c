"""uvicorn glue for `openhub serve`: the HTTP protocol class, with TCP_NODELAY on every connection.

With `--workers N` uvicorn binds the listening socket itself without `proto=IPPROTO_TCP`, so
asyncio does not enable TCP_NODELAY on accepted connections and every keep-alive response
waits ~40 ms for the client's delayed ACK (Nagle; uvicorn issue #3149). The protocol below
sets the option itself when a connection is made. httptools' parser is used when installed.
"""

from __future__ import annotations

import asyncio
import socket

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Base
except ImportError:  # pragma: no cover - httptools is a dependency; h11 is uvicorn's own fallback
    from uvicorn.protocols.http.h11_impl import H11Protocol as _Base  # type: ignore[assignment]

PROTOCOL = "openhub.api.server:NoDelayHTTPProtocol"


class NoDelayHTTPProtocol(_Base):  # type: ignore[misc, valid-type]
    """uvicorn's HTTP protocol, turning Nagle's algorithm off on each TCP connection."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        super().connection_made(transport)
