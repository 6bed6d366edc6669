"""A loopback TCP proxy in front of a real redis-server that can lose replies on the wire:
the server runs the command, the client never hears the answer (the reply a network
partition or a dying load balancer drops)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


class ReplyLosingProxy:
    """Forwards every byte both ways until told to lose replies.

    ``lose_replies(on_new_connections=False)`` loses the replies of the connections open now
    (a client that reconnects and resends is heard); ``True`` loses every reply until
    ``hear_replies()``.
    """

    def __init__(self, upstream_port: int) -> None:
        self._upstream = ("127.0.0.1", upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._opened = 0
        self._lose_below = 0  # replies of connections numbered below this are lost
        self._lose_all = False
        self._sockets: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def lose_replies(self, *, on_new_connections: bool) -> None:
        with self._lock:
            self._lose_below = self._opened
            self._lose_all = on_new_connections

    def hear_replies(self) -> None:
        with self._lock:
            self._lose_below = 0
            self._lose_all = False

    def _losing(self, number: int) -> bool:
        with self._lock:
            return self._lose_all or number < self._lose_below

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self._upstream)
            with self._lock:
                number = self._opened
                self._opened += 1
                self._sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, None), daemon=True).start()
            threading.Thread(
                target=self._pipe, args=(upstream, client, number), daemon=True
            ).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, replies_of: int | None) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if replies_of is not None and self._losing(replies_of):
                    continue
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self._listener.close()
        with self._lock:
            for end in self._sockets:
                with contextlib.suppress(OSError):
                    end.close()
        self._thread.join(timeout=5)


@contextlib.contextmanager
def reply_losing_proxy(upstream_port: int) -> Iterator[ReplyLosingProxy]:
    proxy = ReplyLosingProxy(upstream_port)
    try:
        yield proxy
    finally:
        proxy.close()
