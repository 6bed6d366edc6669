"""Operator actions: inspect, list, resolve, revoke, supersede, replay.

Every action names an actor and a reason, is appended to the ledger's audit stream (refusals
too), and is refused — with a specific message — where it would hide an unreconciled
effect. The transitions themselves are the ledger's (``operate`` in ``ledger.lua``); this
module adds the evidence rules and the audit trail.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

from dedupe import (
    EffectRecord,
    Ledger,
    NotFoundError,
    OperatorError,
    State,
    ToolSpec,
    TransitionRefusedError,
    Write,
)
from dedupe.identity import check_key
from dedupe.spec import DEFAULT_RETENTION_S
from dedupe.states import CLAIMABLE

__all__ = ["Operator"]

log = logging.getLogger(__name__)

MAX_TEXT = 200
# A log line shows this much of an operator's reason (free text: it may quote anything);
# the audit stream keeps it whole.
LOGGED_REASON = 80
_KEYS = re.compile(r"[0-9a-f]{64}")


class Operator:
    def __init__(self, ledger: Ledger, specs: Mapping[str, ToolSpec] | None = None) -> None:
        self.ledger = ledger
        self.specs = dict(specs or {})

    # -- reads ------------------------------------------------------------------------

    def inspect(self, key: str) -> EffectRecord:
        # Every action reads the record first: a malformed key is refused here, by name.
        record = self.ledger.get(check_key(key))
        if record is None:
            raise NotFoundError(f"no effect with key {key}", key=key)
        return record

    def list(
        self, *, state: State | None = None, tool: str | None = None, limit: int = 100
    ) -> list[EffectRecord]:
        """Records in ``state`` (UNKNOWN: the work queue), optionally of one tool."""
        states = [state] if state else [State.UNKNOWN, State.RECONCILING, State.CLAIMED]
        keys = [k for s in states for k in self.ledger.keys_in(s, limit=limit)]
        records = [r for r in self.ledger.get_many(keys).values() if r is not None]
        return [r for r in records if tool is None or r.tool == tool][:limit]

    # -- actions ----------------------------------------------------------------------

    def resolve(
        self,
        key: str,
        *,
        executed: bool,
        actor: str,
        reason: str,
        receipt: Mapping[str, Any] | None = None,
        override_evidence: bool = False,
    ) -> Write:
        """Settle an UNKNOWN effect with the operator's evidence. ``--not-executed`` is
        refused while the record holds late receipts (evidence that it happened) unless
        ``override_evidence``: the ledger checks that in the same atomic call as the write,
        so a receipt landing meanwhile is never overridden unseen."""
        action = "resolve_done" if executed else "resolve_failed"

        def check(record: EffectRecord) -> None:
            if executed and receipt is None:
                raise OperatorError("resolve --executed needs the receipt as evidence", key=key)

        return self._act(
            key, action, actor, reason, check=check, receipt=receipt,
            override_evidence=override_evidence,
        )  # fmt: skip

    def revoke(self, key: str, *, actor: str, reason: str) -> Write:
        """Void a DONE effect (history is kept). A submission or replay made after it opens
        generation n+1; a message queued before it is a duplicate and never runs."""
        return self._act(key, "revoke", actor, reason)

    def supersede(self, key: str, *, actor: str, reason: str) -> Write:
        """Replace a DONE effect (history is kept); generations as for ``revoke``."""
        return self._act(key, "supersede", actor, reason)

    def replay(
        self, key: str, *, actor: str, reason: str, enqueue: Callable[[EffectRecord], str]
    ) -> str:
        """Send the stored request again, only where a claim would be granted; ``enqueue``
        submits it (the workers' producer) and returns its submit status. Going through
        submit makes it a submission after the revoke: its message opens generation n+1."""
        _check_words(actor, reason)
        record = self.inspect(key)
        if record.state not in CLAIMABLE or record.request is None:
            message = (
                f"replay refused: effect is {record.state.value}; only FAILED, REVOKED or "
                "SUPERSEDED effects with a stored request can be replayed"
            )
            self._audit("replay", key, actor, reason, f"refused: {message}")
            raise TransitionRefusedError(message, key=key, state=record.state.value)
        try:
            status = enqueue(record)
        except OperatorError as exc:
            self._audit("replay", key, actor, reason, f"refused: {exc.message}")
            raise
        self._audit("replay", key, actor, reason, status)
        return status

    # -- plumbing ---------------------------------------------------------------------

    def _act(
        self,
        key: str,
        action: str,
        actor: str,
        reason: str,
        *,
        check: Callable[[EffectRecord], None] | None = None,
        receipt: Mapping[str, Any] | None = None,
        override_evidence: bool = False,
    ) -> Write:
        _check_words(actor, reason)
        record = self.inspect(key)
        spec = self.specs.get(record.tool)
        retention = spec.retention_s if spec else DEFAULT_RETENTION_S
        try:
            if check is not None:
                check(record)
        except (OperatorError, TransitionRefusedError) as exc:
            self._audit(action, key, actor, reason, f"refused: {exc.message}")
            raise
        try:
            write = self.ledger.operate(
                key, action, note=f"{action} by {actor}: {reason}", retention_s=retention,
                receipt=receipt, override_evidence=override_evidence,
            )  # fmt: skip
        except TransitionRefusedError as exc:
            # The ledger decides (it may have moved since we read it); say why in words.
            if "evidence" in exc.details:
                refusal = TransitionRefusedError(
                    f"{exc.message}; pass --override-evidence to resolve it as not executed",
                    key=key, state=exc.state, evidence=exc.details["evidence"],
                )  # fmt: skip
            else:
                refusal = TransitionRefusedError(
                    _refusal(action, exc.state), key=key, state=exc.state
                )
            self._audit(action, key, actor, reason, f"refused: {refusal.message}")
            raise refusal from None
        self._audit(action, key, actor, reason, f"ok: {write.state} token {write.token}")
        return write

    def _audit(self, action: str, key: str, actor: str, reason: str, outcome: str) -> None:
        self.ledger.audit(action=action, key=key, actor=actor, reason=reason, outcome=outcome)
        shown = _KEYS.sub(lambda m: m.group()[:12], outcome)
        short = reason if len(reason) <= LOGGED_REASON else reason[:LOGGED_REASON] + "…"
        log.info(
            "operator %s on %s by %r: %s (reason %r)", action, key[:12], actor, shown, short,
            extra={"key": key[:12], "actor": actor, "action": action, "outcome": shown},
        )  # fmt: skip


def _refusal(action: str, state: str | None) -> str:
    if state == State.UNKNOWN.value or action.startswith("resolve"):
        if state in (State.CLAIMED.value, State.RECONCILING.value):
            return (
                f"{action} refused: the effect is {state}, its outcome not yet reconciled; "
                "only an UNKNOWN effect can be resolved by an operator"
            )
        if state == State.UNKNOWN.value:
            return f"{action} refused: the effect is UNKNOWN; resolve it with evidence first"
        return f"{action} refused: the effect is {state}; only an UNKNOWN effect can be resolved"
    return f"{action} refused: the effect is {state}; only a DONE effect can be {action}d"


def _check_words(actor: str, reason: str) -> None:
    for name, value in (("actor", actor), ("reason", reason)):
        if not value or not value.strip():
            raise OperatorError(f"an operator action needs a non-empty {name}")
        if len(value) > MAX_TEXT:
            raise OperatorError(f"{name} is longer than {MAX_TEXT} characters")
