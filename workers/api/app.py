"""The ASGI app of ``effectq api``: the ``/v1`` routes, the console, their guards.

``create_app()`` reads ``EFFECTQ_*`` settings, imports the tools (``EFFECTQ_TOOLS``) and
refuses to build without tokens. The OpenAPI document it serves at ``/openapi.json`` is
committed as ``docs/openapi.json`` (``effectq api --openapi`` prints it; a test holds the
two equal). No interactive docs pages: they would load scripts from a CDN.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

import redis
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, RedirectResponse

from dedupe import EffectqError

from .. import registry
from ..runtime import Runtime, current, install
from ..settings import Settings
from . import console, problems, routes
from .auth import Tokens, parse_tokens
from .limits import AccessLog, BodyLimit

__all__ = ["create_app", "openapi_document", "serve"]

DESCRIPTION = """\
Submit side-effecting tool calls and campaigns to effectq, read effects and campaign
progress, and act on effects as an operator. Bodies are the JSON documents of the
`effectq … --json` commands. Authenticate with `Authorization: Bearer <token>`; a token's
scopes (`submit`, `read`, `operate`) decide which routes it may call, and operator actions
are audited under the token's name."""


def healthz() -> dict[str, str]:
    """Liveness: the process serves requests. No token, no ledger."""
    return {"status": "ok"}


def readyz() -> JSONResponse:
    """Readiness: the ledger answers (503 while it does not: every route needs it). No
    token."""
    try:
        current().ledger().server_time_ms()
    except (EffectqError, redis.RedisError):
        return JSONResponse({"status": "unavailable"}, status_code=503)
    return JSONResponse({"status": "ok"})


def _build(tokens: Tokens, cfg: Settings) -> FastAPI:
    app = FastAPI(
        title="effectq",
        version=version("effectq"),
        description=DESCRIPTION,
        docs_url=None,
        redoc_url=None,
        generate_unique_id_function=lambda route: route.name,  # operationId = handler name
        # Spans and OpenTelemetry logs would carry request paths, and so effect keys.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.tokens = tokens
    app.state.cookie_secure = cfg.api_cookie_secure
    problems.install(app)
    app.include_router(routes.router)
    app.include_router(console.router)
    app.add_api_route(
        "/", lambda: RedirectResponse("/console", status_code=303), include_in_schema=False
    )
    # Probes for Kubernetes (charts/effectq): outside /v1, unauthenticated, no detail.
    app.add_api_route("/healthz", healthz, methods=["GET"])
    app.add_api_route(
        "/readyz",
        readyz,
        methods=["GET"],
        responses={503: {"description": "the ledger does not answer"}},
    )
    app.add_middleware(AccessLog)
    # Outermost: an oversized body is refused before anything reads it.
    app.add_middleware(
        BodyLimit,
        default=cfg.api_max_body_bytes,
        by_path={"/v1/campaigns": cfg.api_max_campaign_bytes},
    )
    return app


def create_app(cfg: Settings | None = None, runtime: Runtime | None = None) -> FastAPI:
    """The app for ``cfg`` (default: the environment) on ``runtime`` (default: one built
    from ``cfg``), installed as this process's runtime with the tools of ``cfg.tools``.
    Raises ValueError for a bad or empty ``EFFECTQ_API_TOKENS`` (the message names the
    entry, never a token)."""
    cfg = cfg or (runtime.settings if runtime is not None else Settings())
    parsed = parse_tokens(cfg.api_tokens.get_secret_value())
    if not parsed:
        raise ValueError("EFFECTQ_API_TOKENS is empty: every request would be refused")
    install(runtime or Runtime.from_settings(cfg))
    registry.load(cfg.tools)
    return _build(Tokens(parsed, session_s=cfg.api_session_s), cfg)


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document the app serves (it does not depend on settings or tokens)."""
    document: dict[str, Any] = _build(Tokens((), session_s=0), Settings()).openapi()
    return document


def serve(app: FastAPI, *, host: str, port: int) -> None:
    # No uvicorn access log: it prints paths, and paths carry effect keys (AccessLog
    # prints the route template instead). No logging config of uvicorn's own: its lines
    # go through the process's (workers.logs), in its format.
    uvicorn.run(app, host=host, port=port, access_log=False, server_header=False, log_config=None)
