"""HTTP/1.1 over asyncio streams, as little of it as the benchmarks need."""

from __future__ import annotations

import asyncio


async def read_message(reader: asyncio.StreamReader) -> bytes:
    """Read one request or response (head and Content-Length body); return its head."""
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
            if length:
                await reader.readexactly(length)
    return head
