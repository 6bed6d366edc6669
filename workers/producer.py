"""The producer API: ``submit`` one tool call; the handle tells its status and waits.

Submission is deduplicated before the broker: the ledger answers first (one round trip),
and only a call with no DONE effect and no live pending message is enqueued. The pending
marker is a short reservation until the broker accepted the message, then lasts
``pending_ttl_s``: nothing looks pending for long that no message will ever run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from dedupe import (
    ConflictError,
    Effect,
    EffectRecord,
    Ledger,
    LedgerUnavailableError,
    State,
    SubmitStatus,
    WaitTimeout,
)
from dedupe.failpoints import failpoint
from dedupe.ledger import Confirming

from . import tracing
from .broker.redis import EffectqRedisBroker
from .runtime import Runtime, current
from .tool import EffectTool, get_tool
from .tool.envelope import SUBMITTED_MS, Envelope

__all__ = [
    "Handle",
    "Status",
    "WaitTimeout",
    "confirm_pending",
    "finish_confirm",
    "poll_record",
    "start_confirm",
    "submit",
]

log = logging.getLogger(__name__)
T = TypeVar("T")


class Status(StrEnum):
    ENQUEUED = "enqueued"
    PENDING = "pending"
    DONE = "done"
    CONFLICT = "conflict"
    BLOCKED = "blocked"


def poll_record(
    ledger: Ledger,
    key: str,
    timeout: float,
    verdict: Callable[[EffectRecord | None], T | None],
) -> tuple[T | None, EffectRecord | None]:
    """Read ``key``'s record, backing off from 10 ms to 250 ms, until ``verdict`` of it is
    not None or ``timeout`` seconds passed: (the verdict or None, the last record read)."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        record = ledger.get(key)
        found = verdict(record)
        if found is not None:
            return found, record
        if time.monotonic() + delay > deadline:
            return None, record
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)


@dataclass
class Handle:
    """A submitted call. ``receipt`` is set once the effect is DONE."""

    tool: str
    key: str
    status: Status
    message_id: str | None = None
    receipt: dict[str, Any] | None = None
    state: str | None = None
    runtime: Runtime | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "status": self.status.value, "tool": self.tool}
        if self.state:
            out["state"] = self.state
        if self.message_id:
            out["message_id"] = self.message_id
        if self.receipt is not None:
            out["receipt"] = self.receipt
        return out

    def _ledger(self) -> Ledger:
        return (self.runtime or current()).ledger()

    def record(self) -> EffectRecord | None:
        return self._ledger().get(self.key)

    def wait(self, timeout: float = 30.0) -> dict[str, Any]:
        """Block until the effect is DONE and return its receipt.

        Raises ConflictError for a refused submission, WaitTimeout (with the state) when
        the effect is not DONE in time — an UNKNOWN effect waits for an operator.
        """
        if self.status is Status.CONFLICT:
            raise ConflictError("bound fields differ from the recorded effect", key=self.key)
        if self.receipt is not None:
            return self.receipt

        def receipt(record: EffectRecord | None) -> dict[str, Any] | None:
            return record.receipt if record is not None and record.state is State.DONE else None

        found, record = poll_record(self._ledger(), self.key, timeout, receipt)
        if found is None:
            state = record.state.value if record else "ABSENT"
            raise WaitTimeout(
                f"effect not DONE after {timeout}s (state {state})", key=self.key, state=state
            )
        self.status, self.state, self.receipt = Status.DONE, "DONE", found
        return found


def confirm_pending(ledger: Ledger, sent: list[tuple[Effect, str]], pending_s: float) -> None:
    """The broker holds these (effect, message id) messages: confirm their reservations. If
    the ledger cannot be reached now, the reservations lapse within seconds and the messages
    still run; a later submission may send a second message, which the claim makes a
    duplicate."""
    finish_confirm(start_confirm(ledger, sent, pending_s), len(sent))


