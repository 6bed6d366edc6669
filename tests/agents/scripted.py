"""A CrewAI model that plays a script instead of calling a provider (no network).

Each step is what one LLM call answers: a list of tool calls (native function calling), a
string (the final answer), or an exception to raise. Every request is recorded, so a test
can read what the tools answered the model.
"""

from __future__ import annotations

import json
from typing import Any

from crewai import BaseLLM
from pydantic import Field


def tool_call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    """One OpenAI-style tool_use block."""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


class ScriptedLLM(BaseLLM):
    script: list[Any] = Field(default_factory=list)
    requests: list[list[dict[str, Any]]] = Field(default_factory=list)
    tools_seen: list[Any] = Field(default_factory=list)

    def call(
        self,
        messages: Any,
        tools: Any = None,
        callbacks: Any = None,
        available_functions: Any = None,
        from_task: Any = None,
        from_agent: Any = None,
        response_model: Any = None,
    ) -> Any:
        self.requests.append([dict(m) for m in messages])
        self.tools_seen.append(tools)
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        return step

    def supports_function_calling(self) -> bool:
        return True

    def get_input_tokens_count(self, *args: Any, **kwargs: Any) -> int:
        # A script spends no tokens (CrewAI's fallback estimate logs a warning per call).
        return 0

    def tool_results(self) -> dict[str, str]:
        """What each tool call answered the model, by tool-call id, over every attempt."""
        return {
            m["tool_call_id"]: m["content"]
            for request in self.requests
            for m in request
            if m.get("role") == "tool"
        }
