"""An MCP client (the ``mcp`` SDK) in a process of its own, as an agent host is:
``python mcp_client.py < PLAN_JSON`` runs the plan's calls and prints one JSON line per
attempt (the client-side transcript).

The plan: ``{"http": {"url", "token"}}`` or ``{"stdio": {"argv", "env"}}``, ``list``
(print the listed tools first), and ``calls``:
``[{"tool", "args", "key"?, "key_in"?: "params" | "meta" | "header", "until"?: STATUS}]``.
Calls share one session, except a call with ``until`` (or its key in a header): each of its
attempts opens a new connection and session (a new request id, as a host's retry after a
reconnect makes), again after a transport error too — while the server is down — until its
answer's status is ``until``, for at most ``deadline`` s.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import AsyncExitStack
from datetime import timedelta
from typing import Any

import anyio
import httpx
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client


async def _session(plan: dict[str, Any], stack: AsyncExitStack, key: str | None) -> ClientSession:
    if "http" in plan:
        headers = {"Authorization": f"Bearer {plan['http']['token']}"}
        if key is not None:
            headers["Idempotency-Key"] = key
        client = await stack.enter_async_context(
            httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=60))
        )
        read, write, _ = await stack.enter_async_context(
            streamable_http_client(plan["http"]["url"], http_client=client)
        )
    else:
        server = StdioServerParameters(
            command=sys.executable, args=plan["stdio"]["argv"], env=plan["stdio"]["env"]
        )
        read, write = await stack.enter_async_context(stdio_client(server))
    # A request whose server died is answered by this timeout at worst.
    timeout = timedelta(seconds=plan.get("read_timeout", 30))
    session = await stack.enter_async_context(ClientSession(read, write, timeout))
    await session.initialize()
    return session


async def _call(session: ClientSession, call: dict[str, Any]) -> dict[str, Any]:
    key, where = call.get("key"), call.get("key_in", "params")
    if key is not None and where == "params":  # SEP-3182: a field of tools/call's params
        params = types.CallToolRequestParams(
            name=call["tool"], arguments=call["args"], idempotencyKey=key
        )
        request = types.ClientRequest(types.CallToolRequest(params=params))
        result = await session.send_request(request, types.CallToolResult)
    else:
        meta = {"idempotencyKey": key} if key is not None and where == "meta" else None
        result = await session.call_tool(call["tool"], call["args"], meta=meta)
    return {
        "text": "".join(c.text for c in result.content if isinstance(c, types.TextContent)),
        "is_error": result.isError,
        **(result.structuredContent or {}),
    }


async def _attempt(plan: dict[str, Any], call: dict[str, Any]) -> dict[str, Any]:
    """One call on a connection of its own."""
    header = call.get("key") if call.get("key_in") == "header" else None
    async with AsyncExitStack() as stack:
        return await _call(await _session(plan, stack, header), call)


async def main(plan: dict[str, Any]) -> None:
    deadline = time.monotonic() + plan.get("deadline", 60)
    async with AsyncExitStack() as stack:
        shared = await _session(plan, stack, None)
        if plan.get("list"):
            listed = await shared.list_tools()
            tools = [t.model_dump(mode="json", exclude_none=True) for t in listed.tools]
            print(json.dumps({"tools": tools}, sort_keys=True), flush=True)
        for n, call in enumerate(plan["calls"]):
            if "until" not in call and call.get("key_in") != "header":
                answer = await _call(shared, call)
                print(json.dumps({"call": n, "attempt": 1, **answer}, sort_keys=True), flush=True)
                continue
            attempt = 0
            while True:
                attempt += 1
                try:
                    answer = await _attempt(plan, call)
                except Exception as exc:  # the server is down: reconnect, call again
                    answer = {"error": type(exc).__name__}
                line = {"call": n, "attempt": attempt, **answer}
                print(json.dumps(line, sort_keys=True), flush=True)
                if answer.get("status") == call.get("until") or time.monotonic() > deadline:
                    break
                await anyio.sleep(0.3)


if __name__ == "__main__":
    anyio.run(main, json.loads(sys.stdin.read()))
