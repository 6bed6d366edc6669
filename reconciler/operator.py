"""Operator actions: inspect, list, resolve, revoke, supersede, replay, the bulk re-check;
the pages of the audit and dead-letter streams.

Every action names an actor and a reason, is appended to the ledger's audit stream (refusals
too), and is refused — with a specific message — where it would hide an unreconciled
effect. The transitions themselves are the ledger's (``operate`` in ``ledger.lua``); this
module adds the evidence rules and the audit trail.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Callable, Mapping
from typing import Any

from dedupe import (
    EffectRecord,
    IdentityError,
    Ledger,
    MessageError,
    NotFoundError,
    OperatorError,
    State,
    ToolSpec,
    TransitionRefusedError,
    Write,
)
from dedupe.identity import EFFECT_KEY, check_key
from dedupe.spec import DEFAULT_RETENTION_S
from dedupe.states import CLAIMABLE, HELD, INDEXED

__all__ = ["Operator"]

log = logging.getLogger(__name__)

MAX_TEXT = 200
# A filtered stream page reads at most this many entries before it answers with what it
# found and a cursor to go on from: a rare actor or tool never makes one request unbounded.
SCAN_BOUND = 10_000
# Each indexed state's index: UNKNOWN has its own, the holds share the leases index.
_INDEX = {state: "unknown" if state is State.UNKNOWN else "leases" for state in INDEXED}
# A log line shows this much of an operator's reason (free text: it may quote anything);
# the audit stream keeps it whole.
LOGGED_REASON = 80


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
        states = [state] if state else INDEXED
        keys = [k for s in states for k in self.ledger.keys_in(s, limit=limit)]
        records = [r for r in self.ledger.get_many(keys).values() if r is not None]
        return [r for r in records if tool is None or r.tool == tool][:limit]

    def page(
        self,
        *,
        state: State | None = None,
        tool: str | None = None,
        since_ms: int | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> tuple[builtins.list[EffectRecord], str | None]:
        """A page of the state indexes, oldest first: UNKNOWN by the time it became UNKNOWN,
        CLAIMED / RECONCILING by lease deadline (no ``state``: UNKNOWN, then the leases),
        from ``since_ms`` on; the cursor to go on from, None at the end."""
        if state is not None and state not in _INDEX:
            raise OperatorError(f"paging covers the indexed states only: {', '.join(INDEXED)}")
        indexes = [_INDEX[state]] if state else ["unknown", "leases"]
        position = _read_cursor(cursor, indexes)
        first = indexes.index(position[0]) if position else 0
        records: builtins.list[EffectRecord] = []
        scanned = 0
        for n, index in enumerate(indexes[first:], first):
            after = position[1] if position and position[0] == index else None
            while len(records) < limit and scanned < SCAN_BOUND:
                found = self.ledger.index_page(index, after=after, since_ms=since_ms,
                                               count=limit - len(records))  # fmt: skip
                if not found:
                    break
                scanned += len(found)
                after = (found[-1][1], found[-1][0])
                got = self.ledger.get_many(k for k, _ in found)
                records += [
                    r for r in got.values()
                    if r is not None and (state is None or r.state is state)
                    and (tool is None or r.tool == tool)
                ]  # fmt: skip
            if len(records) < limit and scanned < SCAN_BOUND:
                continue  # this index is exhausted: the next one fills the page
            if after is not None and self.ledger.index_page(
                index, after=after, since_ms=since_ms, count=1
            ):
                return records, f"{index[0]}{after[0]}.{after[1]}"
            if n + 1 < len(indexes):  # the next index from its start (below every entry)
                return records, f"{indexes[n + 1][0]}0.{'0' * 64}"
            return records, None
        return records, None

    def stream(
        self,
        stream: str,
        *,
        before: str | None = None,
        since_ms: int | None = None,
        limit: int = 100,
        where: Mapping[str, str] | None = None,
        key: str | None = None,
    ) -> tuple[builtins.list[dict[str, str]], str | None]:
        """Entries of the audit or dead-letter stream, newest first, whose fields match
        ``where``; with ``key``, that effect's whole audit trail. The cursor (an entry id)
        goes on from the last entry read, None at the end."""
        if key is not None:
            check_key(key)
        where = dict(where or {})
        entries: builtins.list[dict[str, str]] = []
        scanned, cursor = 0, before
        while len(entries) < limit and scanned < SCAN_BOUND:
            chunk = self.ledger.stream_page(
                stream, before=cursor, since_ms=since_ms, key=key,
                count=min(SCAN_BOUND - scanned, max(limit - len(entries), 100)),
            )  # fmt: skip
            if not chunk:
                return entries, None
            scanned += len(chunk)
            for entry in chunk:
                cursor = entry["id"]
                if all(entry.get(name) == value for name, value in where.items()):
                    entries.append(entry)
                    if len(entries) == limit:
                        break
        more = cursor is not None and bool(
            self.ledger.stream_page(stream, before=cursor, since_ms=since_ms, key=key, count=1)
        )
        return entries, cursor if more else None

    # -- actions ----------------------------------------------------------------------

    def recheck(
        self,
        tool: str,
        *,
        since_ms: int | None,
        until_ms: int | None,
        actor: str,
        reason: str,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Send every UNKNOWN effect of ``tool`` whose UNKNOWN transition falls in
        [since_ms, until_ms] back to the reconciler, which asks the provider again (a
        fresh lookup budget; its decision as for any takeover). Each effect's recheck is
        audited on its trail, the whole run once more; ``dry_run`` only counts."""
        check_words(actor, reason)
        spec = self.specs.get(tool)
        if spec is None or spec.lookup is None:
            why = "is not declared here" if spec is None else "has no lookup"
            message = f"recheck refused: tool {tool} {why}; a recheck would find it UNKNOWN again"
            if not dry_run:
                self._audit("recheck", "", actor, reason, f"refused: {message}")
            raise OperatorError(message)
        matched = rechecked = 0
        refused: dict[str, int] = {}
        after: tuple[int, str] | None = None
        note = f"recheck by {actor}: {reason}"
        while True:
            found = self.ledger.index_page(
                "unknown", after=after, since_ms=since_ms, until_ms=until_ms, count=500
            )
            if not found:
                break
            after = (found[-1][1], found[-1][0])
            records = self.ledger.get_many(k for k, _ in found)
            for key, record in records.items():
                if record is None or record.tool != tool or record.state is not State.UNKNOWN:
                    continue
                matched += 1
                if dry_run:
                    continue
                try:
                    write = self.ledger.recheck(key, tool=tool, note=note, holder=f"op/{actor}")
                except TransitionRefusedError as exc:
                    # Resolved (or rechecked) by someone else since the read: theirs stands.
                    state = exc.state or "ABSENT"
                    refused[state] = refused.get(state, 0) + 1
                    self._audit("recheck", key, actor, reason, f"refused: effect is {state}")
                    continue
                rechecked += 1
                self._audit("recheck", key, actor, reason, f"ok: {write.state} token {write.token}")
        document = {
            "tool": tool, "since_ms": since_ms, "until_ms": until_ms, "dry_run": dry_run,
            "matched": matched, "rechecked": rechecked, "refused": refused,
        }  # fmt: skip
        if not dry_run:
            outcome = f"ok: {rechecked} of {matched} UNKNOWN {tool} effects rechecked"
            self._audit("recheck", "", actor, reason, outcome)
        return document

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
        """Send the effect's request again, only where a claim would be granted; ``enqueue``
        chooses it (the record's stored request, or the call the operator gives where the
        record keeps none: a DONE record drops it), checks it, submits it (the workers'
        producer) and returns its submit status, or raises OperatorError, audited as a
        refusal. Going through submit makes it a submission after the revoke: its message
        opens generation n+1."""
        check_words(actor, reason)
        record = self.inspect(key)
        if record.state not in CLAIMABLE:
            message = (
                f"replay refused: effect is {record.state.value}; only FAILED, REVOKED or "
                "SUPERSEDED effects can be replayed"
            )
            self._audit("replay", key, actor, reason, f"refused: {message}")
            raise TransitionRefusedError(message, key=key, state=record.state.value)
        try:
            status = enqueue(record)
        except (OperatorError, IdentityError, MessageError) as exc:  # the call given, refused
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
        check_words(actor, reason)
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
        shown = EFFECT_KEY.sub(lambda m: m.group()[:12], outcome)
        short = reason if len(reason) <= LOGGED_REASON else reason[:LOGGED_REASON] + "…"
        log.info(
            "operator %s on %s by %r: %s (reason %r)", action, key[:12], actor, shown, short,
            extra={"key": key[:12], "actor": actor, "action": action, "outcome": shown},
        )  # fmt: skip


