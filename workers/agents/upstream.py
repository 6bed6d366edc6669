"""Proxy mode of ``effectq mcp``: an existing MCP server (the upstream) behind effectq.

A config file (JSON) names the upstream and marks its side-effecting tools:

    {
      "upstream": {"url": "http://127.0.0.1:9000/mcp", "headers": {"Authorization": "..."}},
      "tools": {
        "create_ticket": {
          "identity": ["project", "title"], "bound": ["project", "title", "priority"],
          "free": ["body"], "key_argument": "request_id", "lease_s": 30
        }
      }
    }

(``"upstream": {"command": ["python", "server.py"]}`` for a stdio upstream.) Each marked tool
is declared as an effect tool of that name (``@effect_tool``) whose body, run by an effectq
worker, calls the upstream tool once under a fenced claim; with ``key_argument`` the upstream
also receives effectq's idempotency key in that argument (which the model never sees nor
sets). Every other upstream tool is read-only to effectq and passes through untouched.

There is no lookup for an upstream tool: an outcome the worker could not establish (it died
mid-call, the connection broke after sending) is UNKNOWN at once, for an operator — never
replayed. An upstream that answers ``isError`` rejected the call (FAILED, not executed).

Workers load these tools with ``EFFECTQ_TOOLS=workers.agents.upstream`` and
``EFFECTQ_MCP_UPSTREAM=<config file>``, as ``effectq mcp --upstream <config file>`` does.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from dedupe import MessageError, NotExecutedError, RejectedError
from dedupe.spec import TOOL_NAME

from ..tool import EffectCall, EffectTool, ToolResult, effect_tool

try:
    import anyio
    import httpx
    import mcp.types as types
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client
except ImportError as exc:  # pragma: no cover - the extra's own message
    raise ImportError(
        "workers.agents.upstream needs the MCP SDK: pip install 'effectq[mcp]'"
    ) from exc

__all__ = ["ENV", "UpstreamConfig", "connect", "declare", "load_config"]

ENV = "EFFECTQ_MCP_UPSTREAM"
# An argument's name; a tool's is a declaration's (``dedupe.spec.TOOL_NAME``).
_Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")]
_ToolName = Annotated[str, StringConstraints(pattern=f"^{TOOL_NAME.pattern}$")]


class Upstream(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    command: list[str] | None = None
    env: dict[str, str] | None = None

    @model_validator(mode="after")
    def _one(self) -> Upstream:
        if (self.url is None) == (self.command is None):
            raise ValueError("give the upstream's url or its command, not both")
        return self


class GuardedTool(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    identity: tuple[_Name, ...]
    bound: tuple[_Name, ...] = ()
    free: tuple[_Name, ...] = ()
    key_argument: _Name | None = None
    lease_s: float = Field(default=30.0, gt=0)
    provider_window_s: float = Field(default=86400.0, gt=0)
    timeout_s: float = Field(default=20.0, gt=0)


class UpstreamConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    upstream: Upstream
    tools: dict[_ToolName, GuardedTool]


def load_config(path: str | Path) -> UpstreamConfig:
    """The config file; a MessageError naming what is wrong (never a value) otherwise."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise MessageError(f"cannot read the upstream config ({type(exc).__name__})") from None
    try:
        return UpstreamConfig.model_validate_json(text)
    except ValueError as exc:
        errors = getattr(exc, "errors", None)
        first = errors(include_input=False, include_url=False)[0] if callable(errors) else None
        where = ".".join(map(str, first["loc"])) if first else "file"
        reason = first["msg"] if first else "not JSON"
        raise MessageError(f"upstream config: {where}: {reason}") from None


@asynccontextmanager
async def connect(upstream: Upstream) -> AsyncIterator[ClientSession]:
    """An initialized session with the upstream (a new connection each time)."""
    async with AsyncExitStack() as stack:
        if upstream.url is not None:
            client = await stack.enter_async_context(
                httpx.AsyncClient(headers=upstream.headers, timeout=httpx.Timeout(30, read=300))
            )
            read, write, _ = await stack.enter_async_context(
                streamable_http_client(upstream.url, http_client=client)
            )
        else:
            assert upstream.command is not None
            server = StdioServerParameters(
                command=upstream.command[0], args=upstream.command[1:], env=upstream.env
            )
            read, write = await stack.enter_async_context(stdio_client(server))
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        yield session


async def _call(upstream: Upstream, name: str, args: dict[str, Any]) -> types.CallToolResult:
    sent = False
    try:
        async with connect(upstream) as session:
            sent = True
            return await session.call_tool(name, args)
    except Exception as exc:
        if not sent:  # never reached the tool: not executed, the message is retried
            raise NotExecutedError(f"upstream unreachable ({type(exc).__name__})") from None
        raise  # sent, no answer: uncertain (the reconciler's, then an operator's)


def _body(upstream: Upstream, name: str, spec: GuardedTool) -> Any:
    def call_upstream(call: EffectCall, **args: Any) -> ToolResult:
        if spec.key_argument is not None:
            args[spec.key_argument] = call.idempotency_key
        result = anyio.run(_call, upstream, name, args)
        if result.isError:
            raise RejectedError(f"the upstream tool {name} answered an error", key=call.key)
        receipt = result.model_dump(mode="json", exclude_none=True, by_alias=True)
        return ToolResult(receipt=receipt, raw=json.dumps(receipt, sort_keys=True))

    # The declared fields as the body's parameters: the guard's argument schema reads them.
    fields = [*spec.identity, *(f for f in (*spec.bound, *spec.free) if f not in spec.identity)]
    required = set(spec.identity) | set(spec.bound)
    parameters = [inspect.Parameter("call", inspect.Parameter.POSITIONAL_OR_KEYWORD)] + [
        inspect.Parameter(
            f,
            inspect.Parameter.KEYWORD_ONLY,
            default=inspect.Parameter.empty if f in required else None,
        )
        for f in dict.fromkeys(fields)
    ]
    call_upstream.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    call_upstream.__name__ = name
    return call_upstream


def declare(config: UpstreamConfig) -> list[EffectTool]:
    """Declare each side-effecting upstream tool as an effect tool of the same name."""
    declared = []
    for name, spec in config.tools.items():
        if spec.key_argument is not None and spec.key_argument in (
            *spec.identity,
            *spec.bound,
            *spec.free,
        ):
            raise MessageError(f"upstream config: tools.{name}: key_argument is a declared field")
        declared.append(
            effect_tool(
                name=name,
                identity=spec.identity,
                bound=spec.bound,
                free=spec.free,
                lease_s=spec.lease_s,
                provider_window_s=spec.provider_window_s,
            )(_body(config.upstream, name, spec))
        )
    return declared


# Imported as EFFECTQ_TOOLS by a worker (or the proxy itself): the config names the tools.
CONFIG = load_config(os.environ[ENV]) if os.environ.get(ENV) else None
if CONFIG is not None:
    declare(CONFIG)
