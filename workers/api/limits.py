"""Two outermost ASGI layers: request bodies bounded, and an access log without keys.

A body over its bound is answered 413 before it is read (``Content-Length``) or as soon as
the streamed bytes pass the bound (chunked). The access log names the route *template*
(``/v1/effects/{key}``), never the path, so no effect key or campaign id reaches the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dedupe.identity import KEY_OR_PREFIX

from .problems import ApiProblem

__all__ = ["AccessLog", "BodyLimit"]

log = logging.getLogger("workers.api.access")


class BodyLimit:
    def __init__(self, app: ASGIApp, *, default: int, by_path: Mapping[str, int]) -> None:
        self.app = app
        self.default = default
        self.by_path = dict(by_path)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.by_path.get(scope["path"], self.default)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await ApiProblem(400, "bad_request", "invalid Content-Length").response()(
                    scope, receive, send
                )
                return
            if int(declared) > limit:
                await _too_large(limit).response()(scope, receive, send)
                return
        seen = 0

        async def bounded() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    # Raised inside the app's body read: the exception handlers answer it.
                    raise HTTPException(413, _too_large(limit).message)
            return message

        await self.app(scope, bounded, send)


def _too_large(limit: int) -> ApiProblem:
    return ApiProblem(413, "too_large", f"request body over the {limit}-byte bound")


class AccessLog:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            # The router put the matched route in the scope; an unmatched path logs as "-".
            route = getattr(scope.get("route"), "path", "-")
            elapsed_ms = (time.perf_counter() - started) * 1000
            # The effect a route names, as every effectq line names one: its key's prefix
            # (workers.logs shortens it), and only a key's shape (a path may carry anything).
            key = scope.get("path_params", {}).get("key")
            extra = {"key": key} if isinstance(key, str) and KEY_OR_PREFIX.fullmatch(key) else None
            log.info("%s %s %d %.0fms", scope["method"], route, status, elapsed_ms, extra=extra)
