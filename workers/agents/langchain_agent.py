"""LangChain agent middleware: the agent's side-effecting tool calls run through effectq
(``pip install 'effectq[langchain-agent]'``; ``langchain`` 1.x ``AgentMiddleware``).

    agent = create_agent(
        model, tools=[charge_tool, lookup_tool],
        middleware=[EffectGuard(["charge"], identity=lambda request: order_id_of(request))],
        checkpointer=checkpointer,
    )
    agent.invoke({"messages": [...]}, {"configurable": {"thread_id": "order-1042"}})

``wrap_tool_call`` takes each call of a tool listed as side-effecting and submits it to the
declared effect tool of that name (``@effect_tool``; mapped with ``{"agent_name":
"effect_name"}``), whose body an effectq worker runs once per effect; the agent's own tool
gives the model its schema and is never run for such a call. Other tools pass through
untouched.

The scope is the run's durable identity, never the ``tool_call_id`` (a retry or a resumed
run mints a new one): the LangGraph thread (``langgraph:<thread_id>``) and, where
``identity`` names one, a business identity (``langgraph:<thread_id>:<identity>``; the
identity alone without a thread). A thread resumed in another process after a crash finds
the same key, and so the recorded result, not a second call. One thread that means to make
the same call twice (two charges of one customer) needs an ``identity`` telling them apart.

The outcome is the ``ToolMessage`` the model reads: the guard's text, ``status="error"``
for anything but done and pending, and ``artifact`` ``{status, key, receipt, replayed}``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from dedupe import MissingFieldError

from ..guard import Guarded, Outcome, guarded
from ..tool import EffectTool
from ._checks import ERROR_STATUSES, refusal

try:
    from langchain.agents.middleware import AgentMiddleware, ToolCallRequest
    from langchain_core.messages import ToolMessage
    from langgraph.types import Command
except ImportError as exc:  # pragma: no cover - the extra's own message
    raise ImportError(
        "workers.agents.langchain_agent needs LangChain 1.x: pip install 'effectq[langchain-agent]'"
    ) from exc

__all__ = ["EffectGuard", "Identity"]

Identity = Callable[[ToolCallRequest], str | None]
Handler = Callable[[ToolCallRequest], ToolMessage | Command[Any]]
AsyncHandler = Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]]


class EffectGuard(AgentMiddleware):
    """Guards the agent's calls of ``tools`` (names of declared effect tools, or a mapping
    from the agent's tool name to one); ``identity`` gives a call's business identity (from
    the request's state or runtime context), ``timeout`` how long a call waits for its
    receipt before the model reads "still pending"."""

    def __init__(
        self,
        tools: Iterable[str | EffectTool] | Mapping[str, str | EffectTool],
        *,
        identity: Identity | None = None,
        timeout: float = 30.0,
    ) -> None:
        super().__init__()
        pairs = (
            list(tools.items())
            if isinstance(tools, Mapping)
            else [(t if isinstance(t, str) else t.name, t) for t in tools]
        )
        self.guards: dict[str, Guarded] = {
            name: guarded(target, timeout=timeout) for name, target in pairs
        }
        self.identity = identity

    def scope(self, request: ToolCallRequest) -> str:
        """The thread, and the business identity where there is one; never the call id."""
        runtime = request.runtime
        config = (getattr(runtime, "config", None) or {}) if runtime is not None else {}
        thread = (config.get("configurable") or {}).get("thread_id")
        business = self.identity(request) if self.identity is not None else None
        parts = [f"langgraph:{thread}" if thread else None, business or None]
        if not any(parts):
            raise MissingFieldError(
                f"{request.tool_call['name']}: no scope for this call: run the agent with a "
                "thread_id, or give EffectGuard an identity",
                tool=request.tool_call["name"],
            )
        return ":".join(p for p in parts if p)

    def _run(self, guard: Guarded, request: ToolCallRequest) -> ToolMessage:
        call = request.tool_call
        args = call.get("args") or {}
        if refused := refusal(guard, args):
            return _message(call, guard, f"{guard.name} NOT executed: {refused}", None)
        outcome = guard.invoke(args, runtime_scope=self.scope(request))
        return _message(call, guard, str(outcome), outcome)

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Handler
    ) -> ToolMessage | Command[Any]:
        guard = self.guards.get(request.tool_call["name"])
        if guard is None:  # not side-effecting: untouched
            return handler(request)
        return self._run(guard, request)

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: AsyncHandler
    ) -> ToolMessage | Command[Any]:
        guard = self.guards.get(request.tool_call["name"])
        if guard is None:
            return await handler(request)
        # The guard blocks while it waits for the receipt: off the event loop.
        return await asyncio.to_thread(self._run, guard, request)


def _message(
    call: Mapping[str, Any], guard: Guarded, text: str, outcome: Outcome | None
) -> ToolMessage:
    status = outcome.status.value if outcome is not None else "invalid"
    return ToolMessage(
        content=text,
        tool_call_id=call["id"],
        name=guard.name,
        status="error" if status in ERROR_STATUSES else "success",
        artifact={
            "status": status,
            "key": outcome.key if outcome else None,
            "receipt": outcome.receipt if outcome else None,
            "replayed": outcome.replayed if outcome else False,
        },
    )
