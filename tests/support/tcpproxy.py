"""A TCP proxy in front of a server, which a test cuts: one process's way to the store lost while the
others keep theirs (a host cut off from PostgreSQL)."""

from __future__ import annotations

import socket
import threading

from tests.support.backends import free_port


class TcpProxy:
    """Forwards 127.0.0.1:`port` to `target`; `cut()` resets every connection and refuses new ones;
    `blackhole()` forwards nothing more, either way, and fails nothing: as a network cut, where a query on an
    open connection, or a new connection's opening, hangs instead of failing."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._cut = False
        self._holes = False
        self._away = False  # `outage()` until `restore()`: new connections refused, the listener kept
        threading.Thread(target=self._accept, daemon=True, name="tcp-proxy").start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # cut: the listener is closed
                return
            if self._away:  # an outage: refused at once (reset), as a server that is down
                _reset(client)
                continue
            if self._holes:  # accepted, and nothing more: its opening never ends
                with self._lock:
                    self._sockets.append(client)
                continue
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._cut:
                    client.close()
                    server.close()
                    return
                self._sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if not self._holes:  # a blackhole: read and dropped
                    sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def blackhole(self) -> None:
        """From now on nothing passes, and nothing fails: every byte sent either way is dropped."""
        self._holes = True

    def cut(self) -> None:
        """Every connection reset, new ones refused."""
        with self._lock:
            self._cut = True
            self._listener.close()
            for s in self._sockets:
                _reset(s)

    def outage(self) -> None:
        """The server away for a moment: every connection reset, new ones refused until `restore()`."""
        with self._lock:
            self._away = True
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            _reset(s)

    def restore(self) -> None:
        """The server back after an `outage()`: new connections pass again."""
        self._away = False


def _reset(s: socket.socket) -> None:
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.shutdown(socket.SHUT_RDWR)
        s.close()
    except OSError:
        pass
