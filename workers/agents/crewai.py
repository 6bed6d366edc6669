"""CrewAI adapter: a guarded effect tool as a CrewAI ``BaseTool`` (``pip install
'effectq[crewai]'``).

    pay = guarded_tool(charge, description="Charge the customer for the order.")
    Agent(role=..., tools=[pay], max_retry_limit=2)

The model sees the tool's name, description and argument schema; each call goes through
``workers.guard``. Unless ``scope=`` or ``effect_scope(...)`` names the request, the scope is
the running CrewAI task (``crewai-task:<id>``, from CrewAI's own context variable): one Task
keeps its id through CrewAI's ``max_retry_limit`` retries, so a retried task gets the
original receipt. A Task rebuilt in another process has a new id: give a business scope
(the order id) for a redispatch after a crash to find the same key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Unpack, overload

from pydantic import Field

from ..guard import Guarded, GuardOptions, Outcome, OutcomeStatus, guarded
from ..tool import EffectTool

try:
    from crewai.context import get_current_task_id
    from crewai.tools import BaseTool
except ImportError as exc:
    raise ImportError("workers.agents.crewai needs CrewAI: pip install 'effectq[crewai]'") from exc

__all__ = ["GuardedTool", "guarded_tool", "task_scope"]


def task_scope() -> str | None:
    """The running CrewAI task as a scope, or None outside a task."""
    task_id = get_current_task_id()
    return f"crewai-task:{task_id}" if task_id else None


def _cache_done_only(_args: Any = None, result: Any = None) -> bool:
    # A crew with cache=True must not replay a "still pending" answer forever.
    return isinstance(result, Outcome) and result.status is OutcomeStatus.DONE


class GuardedTool(BaseTool):
    """A CrewAI tool whose calls go through a ``Guarded``; build it with ``guarded_tool``."""

    # Not part of the tool's serialized form: it holds the Dramatiq actor and its broker.
    guard: Guarded = Field(exclude=True)
    cache_function: Callable[..., bool] = _cache_done_only

    def _run(self, **kwargs: Any) -> Outcome:
        return self.guard.invoke(kwargs, runtime_scope=task_scope())


def _tool_of(guard: Guarded) -> GuardedTool:
    return GuardedTool(
        name=guard.name,
        description=guard.description,
        args_schema=guard.args_schema,
        guard=guard,
    )


@overload
def guarded_tool(tool: str | EffectTool, /, **options: Unpack[GuardOptions]) -> GuardedTool: ...


@overload
def guarded_tool(**options: Unpack[GuardOptions]) -> Callable[[EffectTool], GuardedTool]: ...


def guarded_tool(
    tool: str | EffectTool | None = None, /, **options: Unpack[GuardOptions]
) -> GuardedTool | Callable[[EffectTool], GuardedTool]:
    """Like CrewAI's ``@tool``: ``guarded_tool(charge, description=...)``, or a decorator
    stacked on ``@effect_tool`` (``@guarded_tool`` or ``@guarded_tool(scope=...)``); the
    name then holds the CrewAI tool, and the worker still runs the declared body. The
    options are ``workers.guard.guarded``'s."""
    if tool is not None:
        return _tool_of(guarded(tool, **options))
    return lambda target: _tool_of(guarded(target, **options))