def _refusal(action: str, state: str | None) -> str:
    if state == State.UNKNOWN.value or action.startswith("resolve"):
        if state in HELD:
            return (
                f"{action} refused: the effect is {state}, its outcome not yet reconciled; "
                "only an UNKNOWN effect can be resolved by an operator"
            )
        if state == State.UNKNOWN.value:
            return f"{action} refused: the effect is UNKNOWN; resolve it with evidence first"
        return f"{action} refused: the effect is {state}; only an UNKNOWN effect can be resolved"
    return f"{action} refused: the effect is {state}; only a DONE effect can be {action}d"


def _read_cursor(cursor: str | None, indexes: list[str]) -> tuple[str, tuple[int, str]] | None:
    """A ``page`` cursor: index letter, score, ".", key (what ``page`` hands out)."""
    if cursor is None:
        return None
    score, dot, key = cursor[1:].partition(".")
    index = next((i for i in indexes if i[0] == cursor[:1]), None)
    if (
        index is None
        or not dot
        or not score.isdigit()
        or len(score) > 16
        or not EFFECT_KEY.fullmatch(key)
    ):
        raise OperatorError("not a cursor of this listing (pass the one a page handed out)")
    return index, (int(score), key)


def check_words(actor: str, reason: str) -> None:
    for name, value in (("actor", actor), ("reason", reason)):
        if not value or not value.strip():
            raise OperatorError(f"an operator action needs a non-empty {name}")
        if len(value) > MAX_TEXT:
            raise OperatorError(f"{name} is longer than {MAX_TEXT} characters")
