"""uvicorn glue for `openhub serve` and `openhub dev`: the HTTP protocol class, hardened at the
connection level, and the options both commands run uvicorn with (`uvicorn_options`).

- TCP_NODELAY on every connection. With `--workers N` uvicorn binds the listening socket itself
  without `proto=IPPROTO_TCP`, so asyncio does not enable it on accepted connections and every
  keep-alive response waits ~40 ms for the client's delayed ACK (Nagle; uvicorn issue #3149).
- A bound on the request line and headers (`MAX_HEADER_BYTES`): httptools has none and keeps a
  header in memory until it ends, so 50 MB of headers were read whole. Over the bound: 431.
- Lingering close (as nginx does): when a response ends the connection while the client is still
  sending its body (a 413 to a client that did not send `Expect: 100-continue` and asked for
  `Connection: close`, as urllib does), closing at once makes the kernel answer the unread bytes
  with a reset, and the client never reads the 413. Instead the hub half-closes, then reads and
  discards what still comes, bounded by `LINGER_BYTES`, `LINGER_SECONDS` and `LINGER_IDLE`.

httptools' parser is used when installed.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Base
except ImportError:  # pragma: no cover - httptools is a dependency; h11 is uvicorn's own fallback
    from uvicorn.protocols.http.h11_impl import H11Protocol as _Base  # type: ignore[assignment]

PROTOCOL = "openhub.api.server:HubHTTPProtocol"
MAX_HEADER_BYTES = 64 * 1024
LINGER_BYTES = 256 * 1024 * 1024
LINGER_SECONDS = 10.0
LINGER_IDLE = 2.0


def uvicorn_options() -> dict[str, Any]:
    """The connection-level options of every uvicorn the hub starts (`serve` and `dev` alike)."""
    from openhub.core.config import get_settings

    settings = get_settings()
    # Over OPENHUB_MAX_CONCURRENCY connections or requests (per worker) uvicorn answers 503 at once,
    # instead of taking in work until the process runs out of memory.
    options: dict[str, Any] = {"http": PROTOCOL, "limit_concurrency": settings.max_concurrency, "proxy_headers": True}
    # The client address counts refused credentials (openhub.api.auth): behind a proxy it is the address the
    # proxy forwards, from the proxies OPENHUB_TRUSTED_PROXIES names (else every client would be the proxy).
    if settings.trusted_proxies:
        options["forwarded_allow_ips"] = settings.trusted_proxies
    return options


class LingeringTransport:
    """The connection's transport, whose `close()` lingers while the request body is still arriving."""

    def __init__(self, transport: asyncio.Transport, protocol: "HubHTTPProtocol") -> None:
        self._transport = transport
        self._protocol = protocol
        self.lingering = False
        self.lost = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        """Closing from uvicorn's point of view as soon as the lingering starts."""
        return self.lingering or self._transport.is_closing()

    def close(self) -> None:
        """Close now, or half-close and drain when the client is still sending the request body."""
        if self.lingering or self._transport.is_closing():
            return
        if self.lost:
            self._transport.close()
            return
        cycle = getattr(self._protocol, "cycle", None)
        if cycle is None or not cycle.more_body or cycle.disconnected or not self._transport.can_write_eof():
            self._transport.close()
            return
        self.lingering = True
        self._transport.write_eof()  # the response is sent, then FIN; the client may keep sending
        self._transport.resume_reading()
        self._protocol.start_lingering()

    def abort_lingering(self) -> None:
        """End the drain: close the connection for good."""
        self._transport.close()


class HubHTTPProtocol(_Base):  # type: ignore[misc, valid-type]
    """uvicorn's HTTP protocol with TCP_NODELAY, a header-size bound and lingering close."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self._lingering = LingeringTransport(transport, self)
        self._reading_headers = True
        self._header_bytes = 0
        self._skip_count = False
        self._drained = 0
        self._linger_timers: list[asyncio.TimerHandle] = []
        super().connection_made(self._lingering)  # type: ignore[arg-type]

    # --- header bound -----------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._lingering.lingering:
            self._drain(len(data))
            return
        super().data_received(data)
        if self._skip_count:  # the chunk that ended a request may begin the next one: not counted
            self._skip_count = False
            return
        if self._reading_headers and not self._lingering.is_closing():
            self._header_bytes += len(data)
            if self._header_bytes > MAX_HEADER_BYTES:
                self._refuse_headers()

    def on_headers_complete(self) -> None:
        self._reading_headers = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._reading_headers, self._header_bytes, self._skip_count = True, 0, True
        super().on_message_complete()

    def _refuse_headers(self) -> None:
        body = b'{"status":431,"detail":"request line and headers are over the limit of %d bytes"}' % MAX_HEADER_BYTES
        self._lingering.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        )
        self._lingering.abort_lingering()

    # --- lingering close --------------------------------------------------------------------
    def start_lingering(self) -> None:
        """Drain for at most LINGER_SECONDS, LINGER_IDLE without data, LINGER_BYTES in all."""
        self._linger_timers = [
            self.loop.call_later(LINGER_SECONDS, self._lingering.abort_lingering),
            self.loop.call_later(LINGER_IDLE, self._lingering.abort_lingering),
        ]

    def _drain(self, size: int) -> None:
        self._drained += size
        if self._drained > LINGER_BYTES:
            self._lingering.abort_lingering()
            return
        self._linger_timers[1].cancel()
        self._linger_timers[1] = self.loop.call_later(LINGER_IDLE, self._lingering.abort_lingering)

    def eof_received(self) -> bool | None:  # type: ignore[override]
        if self._lingering.lingering:  # the client has sent everything and read the answer
            self._lingering.abort_lingering()
            return None
        return super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lingering.lost = True
        for timer in self._linger_timers:
            timer.cancel()
        super().connection_lost(exc)


NoDelayHTTPProtocol = HubHTTPProtocol  # the name the protocol had before it did more than TCP_NODELAY
