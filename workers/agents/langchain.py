"""LangChain adapter: a guarded effect tool as a ``StructuredTool`` (``pip install
'effectq[langchain]'``).

    pay = structured_tool(charge, description="Charge the customer for the order.")
    pay.invoke(args, config={"configurable": {"thread_id": "order-1042"}})

The model sees the tool's name, description and argument schema; each call goes through
``workers.guard``. Unless ``scope=`` or ``effect_scope(...)`` names the request, the scope is
the LangGraph thread and node the call runs in (``langgraph:<thread_id>[:<node>]``, from the
call's ``RunnableConfig``): a thread resumed in another process after a crash, or a node
re-run, finds the same key. Arguments the schema does not declare (``scope`` among them) are
refused with a message the model reads, and nothing is submitted.
"""

from __future__ import annotations

from typing import Any, Unpack

from pydantic import ValidationError

from ..guard import Guarded, GuardOptions, Outcome, guarded
from ..tool import EffectTool

try:
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import StructuredTool
except ImportError as exc:
    raise ImportError(
        "workers.agents.langchain needs LangChain: pip install 'effectq[langchain]'"
    ) from exc

__all__ = ["structured_tool", "thread_scope"]


def thread_scope(config: RunnableConfig) -> str | None:
    """The LangGraph thread (and node, inside a graph) of a call, or None without a thread."""
    thread = (config.get("configurable") or {}).get("thread_id")
    if not thread:
        return None
    node = (config.get("metadata") or {}).get("langgraph_node")
    return f"langgraph:{thread}:{node}" if node else f"langgraph:{thread}"


def _refusal(guard: Guarded) -> Any:
    def refuse(error: ValidationError) -> str:
        # Field names and pydantic's reasons only: never echo the values back.
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}"
            for e in error.errors(include_url=False, include_input=False)
        )
        return f"{guard.name} NOT executed: invalid arguments ({problems})."

    return refuse


def structured_tool(tool: str | EffectTool, **options: Unpack[GuardOptions]) -> StructuredTool:
    """A ``StructuredTool`` whose calls go through effectq (options: ``guarded``'s). The
    model reads the ``Outcome`` text; the ``ToolMessage`` carries the ``Outcome`` itself as
    its artifact (status, key, receipt)."""
    guard = guarded(tool, **options)

    def run(config: RunnableConfig, **kwargs: Any) -> tuple[str, Outcome]:
        outcome = guard.invoke(kwargs, runtime_scope=thread_scope(config))
        return str(outcome), outcome

    return StructuredTool.from_function(
        func=run,
        name=guard.name,
        description=guard.description,
        args_schema=guard.args_schema,
        response_format="content_and_artifact",
        handle_validation_error=_refusal(guard),
    )
