"""A CrewAI agent with a guarded payment tool, offline.

The whole pipeline runs on this machine (an embedded Redis, the sandbox provider with its
own idempotency off, a worker pool) and the model is scripted: it charges the customer,
its next call fails, CrewAI's own retry (``max_retry_limit``) runs the task again and the
model charges again. The provider executes the charge once; the retry gets the original
receipt. No network, no API key:

    pip install -e '.[crewai]' && python examples/crewai_payment.py
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

# CrewAI's telemetry, tracing and version check, off before CrewAI is imported.
for name, value in {
    "CREWAI_DISABLE_TELEMETRY": "true",
    "OTEL_SDK_DISABLED": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "CREWAI_DISABLE_VERSION_CHECK": "true",
}.items():
    os.environ.setdefault(name, value)

from crewai import Agent, BaseLLM, Crew, Task  # noqa: E402

from workers.dev.local import LocalStack  # noqa: E402
from workers.dev.sandbox import SandboxConfig  # noqa: E402

ORDER = {"customer": "cus_7", "amount": "10.50", "currency": "usd"}


def _charge_call(call_id: str) -> list[dict[str, Any]]:
    function = {"name": "charge", "arguments": json.dumps(ORDER)}
    return [{"id": call_id, "type": "function", "function": function}]


class ScriptedLLM(BaseLLM):
    """Answers each call from a script (tool calls, a final answer, or an error to raise)
    and prints what the tools answered."""

    script: list[Any]

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(messages, list) and messages and messages[-1].get("role") == "tool":
            print(f"tool answered: {messages[-1]['content']}")
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            print(f"model call fails: {step}  -> CrewAI retries the task")
            raise step
        return step

    def supports_function_calling(self) -> bool:
        return True

    def get_input_tokens_count(self, *args: Any, **kwargs: Any) -> int:
        # A script spends no tokens (CrewAI's fallback estimate logs a warning per call).
        return 0


def main() -> int:
    with LocalStack(sandbox=SandboxConfig(provider_idempotency=False)) as stack:
        stack.apply_env()
        from workers import examples
        from workers.agents.crewai import guarded_tool
        from workers.guard import effect_scope

        stack.start_workers(1, 2)
        pay = guarded_tool(examples.charge, description="Charge the customer for the order.")
        llm = ScriptedLLM(
            model="scripted",
            script=[
                _charge_call("call_1"),
                RuntimeError("model provider dropped the connection"),
                _charge_call("call_2"),
                "Order 1042 is paid.",
            ],
        )
        agent = Agent(
            role="billing clerk",
            goal="Charge each order exactly once",
            backstory="You run the till.",
            llm=llm,
            tools=[pay],
            max_retry_limit=1,
        )
        task = Task(
            description="Charge customer cus_7 10.50 USD for order 1042.",
            expected_output="The receipt id.",
            agent=agent,
        )
        # The application names the request: every guarded call in this kickoff is keyed
        # on order-1042, whatever the model writes and however often CrewAI retries.
        with effect_scope("order-1042"):
            result = Crew(agents=[agent], tasks=[task]).kickoff()
        executions = stack.stats()["total"]
        print(f"agent answered: {result.raw}")
        print(f"provider executions: {executions}")
        return 0 if executions == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
