"""MCP face: the declared effect tools served over the Model Context Protocol (``effectq mcp``,
``pip install 'effectq[mcp]'``), on the official ``mcp`` SDK, over stdio or streamable HTTP.

Each tool is listed with its name, description and argument schema (``workers.guard``'s
model of the declared fields, ``additionalProperties: false``); each call goes through the
guard, so a retried call — a reconnect, a model repeating itself, a new request id — finds
the same effect key. The scope of a call is, in order:

1. the request's idempotency key, where the client sends one: SEP-3182's ``idempotencyKey``
   in the ``tools/call`` params (or their ``_meta``), or an ``Idempotency-Key`` header on
   HTTP; namespaced by the caller (``mcp-key:<caller>:<key>``), as a key is only the client's;
2. a business scope the server is told to take from a tool's declared arguments
   (``scope_from={"charge": ("order_id",)}`` → ``order_id:<value>``);
3. the MCP session: ``--session NAME`` (a durable name the client's config gives a stdio
   server), else the HTTP session id, else one per stdio server process.

Never from the arguments themselves: an argument named ``scope``, ``idempotency_key`` or
anything else undeclared is refused, nothing is submitted. Every refusal names fields and
reasons, never a value (and never an undeclared argument's name: the model wrote it).

The answer is a tool result whose text is the guard's (done with the receipt; still
pending, call again with the same arguments; NOT executed; outcome unknown, do not retry)
and whose ``structuredContent`` is ``{status, key, receipt, replayed}``; everything but
done and pending is ``isError``.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

from dedupe import IdentityError

from ..guard import Guarded, Outcome, guarded
from ..registry import tools
from ._checks import ERROR_STATUSES, MAX_ARGUMENT_BYTES, refusal

try:
    import anyio
    import mcp.types as types
    from mcp.server.lowlevel import Server
except ImportError as exc:  # pragma: no cover - the extra's own message
    raise ImportError("workers.agents.mcp needs the MCP SDK: pip install 'effectq[mcp]'") from exc

# After the SDK's own check, so that a missing SDK is named for this module.
from .upstream import Upstream, connect

__all__ = ["McpFace", "McpOptions", "build_server", "http_app", "idempotency_key", "serve_stdio"]

log = logging.getLogger("workers.agents.mcp")

# What a client may send as its idempotency key: long enough for a UUID or a ULID with a
# prefix, printable ASCII only (it enters the scope, which refuses invisible characters).
_KEY = re.compile(r"[A-Za-z0-9._:~+/=-]{1,128}")
_CALLER = re.compile(r"[A-Za-z0-9_.@-]{1,64}")


@dataclass(frozen=True)
class McpOptions:
    """``tools``: the names served (default every declared tool); ``timeout``: how long a
    call waits for its receipt before answering "still pending"; ``session``: the durable
    session name of a stdio server; ``scope_from``: per tool, the declared arguments whose
    values name the request; ``max_argument_bytes``: a call's arguments as JSON, at most."""

    tools: tuple[str, ...] = ()
    timeout: float = 20.0
    session: str | None = None
    scope_from: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    max_argument_bytes: int = MAX_ARGUMENT_BYTES


def idempotency_key(params: types.CallToolRequestParams) -> str | None:
    """SEP-3182's ``idempotencyKey``: in the params themselves, else in their ``_meta``."""
    found = (params.model_extra or {}).get("idempotencyKey")
    if found is None and params.meta is not None:
        found = (params.meta.model_extra or {}).get("idempotencyKey")
    if found is None:
        return None
    return found if isinstance(found, str) else ""


_AT_MOST_ONCE = (
    "A side effect, made at most once per request: calling again with the same arguments "
    "returns the original result and does not repeat it."
)
_GUARDED = types.ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=True)


