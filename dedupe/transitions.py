"""Every write of the state machine, one ``ledger.lua`` call each: a producer's submit and
confirm, a worker's claim, heartbeat, commit, fail and handover, the reconciler's takeover
and unknown, an operator's operate and recheck. Each sizes its arguments, sends them
through the connection's retry rule (``Connection._call``) and turns the reply into a typed
result. Part of ``Ledger`` (``dedupe/ledger.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import redis

from .connection import Confirming, Connection, Submitting, ms
from .errors import RecordTooLargeError, TransitionRefusedError
from .identity import Effect
from .records import Claim, Submission, Takeover, Write

__all__ = ["MAX_TEXT_BYTES", "Transitions"]

# ledger.lua stores the request, receipt and raw response lengths in 3 bytes, notes in 2.
MAX_TEXT_BYTES = 2**24 - 1
_NOTE_CHARS = 500  # 500 characters are at most 2,000 bytes


# ``json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)``, its
# encoder built once rather than per call.
_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, sort_keys=True).encode


def _utf8_size(text: str) -> int:
    # Only a str is measured without encoding: anything else fails as it always did.
    return len(text) if type(text) is str and text.isascii() else len(text.encode("utf-8"))


class Transitions(Connection):
    """The transitions of a ledger's records."""

    # Set by ``Ledger``: the bounds of the texts a record stores.
    max_request_bytes: int
    max_receipt_bytes: int
    max_raw_bytes: int

    def request_text(self, effect: Effect) -> str:
        """The request stored with a claim (an operator replays from it), bounded. Submit
        checks the same bound, so a call no worker could claim is never enqueued."""
        request = _compact(
            {"scope": effect.scope, "action": effect.action, "args": dict(effect.args)}
        )
        return self._bounded("request", request, self.max_request_bytes, effect.key)

    def _bounded(self, what: str, text: str, limit: int, key: str) -> str:
        size = _utf8_size(text)
        if size > limit:
            raise RecordTooLargeError(
                f"{what} is {size} bytes, over the {limit}-byte bound", key=key, size=size
            )
        return text

    def _receipt_texts(
        self, receipt: Mapping[str, Any], raw: str | None, key: str
    ) -> tuple[str, str]:
        """The receipt and raw-response texts to store. When the raw response *is* the
        receipt (it parses to it), it is stored once, as sent; otherwise both, bounded."""
        if raw is not None and _utf8_size(raw) <= self.max_receipt_bytes:
            try:
                if json.loads(raw) == receipt:
                    return raw, ""
            except ValueError:
                pass
        text = self._bounded("receipt", _compact(dict(receipt)), self.max_receipt_bytes, key)
        raw_text = "" if raw is None or raw == text else raw
        return text, self._bounded("raw response", raw_text, self.max_raw_bytes, key)

    # -- producer ---------------------------------------------------------------------

    def submit(
        self, effect: Effect, *, message_id: str, pending_s: float, force: bool = False
    ) -> Submission:
        """Decide whether a producer may enqueue ``effect``; on "enqueue" a pending marker
        (``message_id``, expiring after ``pending_s``) now stands for the message, which
        must carry the answer's ``generation``. ``force``: enqueue despite a confirmed
        marker (its message is known lost). RecordTooLargeError, before anything is
        written, for a request over the claim's bound."""
        [answer] = self.submit_many([(effect, message_id)], pending_s=pending_s, force=force)
        return answer

    def submit_many(
        self, calls: list[tuple[Effect, str]], *, pending_s: float, force: bool = False
    ) -> list[Submission]:
        """``submit`` for many (effect, message id) pairs in one pipelined round trip.
        ``force`` enqueues despite a live pending marker (a campaign re-submission)."""
        return self.start_submit(calls, pending_s=pending_s, force=force).answers()

    def start_submit(
        self,
        calls: list[tuple[Effect, str]],
        *,
        pending_s: float,
        force: bool = False,
        bounded: bool = False,
    ) -> Submitting:
        """``submit_many`` in two halves, so a producer builds its messages while the server
        decides: on one server the calls are on the wire when this returns and
        ``Submitting.answers`` reads them; until then this thread makes no other ledger
        call (``Submitting.abandon`` if it fails meanwhile). On a cluster, or for one call,
        the answers are in by the time this returns. ``bounded``: the caller has checked
        every request's bound already (``request_text``), so it is not encoded again."""
        if not bounded:
            for effect, _ in calls:
                self.request_text(effect)
        batch = [
            (effect.key, ["submit", effect.key, bytes.fromhex(effect.fingerprint), effect.tool,
                          ms(pending_s), message_id, "1" if force else "0", effect.fingerprint])
            for effect, message_id in calls
        ]  # fmt: skip
        keys = [effect.key for effect, _ in calls]
        if isinstance(self.client, redis.RedisCluster) or len(batch) == 1:
            with self.guard(reread=True):
                return Submitting(self, keys, self._script_batch(batch))
        with self.guard(reread=True):
            return Submitting(
                self, keys, self._script.start_many([(self._keys(k), a) for k, a in batch])
            )

    def clear_pending(self, key: str) -> None:
        """Forget the pending marker: its message was dead-lettered or never enqueued."""
        with self.guard(key):
            self.client.delete(self._pending_key(key))

    # -- pending reservations (producer) ------------------------------------------------
    # A producer submits with a short ``pending_s`` (a reservation: a producer killed before
    # its enqueue leaves a marker that lapses within seconds), then confirms once the broker
    # accepted the message. Only a confirmed marker answers "pending" to another submission;
    # one that meets a reservation is enqueued too (the reservation may never become a
    # message), and the claim turns the second message into a duplicate. A reservation that
    # lapsed before the confirm stays gone, with the same outcome for the next submission.

    def confirm_pending(self, sent: Iterable[tuple[Effect, str]], pending_s: float) -> None:
        """The broker accepted these (effect, message id) messages: each one's reservation
        now answers "pending" and lasts ``pending_s`` (one pipelined round trip). A marker
        that is gone (lapsed, or cleared by the effect's commit) or that another submission
        wrote since is left as it is (the script's ``confirm``)."""
        self.start_confirm(sent, pending_s).wait()

    def start_confirm(self, sent: Iterable[tuple[Effect, str]], pending_s: float) -> Confirming:
        """``confirm_pending`` in two halves, so a producer goes on while the server
        confirms: on one server the confirms are on the wire, on a connection of their own,
        when this returns (this thread's other ledger calls go on meanwhile) and
        ``Confirming.wait`` reads them; on a cluster, or for one call, they are done by
        then."""
        pending_ms = ms(pending_s)
        batch = [
            (effect.key, ["confirm", effect.key, message_id, effect.fingerprint, pending_ms])
            for effect, message_id in sent
        ]
        if not batch:
            return Confirming(self, None)
        # After a failover, the next confirm finds the master (reread).
        with self.guard(reread=True):
            if isinstance(self.client, redis.RedisCluster) or len(batch) == 1:
                self._script_batch(batch)
                return Confirming(self, None)
            keyed = [(self._keys(key), argv) for key, argv in batch]
            return Confirming(self, self._script.start_many(keyed, own_connection=True))

    # -- worker transitions -----------------------------------------------------------

    def claim(
        self,
        effect: Effect,
        *,
        lease_s: float,
        holder: str,
        campaign: str | None = None,
        generation: int = 0,
        submitted_ms: int = 0,
        window_s: float = 0.0,
    ) -> Claim:
        """Claim ``effect``: acquired / duplicate / conflict / in_flight / blocked / stale.
        ``campaign`` (a campaign tag) makes the record count towards its campaign.
        ``generation``: the one the message was submitted for (``Submission.generation``,
        carried by the envelope). A message of an older generation than the record's is a
        duplicate in every state: it never runs and never rewrites the record.
        ``submitted_ms``: the ledger's time at submit (``Submission.submitted_ms``; 0: not
        known) — where a claim would be granted, a message older than ``window_s`` (the
        provider's idempotency window) on the ledger's clock is ``stale``, never run."""
        request = self.request_text(effect)
        argv = [bytes.fromhex(effect.fingerprint), effect.tool, ms(lease_s), holder, request,
                campaign or "", generation, max(submitted_ms, 0), int(window_s * 1000)]  # fmt: skip
        return Claim.from_reply(effect.key, self._call("claim", effect.key, *argv))

    def heartbeat(self, key: str, token: int, *, lease_s: float) -> Write:
        """Extend the lease of CLAIMED / RECONCILING held under ``token``."""
        return Write.from_reply(self._call("heartbeat", key, token, ms(lease_s)))

    def commit(
        self,
        key: str,
        token: int,
        receipt: Mapping[str, Any],
        *,
        raw: str | None = None,
        retention_s: float,
        note: str = "commit",
    ) -> Write:
        """CLAIMED / RECONCILING under ``token`` → DONE with the receipt and raw response.
        Fenced under a stale token: the receipt is kept as a late receipt, and a FAILED
        record becomes UNKNOWN (evidence of execution blocks the key for an operator)."""
        text, raw_text = self._receipt_texts(receipt, raw, key)
        return Write.from_reply(
            self._call("commit", key, token, text, raw_text, ms(retention_s), note[:_NOTE_CHARS])
        )

    def fail(self, key: str, token: int, *, reason: str, retention_s: float) -> Write:
        """CLAIMED / RECONCILING under ``token`` → FAILED: known not executed."""
        reply = self._call("fail", key, token, reason[:_NOTE_CHARS], ms(retention_s))
        return Write.from_reply(reply)

    def handover(self, key: str, token: int, *, reason: str) -> Write:
        """The holder cannot tell whether the effect happened: hand it to the reconciler now."""
        return Write.from_reply(self._call("handover", key, token, reason[:_NOTE_CHARS]))

    # -- reconciler transitions -------------------------------------------------------

    def takeover(self, key: str, *, lease_s: float, holder: str) -> Takeover | None:
        """Take an expired CLAIMED / RECONCILING record over under a new token, or None."""
        reply = self._call("takeover", key, ms(lease_s), holder)
        if reply[0] != "acquired":
            return None
        late = json.loads(reply[7])
        return Takeover(
            key=key,
            token=int(reply[1]),
            generation=int(reply[2]),
            tool=str(reply[3]),
            request=json.loads(reply[4]) if reply[4] else None,
            attempts=int(reply[5]),
            claimed_ms=int(reply[6]),
            late_receipts=late if isinstance(late, list) else [],
            reconciling_since_ms=int(reply[8]),
            rounds=int(reply[9]),
            now_ms=int(reply[10]),
        )

    def mark_unknown(self, key: str, token: int, *, reason: str) -> Write:
        """RECONCILING under ``token`` → UNKNOWN: blocks every claim until an operator acts."""
        return Write.from_reply(self._call("unknown", key, token, reason[:_NOTE_CHARS]))

    # -- operator transitions ---------------------------------------------------------

    def operate(
        self,
        key: str,
        action: str,
        *,
        note: str,
        retention_s: float,
        receipt: Mapping[str, Any] | None = None,
        raw: str | None = None,
        override_evidence: bool = False,
    ) -> Write:
        """resolve_done / resolve_failed (from UNKNOWN), revoke / supersede (from DONE).

        Raises TransitionRefusedError where the state table forbids it, and for
        resolve_failed on a record holding late receipts unless ``override_evidence``
        (``details["evidence"]``: how many), decided in the same atomic call as the write.
        """
        text, raw_text = self._receipt_texts(receipt, raw, key) if receipt is not None else ("", "")
        override = "1" if override_evidence else "0"
        reply = self._call(
            "operate", key, action, note[:_NOTE_CHARS], ms(retention_s), text, raw_text, override
        )
        if reply[0] == "refused" and len(reply) > 3:
            late = int(reply[3])
            raise TransitionRefusedError(
                f"{action} refused: {late} late receipt(s) say the effect may have happened",
                key=key,
                state=str(reply[1]),
                evidence=late,
            )
        if reply[0] == "refused":
            raise TransitionRefusedError(
                f"{action} refused: effect is {reply[1]}", key=key, state=str(reply[1])
            )
        return Write.from_reply(reply)

    def recheck(self, key: str, *, tool: str, note: str, holder: str) -> Write:
        """UNKNOWN (a record of ``tool``) → RECONCILING under a new token, its lease expired
        at once: the next reconciler pass asks the provider again, with a fresh lookup
        budget. TransitionRefusedError in any other state or for another tool's record."""
        reply = self._call("recheck", key, tool, note[:500], holder[:200])
        if reply[0] == "refused":
            raise TransitionRefusedError(
                f"recheck refused: effect is {reply[1]}", key=key, state=str(reply[1])
            )
        return Write.from_reply(reply)
