"""Durable resume: what a runtime that checkpoints its conversation does with a tool call
whose result never reached its checkpoint (docs/agents.md, "Durable resume").

The runtime's execution id for a side-effecting call is the effect's key, derived from the
runtime's durable identity (scope) and the call's arguments — never the model's
``tool_call_id`` and never a counter of attempts. On resume it asks effectq before anything
else (``recover``):

    DONE                        → "reconstructed": the recorded receipt, no call made
    UNKNOWN                     → "recovery_required": surfaced for an operator, never replayed
    REVOKED / SUPERSEDED        → "recovery_required": voided by an operator; a new
                                  generation is theirs to decide, not a resume's
    FAILED, no message left     → "failed": known not executed; nothing runs it by itself
    another fingerprint         → "conflict": the same request with other values; not sent
    no record, or in progress   → submitted through the guard (deduplicated: a message still
                                  queued or running is waited for, not sent again), then
                                  "executed" or "awaited" once DONE, "in_progress" if not DONE
                                  in time, "recovery_required" if it became UNKNOWN

Framework-free: the core install has it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from dedupe import NotFoundError, State

from .. import verbs
from ..guard import OutcomeStatus, guarded
from ..tool import EffectTool, get_tool

__all__ = ["Decision", "Recovery", "recover"]

Decision = Literal[
    "reconstructed",
    "executed",
    "awaited",
    "in_progress",
    "recovery_required",
    "failed",
    "conflict",
]


@dataclass(frozen=True)
class Recovery:
    """What ``recover`` decided for one call: the ``execution_id`` (the effect key) the
    runtime records, the receipt where the effect is DONE, and the words of the decision."""

    decision: Decision
    execution_id: str
    receipt: dict[str, Any] | None
    message: str


def recover(
    tool: str | EffectTool,
    *,
    scope: str,
    args: Mapping[str, Any],
    action: str | None = None,
    timeout: float = 30.0,
) -> Recovery:
    """Resume one side-effecting call of ``tool`` under the runtime's ``scope``."""
    target = get_tool(tool) if isinstance(tool, str) else tool
    effect = target.derive(scope, args, action)
    key = effect.key
    ops = verbs.operator(target.runtime)
    try:
        record = verbs.inspect(ops, key)
    except NotFoundError:
        record = None
    if record is not None:
        if record.fingerprint != effect.fingerprint and record.state is not State.FAILED:
            return Recovery("conflict", key, None, "recorded with other values; not sent")
        if record.state is State.DONE:
            return Recovery("reconstructed", key, record.receipt, "done before; not called")
        if record.state is State.UNKNOWN:
            return Recovery("recovery_required", key, None, f"outcome unknown: {record.reason}")
        if record.state in (State.REVOKED, State.SUPERSEDED):
            voided = f"voided by an operator ({record.state.value})"
            return Recovery("recovery_required", key, None, voided)
    outcome = guarded(target, action=action, timeout=timeout).invoke(args, runtime_scope=scope)
    decisions: dict[OutcomeStatus, Decision] = {
        OutcomeStatus.DONE: "awaited" if outcome.replayed else "executed",
        OutcomeStatus.PENDING: "in_progress",
        OutcomeStatus.UNKNOWN: "recovery_required",
        OutcomeStatus.FAILED: "failed",
        OutcomeStatus.CONFLICT: "conflict",
        OutcomeStatus.INVALID: "failed",
    }
    return Recovery(decisions[outcome.status], key, outcome.receipt, outcome.message)
