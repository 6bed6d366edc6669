"""Errors as HTTP answers: each error's status and kind read from ``dedupe.errors.CODES``,
the table the CLI's exit codes are read from too. Bodies are ``Problem``
documents: a kind and a one-line reason, never a stack trace, a recipient or a full key
(IdentityError messages name the field, not the value; where a message could carry a key
or a Redis address, a fixed text stands in).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from dedupe import EffectqError, LedgerUnavailableError, TransitionRefusedError
from dedupe.errors import code_of

__all__ = ["ApiProblem", "install", "problem_of"]

log = logging.getLogger("workers.api")

_HTTP_KINDS = {
    400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
    405: "method_not_allowed", 413: "too_large", 415: "unsupported_media_type",
}  # fmt: skip


class ApiProblem(Exception):
    """Raise to answer ``status`` with a Problem body."""

    def __init__(
        self,
        status: int,
        error: str,
        message: str,
        *,
        state: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.error, self.message = status, error, message
        self.state = state
        self.headers = headers

    def response(self) -> JSONResponse:
        body: dict[str, Any] = {"error": self.error, "message": self.message}
        if self.state is not None:
            body["state"] = self.state
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def problem_of(exc: EffectqError) -> ApiProblem:
    code = code_of(exc)
    if code.status == 503:
        # Unavailable, bad credentials, no AOF, a script error: nothing was done, and the
        # operator's log says why (the message may name the Redis address).
        level = logging.WARNING if isinstance(exc, LedgerUnavailableError) else logging.ERROR
        log.log(level, "ledger error: %s", type(exc).__name__)
    elif code.status == 500:
        log.error("unmapped effectq error: %s", type(exc).__name__)
    state = exc.state if isinstance(exc, TransitionRefusedError) else None
    return ApiProblem(code.status, code.kind, code.says or exc.message, state=state)


async def _problem(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiProblem)
    return exc.response()


async def _effectq(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, EffectqError)
    return problem_of(exc).response()


async def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    kind = _HTTP_KINDS.get(exc.status_code, "error")
    return ApiProblem(exc.status_code, kind, str(exc.detail), headers=exc.headers).response()


async def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    # Only where and what: pydantic's ``input`` and ``ctx`` would echo the value (a
    # recipient, say) back.
    errors = [
        {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e["type"])}
        for e in exc.errors()[:50]
    ]
    count = len(exc.errors())
    message = f"{count} invalid field{'s' if count != 1 else ''}"
    return JSONResponse({"error": "invalid", "message": message, "errors": errors}, status_code=422)


async def _internal(request: Request, exc: Exception) -> JSONResponse:
    # The server logs the traceback (uvicorn, at ERROR); the client gets none.
    log.error("internal error on %s: %s", _route_of(request), type(exc).__name__)
    return JSONResponse({"error": "internal", "message": "internal error"}, status_code=500)


def _route_of(request: Request) -> str:
    route = request.scope.get("route")
    return str(getattr(route, "path", "?"))


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiProblem, _problem)
    app.add_exception_handler(EffectqError, _effectq)
    app.add_exception_handler(HTTPException, _http)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(Exception, _internal)
