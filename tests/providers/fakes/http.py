"""A threaded local HTTP server for the provider fakes: each fake answers the requests its
provider's official SDK sends (method, path, query, form or JSON body, headers) with the
bodies that SDK parses. Bound to 127.0.0.1 on a free port; stopped by the test."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes

    def form(self) -> dict[str, str]:
        return dict(parse_qsl(self.body.decode(), keep_blank_values=True))

    def json(self) -> Any:
        return json.loads(self.body or b"null")


@dataclass
class Reply:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False  # close the connection without an answer: a lost response


class Fake:
    """A provider fake: ``handle`` maps a request to a reply, under one lock (the
    provider's own serialisation); ``clock`` may be advanced by a test."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.offset_s = 0.0
        self.requests: list[tuple[str, str]] = []

    def now(self) -> float:
        return time.time() + self.offset_s

    def handle(self, request: Request) -> Reply:
        raise NotImplementedError


def _handler(fake: Fake) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return None

        def _serve(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            request = Request(
                self.command,
                parts.path,
                dict(parse_qsl(parts.query, keep_blank_values=True)),
                {k.lower(): v for k, v in self.headers.items()},
                self.rfile.read(length) if length else b"",
            )
            with fake.lock:
                fake.requests.append((request.method, request.path))
                reply = fake.handle(request)
            if reply.drop:
                self.close_connection = True
                self.connection.close()
                return
            data = b"" if reply.body is None else json.dumps(reply.body).encode()
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _serve

    return Handler


@contextmanager
def serving(fake: Fake) -> Iterator[str]:
    """Serve ``fake``; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
