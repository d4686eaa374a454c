"""A loopback HTTP server that a test's stand-in for another system is built on: each POST (or GET, with an
empty body) goes to the subclass's `received`, whose (status, content type, body) is the answer."""

from __future__ import annotations

import threading
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class PostStub:
    """Serves POSTs (and GETs) on a free loopback port (`url`) from a daemon thread until `stop`. A subclass
    sets its own state before calling `__init__`: requests may arrive as soon as it returns."""

    def __init__(self, name: str = "post-stub") -> None:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, content_type, answer = stub.received(self.path, self.headers, body)
                self.send_response(status)
                if content_type:
                    self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_GET = do_POST  # a GET has no body: `received` is given b""

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # serve_forever looks for shutdown() every poll_interval (0.5 s by default): stop() waited that long,
        # a quarter of a second on average, which the promise model (a stub per example) paid 100 times.
        serve = {"poll_interval": 0.02}
        threading.Thread(target=self.httpd.serve_forever, kwargs=serve, name=name, daemon=True).start()

    def received(self, path: str, headers: Message, body: bytes) -> tuple[int, str | None, bytes]:
        """The answer to one POST: (status, Content-Type or None, body)."""
        raise NotImplementedError

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
