"""One LangChain tool call in a process of its own (the environment points it at the
stack): ``python langchain_call.py THREAD_ID ARGS_JSON`` prints the call's outcome."""

from __future__ import annotations

import json
import sys

import workers.examples  # noqa: F401  (declares the tools)
from workers import get_tool
from workers.agents.langchain import structured_tool


def main() -> None:
    thread, args = sys.argv[1], json.loads(sys.argv[2])
    pay = structured_tool(get_tool("charge"), description="Charge the customer.")
    call = {"type": "tool_call", "id": "call_1", "name": "charge", "args": args}
    message = pay.invoke(call, config={"configurable": {"thread_id": thread}})
    outcome = message.artifact
    print(json.dumps({"key": outcome.key, "receipt": outcome.receipt, "text": message.content}))


if __name__ == "__main__":
    main()