class McpFace:
    """The served tools and what one call does: transport-free (the server and the tests
    drive it), synchronous (the SDK runs it in a worker thread)."""

    def __init__(self, options: McpOptions | None = None, upstream: Upstream | None = None) -> None:
        self.options = options or McpOptions()
        # Proxy mode: the guarded tools are the upstream's side-effecting ones; the upstream's
        # other tools pass through (workers.agents.upstream).
        self.upstream = upstream
        names = self.options.tools or tuple(t.name for t in tools())
        self.guards: dict[str, Guarded] = {
            name: guarded(name, timeout=self.options.timeout) for name in names
        }
        for name, fields in self.options.scope_from.items():
            guard = self.guards.get(name)
            if guard is None:
                raise ValueError(f"scope_from names a tool not served: {name}")
            spec = guard.tool.spec
            # Generated text (free fields) never names a request; only effect-bearing fields.
            if not fields or not set(fields) <= set(spec.identity) | set(spec.bound):
                raise ValueError(f"scope_from of {name}: name identity or bound fields only")
        # A stdio server process is one session unless the client's config names a durable one.
        self._process_session = uuid.uuid4().hex

    def fronted(self, tool: types.Tool) -> types.Tool:
        """An upstream tool as the proxy lists it: its schema cut to the declared fields
        (the key argument effectq fills in is not the model's), nothing else accepted."""
        guard = self.guards[tool.name]
        declared = guard.tool.spec.fields
        schema = dict(tool.inputSchema)
        schema["properties"] = {
            k: v for k, v in (schema.get("properties") or {}).items() if k in declared
        }
        schema["required"] = [r for r in schema.get("required") or [] if r in declared]
        schema["additionalProperties"] = False
        return tool.model_copy(
            update={
                "description": f"{tool.description or guard.name}\n\n{_AT_MOST_ONCE}",
                "inputSchema": schema,
                # The answer is effectq's ({status, key, receipt, replayed}), not the tool's.
                "outputSchema": None,
                "annotations": _GUARDED,
            }
        )

    def listed(self) -> list[types.Tool]:
        return [
            types.Tool(
                name=guard.name,
                description=f"{guard.description}\n\n{_AT_MOST_ONCE}",
                inputSchema=guard.args_schema.model_json_schema(),
                annotations=_GUARDED,
            )
            for guard in self.guards.values()
        ]

    def scope(
        self,
        guard: Guarded,
        args: Mapping[str, Any],
        *,
        key: str | None,
        caller: str,
        session: str | None,
    ) -> str:
        """The request's scope: its idempotency key, the tool's business scope, the session
        (module docstring). ``key`` was checked by ``call``."""
        if key is not None:
            return f"mcp-key:{caller}:{key}"
        fields = self.options.scope_from.get(guard.name)
        if fields and all(isinstance(args.get(f), str | int) for f in fields):
            return ":".join(f"{f}:{args[f]}" for f in fields)
        if self.options.session is not None:
            return f"mcp-session:{self.options.session}"
        return f"mcp-session:{caller}:{session or self._process_session}"

    def call(
        self,
        name: str,
        arguments: Mapping[str, Any] | None,
        *,
        key: str | None = None,
        caller: str = "local",
        session: str | None = None,
    ) -> types.CallToolResult:
        guard = self.guards.get(name)
        if guard is None:
            # The name is the model's: not repeated.
            served = ", ".join(sorted(self.guards))
            return _refused("NOT executed: no such tool here. The tools are: " + served)
        args = dict(arguments or {})
        if key is not None and not _KEY.fullmatch(key):
            allowed = "1-128 of A-Z a-z 0-9 . _ : ~ + / = -"
            return _refused(
                f"{guard.name} NOT executed: the request's idempotency key is not usable "
                f"({allowed})."
            )
        if refused := refusal(guard, args, max_bytes=self.options.max_argument_bytes):
            return _refused(f"{guard.name} NOT executed: {refused}")
        try:
            scope = self.scope(guard, args, key=key, caller=caller, session=session)
            outcome = guard.invoke(args, runtime_scope=scope)
        except IdentityError as exc:  # a scope from the arguments with no canonical form
            return _refused(f"{guard.name} NOT executed: {exc.message}")
        except Exception as exc:  # the ledger or the broker: named by type, never by text
            log.warning("%s: effectq did not answer: %s", guard.name, type(exc).__name__)
            text = (
                f"{guard.name}: effectq did not answer ({type(exc).__name__}); the call may or "
                "may not have been submitted. Calling again with the same arguments never "
                "submits it twice: try again shortly."
            )
            return _refused(text, status="unavailable")
        return _outcome(outcome)


def _refused(text: str, *, status: str = "invalid") -> types.CallToolResult:
    """A call refused before submission (nothing was executed), or one effectq could not
    answer (``unavailable``)."""
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structuredContent={"status": status, "key": None, "receipt": None, "replayed": False},
        isError=True,
    )


def _outcome(outcome: Outcome) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=str(outcome))],
        structuredContent={
            "status": outcome.status.value,
            "key": outcome.key,
            "receipt": outcome.receipt,
            "replayed": outcome.replayed,
        },
        isError=outcome.status.value in ERROR_STATUSES,
    )


# -- the server ---------------------------------------------------------------------------


