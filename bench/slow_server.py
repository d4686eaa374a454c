"""The external system of bench/peers.py: answers every POST after LATENCY ms, counting each call.

    serve_slow(port, latency_ms)   # in its own process (multiprocessing.Process)

One asyncio loop: a request waits with `asyncio.sleep`, so thousands can be in flight at once
without a thread each. Every call is counted by its path (the benchmarks POST to
`/<step>/<message key>`), with the calls in flight now and their peak. `GET /_stats` answers
{"calls", "keys", "max_per_key", "in_flight", "peak"} (and starts a new peak); `GET /_done` answers
{key: time.time() when the answer to its `/third/<key>` call went out} and forgets them (the last
step's end, for bench/peers.py --rate); `POST /_reset` forgets everything. Each step of every message
called exactly once means calls == keys == 3 x messages and max_per_key == 1.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

from bench.wire import read_message

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


def _answer(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def serve_slow(port: int, latency_ms: float) -> None:
    """Serve on 127.0.0.1:`port` until the process is terminated."""
    delay = latency_ms / 1000
    calls: Counter[bytes] = Counter()
    flight = {"now": 0, "peak": 0}
    done: dict[str, float] = {}  # message key -> when its last step's call was answered

    def stats() -> bytes:
        body = {
            "calls": sum(calls.values()),
            "keys": len(calls),
            "max_per_key": max(calls.values(), default=0),
            "in_flight": flight["now"],
            "peak": flight["peak"],
        }
        flight["peak"] = flight["now"]
        return json.dumps(body).encode()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await read_message(reader)
                method, path = head.split(b" ", 2)[:2]
                if path == b"/_stats":
                    writer.write(_answer(stats()))
                elif path == b"/_done":
                    writer.write(_answer(json.dumps(done).encode()))
                    done.clear()
                elif path == b"/_reset":
                    calls.clear()
                    done.clear()
                    flight["peak"] = flight["now"]
                    writer.write(OK)
                else:
                    calls[path] += 1
                    flight["now"] += 1
                    flight["peak"] = max(flight["peak"], flight["now"])
                    try:
                        if delay:
                            await asyncio.sleep(delay)
                    finally:
                        flight["now"] -= 1
                    writer.write(OK)
                    if path.startswith(b"/third/"):
                        done[path[7:].decode()] = time.time()
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
        async with server:
            await server.serve_forever()

    asyncio.run(main())