def start_confirm(
    ledger: Ledger, sent: list[tuple[Effect, str]], pending_s: float
) -> Confirming | None:
    """``confirm_pending`` started (``Ledger.start_confirm``); ``finish_confirm`` ends it.
    None when the ledger could not be reached (logged, as ``confirm_pending``)."""
    try:
        return ledger.start_confirm(sent, pending_s)
    except LedgerUnavailableError as exc:
        _not_confirmed(len(sent), exc)
        return None


def finish_confirm(confirming: Confirming | None, count: int) -> None:
    if confirming is None:
        return
    try:
        confirming.wait()
    except LedgerUnavailableError as exc:
        _not_confirmed(count, exc)


def _not_confirmed(count: int, exc: LedgerUnavailableError) -> None:
    log.warning("pending markers of %d enqueued messages not confirmed: %s", count, exc)


def _forgotten(target: EffectTool, message_id: str) -> bool:
    """The broker answers that it no longer holds ``message_id`` (only a Redis broker can
    be asked; on RabbitMQ the confirmed marker is short and a worker keeps it alive while
    the message is retried: ``Settings.unverifiable_pending_ttl_s``)."""
    broker = target.actor.broker
    if not isinstance(broker, EffectqRedisBroker):
        return False
    return not broker.holds(target.actor.queue_name, message_id)


def submit(tool: str | EffectTool, *, scope: str, action: str | None = None, **args: Any) -> Handle:
    """Submit one call of ``tool`` for ``scope`` through the runtime ``tool`` is bound to
    (the current one if it is not bound yet). Bad arguments raise an IdentityError."""
    target = get_tool(tool) if isinstance(tool, str) else tool
    effect = target.derive(scope, args, action)
    with tracing.span("submit", tool=target.name, key=effect.key, producer=True):
        return _submit(target, effect)


def _submit(target: EffectTool, effect: Effect) -> Handle:
    message = target.actor.message(Envelope.of(effect).model_dump())
    carried = tracing.traceparent()
    if carried is not None:  # the worker's spans continue this trace (workers.tracing)
        message = message.copy(options={**message.options, tracing.TRACEPARENT: carried})
    rt = target.runtime
    ledger = rt.ledger()
    cfg = rt.settings
    # The marker is a reservation until the broker holds the message (see confirm_pending).
    answer = ledger.submit(
        effect, message_id=message.message_id, pending_s=cfg.pending_reservation_s
    )
    if answer.message_id and _forgotten(target, answer.message_id):
        # The marker stands for a message the broker no longer holds: nothing would ever
        # run the effect. Send it now; should the old message exist after all, the claim
        # makes the second one a duplicate.
        log.warning(
            "pending message %s of %s is not in the broker (lost): sending it again",
            answer.message_id, effect.key[:12],
        )  # fmt: skip
        answer = ledger.submit(
            effect, message_id=message.message_id, pending_s=cfg.pending_reservation_s,
            force=True,
        )  # fmt: skip
    if answer.status is SubmitStatus.ENQUEUE:
        # Same message id (the marker names it); it carries the ledger's time of this
        # submission (its age is judged on that clock) and the generation it is for.
        changes: dict[str, Any] = {
            "options": {**message.options, SUBMITTED_MS: answer.submitted_ms}
        }
        if answer.generation:
            changes["args"] = (Envelope.of(effect, generation=answer.generation).model_dump(),)
        message = message.copy(**changes)
        failpoint("after_submit_mark")
        try:
            target.actor.broker.enqueue(message)
        except BaseException:
            ledger.clear_pending(effect.key)
            raise
        confirm_pending(ledger, [(effect, message.message_id)], target.marker_ttl_s)
        return Handle(
            target.name, effect.key, Status.ENQUEUED, message_id=message.message_id, runtime=rt
        )
    status = {
        SubmitStatus.DONE: Status.DONE,
        SubmitStatus.CONFLICT: Status.CONFLICT,
        SubmitStatus.PENDING: Status.PENDING,
        SubmitStatus.BLOCKED: Status.BLOCKED,
    }[answer.status]
    return Handle(
        target.name, effect.key, status, receipt=answer.receipt, state=answer.state, runtime=rt
    )