# Where the HTTP layer leaves the caller it authenticated (the ASGI scope of the request).
CALLER_SCOPE_KEY = "effectq.caller"


def build_server(face: McpFace) -> Server[Any, Any]:
    """The MCP server of ``face``. The SDK's own tools/call handler is not used: it checks
    arguments with jsonschema, whose messages repeat the refused value."""
    server: Server[Any, Any] = Server("effectq", version=version("effectq"))

    async def list_tools(_request: types.ListToolsRequest) -> types.ServerResult:
        if face.upstream is None:
            return types.ServerResult(types.ListToolsResult(tools=face.listed()))
        try:
            async with connect(face.upstream) as upstream:
                theirs = (await upstream.list_tools()).tools
        except Exception as exc:  # its address or its text stays out of the answer
            log.warning("upstream tools/list failed: %s", type(exc).__name__)
            return types.ServerResult(types.ListToolsResult(tools=face.listed()))
        listed = [face.fronted(t) if t.name in face.guards else t for t in theirs]
        return types.ServerResult(types.ListToolsResult(tools=listed))

    async def pass_through(name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
        assert face.upstream is not None
        try:
            async with connect(face.upstream) as upstream:
                return await upstream.call_tool(name, arguments)
        except Exception as exc:
            log.warning("upstream call failed: %s", type(exc).__name__)
            text = "the upstream server did not answer; nothing is known of this call."
            return _refused(text, status="unavailable")

    async def call_tool(request: types.CallToolRequest) -> types.ServerResult:
        ctx = server.request_context
        http = ctx.request
        key = idempotency_key(request.params)
        caller, session = "stdio", None
        if http is not None:
            caller = str(http.scope.get(CALLER_SCOPE_KEY, "anonymous"))
            session = http.headers.get("mcp-session-id")
            if key is None:
                key = http.headers.get("idempotency-key")
        if not _CALLER.fullmatch(caller):
            caller = "anonymous"
        name, arguments = request.params.name, request.params.arguments
        if face.upstream is not None and name not in face.guards:  # read-only: untouched
            return types.ServerResult(await pass_through(name, arguments))

        def run() -> types.CallToolResult:
            return face.call(name, arguments, key=key, caller=caller, session=session)

        # The guard blocks (it polls the ledger): off the event loop, one thread per call.
        result = await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
        return types.ServerResult(result)

    handlers: dict[type, Callable[[Any], Awaitable[types.ServerResult]]] = server.request_handlers
    handlers[types.ListToolsRequest] = list_tools
    handlers[types.CallToolRequest] = call_tool
    return server


async def serve_stdio(face: McpFace) -> None:
    """Serve ``face`` on this process's stdin and stdout (logs go to stderr)."""
    from mcp.server.stdio import stdio_server

    server = build_server(face)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def http_app(face: McpFace, tokens: Any, *, path: str = "/mcp", max_body: int = 256 * 1024) -> Any:
    """The streamable-HTTP ASGI app of ``face`` at ``path``: every request needs a bearer
    token of ``tokens`` (``workers.api.auth.Tokens``, from ``EFFECTQ_API_TOKENS``) with the
    ``submit`` scope. Refusals are the API's Problem bodies (``{error, message}``)."""
    import contextlib
    from collections.abc import AsyncIterator

    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.types import Receive, Scope, Send

    manager = StreamableHTTPSessionManager(app=build_server(face), max_request_body_size=max_body)
    challenge = {"WWW-Authenticate": 'Bearer realm="effectq"'}

    def problem(status: int, error: str, message: str) -> JSONResponse:
        headers = challenge if status == 401 else None
        return JSONResponse({"error": error, "message": message}, status, headers=headers)

    class Endpoint:
        """The bearer check in front of the SDK's transport (a class: Starlette takes a
        plain function for a request handler, not an ASGI app)."""

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            kind, _, presented = header.partition(" ")
            token = tokens.match(presented.strip()) if kind.lower() == "bearer" else None
            if kind.lower() != "bearer":
                answer = problem(401, "unauthorized", "a bearer token is required")
            elif token is None:
                answer = problem(401, "unauthorized", "unknown token")
            elif not token.allows("submit"):
                answer = problem(403, "forbidden", "this token lacks the 'submit' scope")
            else:
                scope[CALLER_SCOPE_KEY] = token.name
                await manager.handle_request(scope, receive, send)
                return
            await answer(scope, receive, send)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        async with manager.run():
            yield

    def healthz(_request: Any) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return Starlette(
        routes=[Route("/healthz", healthz), Route(path, endpoint=Endpoint())], lifespan=lifespan
    )
