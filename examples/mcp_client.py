"""An MCP client (the official ``mcp`` SDK) calling ``effectq mcp``'s guarded ``charge``, offline.

The whole pipeline runs on this machine (an embedded Redis, the sandbox provider with its
own idempotency off, a worker pool). The client starts ``effectq mcp --session
billing-desk-7 --tool charge`` over stdio, as the README's client config does, and calls
``charge`` twice with the same arguments, as a model that retries does: a new request id,
no idempotency key. The call's scope is the session, never the request id or the
arguments: the provider executes the charge once and the second call reads the original
receipt. No network, no API key:

    pip install -e '.[mcp]' && python examples/mcp_client.py
"""

from __future__ import annotations

import sys

import anyio
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

from workers.dev.local import LocalStack
from workers.dev.sandbox import SandboxConfig

ORDER = {"customer": "cus_7", "amount": "10.50", "currency": "usd"}


async def call_twice(env: dict[str, str]) -> None:
    # `effectq mcp`, run as this interpreter's `python -m workers` (the same CLI).
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "workers", "mcp", "--session", "billing-desk-7", "--tool", "charge"],
        env=env,
    )
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for attempt in (1, 2):
            result = await session.call_tool("charge", ORDER)
            text = "".join(c.text for c in result.content if isinstance(c, types.TextContent))
            print(f"call {attempt} answered (isError={result.isError}): {text}")


def main() -> int:
    with LocalStack(sandbox=SandboxConfig(provider_idempotency=False)) as stack:
        stack.start_workers(1, 2)
        # The server's own INFO lines (one per request) would bury the answers.
        anyio.run(call_twice, stack.env(EFFECTQ_LOG_LEVEL="WARNING"))
        executions = stack.stats()["total"]
        print(f"provider executions: {executions}")
        return 0 if executions == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
