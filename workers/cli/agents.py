"""The agent-runtime faces: ``effectq mcp`` (docs/agents.md)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from ..agents.mcp import McpFace
    from ..settings import Settings

from ._app import app, fail
from .params import _extra, _settings, _tool, load_tools

_SESSION = re.compile(r"[A-Za-z0-9._:@-]{1,128}")


def _scope_from(pairs: list[str]) -> dict[str, tuple[str, ...]]:
    """``TOOL=FIELD[,FIELD]`` pairs (names only, checked against the declarations later)."""
    out: dict[str, tuple[str, ...]] = {}
    for pair in pairs:
        tool, sep, fields = pair.partition("=")
        names = tuple(f.strip() for f in fields.split(",") if f.strip())
        if not sep or not names or not all(re.fullmatch(r"[A-Za-z_]\w{0,99}", n) for n in names):
            fail(2, "mcp: --scope-from takes TOOL=FIELD[,FIELD] (declared argument names)")
        out[_tool(tool)] = names
    return out


@app.command()
def mcp(
    transport: Annotated[
        str, typer.Option(metavar="stdio|http", help="stdio (default) or streamable HTTP")
    ] = "stdio",
    host: Annotated[
        str | None, typer.Option(metavar="ADDRESS", help="HTTP [default: EFFECTQ_API_HOST]")
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(metavar="PORT", min=1, max=65535, help="HTTP [default: EFFECTQ_API_PORT]"),
    ] = None,
    tool: Annotated[
        list[str] | None,
        typer.Option(metavar="NAME", help="serve this tool (repeat; default: every tool)"),
    ] = None,
    session: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            help="the durable session a stdio server's calls belong to (without one, the "
            "request's idempotency key or the tool's business scope must name each call, "
            "or a restarted server starts a new session)",
        ),
    ] = None,
    scope_from: Annotated[
        list[str] | None,
        typer.Option(
            metavar="TOOL=FIELD[,FIELD]",
            help="name a tool's requests by these declared arguments (a business id)",
        ),
    ] = None,
    upstream: Annotated[
        str | None,
        typer.Option(
            metavar="CONFIG",
            help="proxy mode: front the MCP server this JSON file names, guarding the tools it "
            "marks side-effecting (workers run them: EFFECTQ_TOOLS=workers.agents.upstream, "
            "EFFECTQ_MCP_UPSTREAM=CONFIG)",
        ),
    ] = None,
    wait: Annotated[
        float,
        typer.Option(
            metavar="SECONDS", min=0.1, max=600, help="wait this long for a receipt per call"
        ),
    ] = 20.0,
) -> None:
    """Serve the effect tools over MCP, each call guarded (docs/agents.md)."""
    _extra("mcp", "mcp")
    import anyio

    from .. import logs, tracing
    from ..agents.mcp import McpFace, McpOptions, serve_stdio
    from ..runtime import Runtime, install
    from ..settings import ledger_from_settings

    if transport not in ("stdio", "http"):
        fail(2, "mcp: --transport is stdio or http")
    if session is not None and not _SESSION.fullmatch(session):
        fail(2, "mcp: --session must be 1-128 of A-Z a-z 0-9 . _ : @ -")
    if session is not None and transport == "http":
        # Every HTTP client would share it: their calls would be one another's repeats.
        fail(2, "mcp: --session names a stdio server's session; HTTP has one per client")
    scopes = _scope_from(scope_from or [])  # checked before anything is contacted
    named = tuple(_tool(t) for t in tool or ())
    cfg = _settings()
    logs.setup(cfg)  # stderr: stdout is the stdio transport's
    tracing.configure(cfg)
    install(Runtime.from_settings(cfg))
    proxied = None
    if upstream is None:
        load_tools(cfg)
    else:
        from ..agents import upstream as proxy

        proxied = proxy.load_config(upstream)
        proxy.declare(proxied)
    ledger_from_settings(cfg)  # refuse to start on a ledger that cannot be trusted (no AOF)
    served = named or tuple(proxied.tools if proxied else ())
    try:
        face = McpFace(
            McpOptions(
                tools=served,
                timeout=wait,
                session=session,
                scope_from=scopes,
            ),
            upstream=proxied.upstream if proxied else None,
        )
    except ValueError as exc:  # a served tool or a scope field not declared: names only
        fail(2, f"mcp: {exc}")
    if transport == "stdio":
        anyio.run(serve_stdio, face)
        return
    _serve_http(face, cfg, host or cfg.api_host, port or cfg.api_port)


def _serve_http(face: McpFace, cfg: Settings, host: str, port: int) -> None:
    import uvicorn

    from ..agents.mcp import http_app
    from ..api.auth import Tokens, parse_tokens

    try:
        parsed = parse_tokens(cfg.api_tokens.get_secret_value())
    except ValueError as exc:  # its message names the entry, never a token
        fail(2, str(exc))
    if not parsed:
        fail(2, "EFFECTQ_API_TOKENS is empty: every request would be refused")
    application = http_app(
        face, Tokens(parsed, session_s=cfg.api_session_s), max_body=cfg.api_max_body_bytes
    )
    # No access log: uvicorn's prints paths and client addresses; no logging config of its
    # own (its lines go through workers.logs).
    uvicorn.run(
        application, host=host, port=port, access_log=False, server_header=False, log_config=None
    )
