"""The claim ledger on Redis: the only code that knows effectq's Redis keys.

Every transition is one call of ``ledger.lua`` (one round trip, atomic, server time); this
class sizes the arguments, names the keys, and turns replies into typed results. It is
safe to share across threads (redis-py pools connections) and across ``fork`` (redis-py
resets its pool in a child).

On a Redis Cluster every call stays in one slot: all keys of a call share the bucket's hash
tag ``{namespace:bucket}``. redis-py's cluster pipeline refuses scripts, so batched script
calls go through one ordinary pipeline per master (a slot that moved meanwhile is retried
through the cluster client, which follows the redirect).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable, Mapping
from functools import cached_property
from typing import Any

import redis
from redis.commands.core import Script

from .client import REDIS_ERRORS, client_from_url, ledger_error
from .connection import Confirming, Connection, Submitting, ms
from .errors import (
    LayoutChangedError,
    LedgerAuthError,
    LedgerConfigError,
    LedgerError,
    LedgerUnavailableError,
    RecordTooLargeError,
    TransitionRefusedError,
    VolatileLedgerError,
)
from .identity import Effect
from .keys import FOREIGN_PATTERNS, SCHEMA_KEY, SCHEMA_NAMESPACE, schema_field
from .records import Claim, EffectRecord, PendingMarker, State, Submission, Takeover, Write
from .states import CLAIMABLE

__all__ = [
    "DEFAULT_BUCKETS",
    "LEDGER_FORMAT",
    "SCHEMA_KEY",
    "Confirming",
    "Ledger",
    "Submitting",
    "ledger_error",
]

#: The layout and record format this release writes and reads (the version record's
#: ``format``); a ledger written by a newer release is refused.
LEDGER_FORMAT = 1

DEFAULT_BUCKETS = 256
# ledger.lua stores the request, receipt and raw response lengths in 3 bytes, notes in 2.
_MAX_TEXT_BYTES = 2**24 - 1
_NOTE_CHARS = 500  # 500 characters are at most 2,000 bytes
# Group membership on the server's clock: refresh one member, drop the silent, list the rest.
_MEMBERS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


class Ledger(Connection):
    """One record per effect key, bucketed so each call touches one hash slot.

    Parameters
    ----------
    client:
        a ``redis.Redis`` or ``redis.RedisCluster`` client with ``decode_responses=True``
        (UTF-8, strict: another client is refused with LedgerConfigError).
        Keep the ledger in its own database or server, apart from the broker. The ledger
        sets the client's retry policy to none: which calls may be sent again after a
        reply lost on the wire is its decision (a claim is not; a commit is, once).
    allow_volatile:
        accept a Redis without AOF, or one that evicts keys (``maxmemory-policy`` other than
        ``noeviction``). A ledger that forgets grants a second claim, so this is refused
        unless asked for (``workers`` asks when ``EFFECTQ_ALLOW_VOLATILE_LEDGER`` is set).
    wait_replicas:
        after each write, ``WAIT`` for this many replicas (same round trip). A claim that no
        replica acknowledged is not acted on. Redis documents that a failover can still lose
        an acknowledged write: this narrows the window, it does not close it.
        ``wait_timeout_ms`` (at least 1: WAIT's 0 would block until a replica answers)
        bounds each WAIT.
    """

    def __init__(
        self,
        client: redis.Redis | redis.RedisCluster,
        *,
        namespace: str = "effectq",
        buckets: int = DEFAULT_BUCKETS,
        allow_volatile: bool = False,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 500,
        max_request_bytes: int = 64 * 1024,
        max_receipt_bytes: int = 16 * 1024,
        max_raw_bytes: int = 64 * 1024,
    ) -> None:
        if not 1 <= buckets <= 16384:
            raise LedgerConfigError("buckets must be between 1 and 16384")
        bounds = (max_request_bytes, max_receipt_bytes, max_raw_bytes)
        if max(bounds) > _MAX_TEXT_BYTES or min(bounds) < 1:
            raise LedgerConfigError(
                "the request, receipt and raw response bounds are 1 B to 16 MiB"
            )
        if wait_replicas < 0:
            raise LedgerConfigError("wait_replicas must be 0 (no WAIT) or more")
        if wait_replicas and wait_timeout_ms < 1:
            # WAIT with timeout 0 blocks until the replicas answer: a claim would hang on a
            # lost replica until the socket timed out, its grant unheard.
            raise LedgerConfigError("wait_timeout_ms must be at least 1 with wait_replicas")
        # Glob characters too: the layout check finds the namespace's keys by a SCAN
        # pattern, and `shop*` would pass for `shop` (and run its effects again).
        if not namespace or any(c in namespace for c in "{}: \t\n*?[]\\"):
            raise LedgerConfigError(
                "namespace must be non-empty, without braces, colons, spaces or glob "
                "characters (* ? [ ] \\)"
            )
        super().__init__(
            client,
            namespace=namespace,
            buckets=buckets,
            wait_replicas=wait_replicas,
            wait_timeout_ms=wait_timeout_ms,
        )
        self.max_request_bytes = max_request_bytes
        self.max_receipt_bytes = max_receipt_bytes
        self.max_raw_bytes = max_raw_bytes
        if not allow_volatile:
            self.check_durability()

    @classmethod
    def from_url(cls, url: str, *, cluster: bool | None = None, **kwargs: Any) -> Ledger:
        """``redis://``, ``rediss://`` (TLS) and ``redis://user:password@…`` (ACL) URLs.
        Keyword arguments the Ledger does not take (``ssl_ca_certs``, ``ssl_certfile``,
        timeouts…) go to redis-py's client; TLS options may also sit in the URL. A
        ``retry`` given there is replaced by none (see ``client`` above).

        ``url`` may list several nodes of one Redis Cluster, comma-separated, that differ
        only in host and port (``redis://a:7000,redis://b:7000``): any live one bootstraps
        the client, so one dead node does not stop a process from starting.
        ``cluster``: whether the URL names a cluster node; None asks the seeds in turn
        (``INFO cluster``) and only an answer decides: a seed that errs is skipped, and
        LedgerUnavailableError if none answers (never a guess: a plain client on a cluster
        node would meet MOVED for most keys)."""
        own = set(inspect.signature(cls.__init__).parameters) - {"self", "client"}
        mine = {k: v for k, v in kwargs.items() if k in own}
        client_options = {k: v for k, v in kwargs.items() if k not in own}
        client_options.setdefault("socket_timeout", 5.0)
        client_options.setdefault("socket_connect_timeout", 5.0)
        client_options.setdefault("health_check_interval", 30)
        client_options.setdefault("decode_responses", True)
        return cls(client_from_url(url, cluster=cluster, options=client_options), **mine)

    @cached_property
    def _members(self) -> Script:
        return self.client.register_script(_MEMBERS)

    # -- keys -------------------------------------------------------------------------

    def lease_indexes(self) -> list[str]:
        """Every bucket's lease index (a sorted set of keys by lease deadline, in ms), for
        readers that watch the backlog without a script (the metrics' scrape)."""
        return [self.keyspace.index(bucket, "leases") for bucket in range(self.buckets)]

    # -- plumbing ---------------------------------------------------------------------

    def check_layout(self, *, allow_new_namespace: bool = False) -> None:
        """Refuse to work on a ledger laid out otherwise (UPGRADING, "settings that must never
        change"): every key is derived from the namespace and the bucket count, so a change
        of either on a ledger that holds records makes every recorded effect invisible and
        lets it run again.

        The ledger's version record (``effectq:ledger``, a hash: ``format``, and
        ``ns:<namespace>`` -> bucket count for every namespace that uses it) is written when
        a namespace first uses the ledger. A format newer than this release's is refused. A
        namespace the record does not name is accepted when it owns keys already (its own
        records, or the previous release's ``<namespace>:layout``) or when the ledger holds
        nothing; on a ledger with other namespaces it is refused — unless
        ``allow_new_namespace`` (a second deployment on purpose) on a versioned ledger. A
        ledger written before versions existed that holds only other namespaces' keys is
        refused whatever the setting, until an operator adopts the namespace
        (``adopt_namespace``: ``effectq ledger adopt``, audited)."""
        with self.guard():
            schema = {str(k): str(v) for k, v in self.client.hgetall(SCHEMA_KEY).items()}
            known = int(schema.get("format", "0") or 0)
            if known > LEDGER_FORMAT:
                raise LayoutChangedError(
                    f"the ledger was written by a newer release (format {known}; this release "
                    f"knows {LEDGER_FORMAT}): upgrade this process, or roll the ledger back"
                )
            stored = schema.get(schema_field(self.namespace))
            if stored is None:
                stored = self._legacy_layout()
            if stored is None:
                if self._owns_keys():
                    stored = str(self.buckets)  # its own records, from before any layout key
                elif self._foreign_keys(schema):
                    if not schema:
                        raise LayoutChangedError(
                            f"namespace {self.namespace!r} owns nothing on a ledger that holds "
                            "another namespace's records and no version record (written before "
                            "versions): a changed EFFECTQ_NAMESPACE would let every recorded "
                            "effect run again. Restore the namespace, or adopt this one on "
                            "purpose: effectq ledger adopt --namespace NS --actor A --reason R"
                        )
                    if not allow_new_namespace:
                        raise LayoutChangedError(
                            f"namespace {self.namespace!r} is new on a ledger laid out for "
                            "another namespace: a changed EFFECTQ_NAMESPACE would let every "
                            "recorded effect run again. Restore the namespace, or set "
                            "EFFECTQ_ALLOW_NEW_NAMESPACE=true for a second deployment on this "
                            "ledger."
                        )
                self._register(str(self.buckets))
                stored = str(self.buckets)
            elif schema_field(self.namespace) not in schema:
                self._register(stored)
        if int(stored) != self.buckets:
            raise LayoutChangedError(
                f"namespace {self.namespace!r} was laid out in {int(stored)} buckets, not "
                f"{self.buckets}: a changed bucket count moves every key. Restore it."
            )

    def adopt_namespace(self, *, actor: str, reason: str) -> dict[str, Any]:
        """Register this namespace in the ledger's version record on an operator's word
        (``effectq ledger adopt``): the one way a namespace that owns nothing is accepted on
        a ledger written before versions existed. Audited; refused for a namespace laid out
        in another bucket count."""
        with self.guard():
            stored = self.client.hget(SCHEMA_KEY, schema_field(self.namespace))
            stored = stored if stored is not None else self._legacy_layout()
            if stored is not None and int(stored) != self.buckets:
                raise LayoutChangedError(
                    f"namespace {self.namespace!r} was laid out in {int(stored)} buckets, not "
                    f"{self.buckets}: a changed bucket count moves every key. Restore it."
                )
            self._register(str(self.buckets))
        result = f"namespace {self.namespace} adopted, {self.buckets} buckets"
        self.audit(action="ledger_adopt", actor=actor, reason=reason, result=result)
        return {"namespace": self.namespace, "buckets": self.buckets, "format": LEDGER_FORMAT}

    def _legacy_layout(self) -> str | None:
        found = self.client.get(self.keyspace.legacy_layout)
        return None if found is None else str(found)

    def _owns_keys(self) -> bool:
        return next(self.client.scan_iter(match=self.keyspace.owned, count=1000), None) is not None

    def _foreign_keys(self, schema: Mapping[str, str]) -> bool:
        """Another namespace uses this ledger: named in the version record, laid out by the
        previous release (``<ns>:layout``), or holding effect keys (``{<ns>:<bucket>}``)."""
        mine = schema_field(self.namespace)
        if any(k.startswith(SCHEMA_NAMESPACE) and k != mine for k in schema):
            return True
        for pattern in FOREIGN_PATTERNS:
            if next(self.client.scan_iter(match=pattern, count=1000), None) is not None:
                return True
        return False

    def _register(self, buckets: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.hsetnx(SCHEMA_KEY, "format", LEDGER_FORMAT)
        pipe.hsetnx(SCHEMA_KEY, schema_field(self.namespace), buckets)
        # The previous release reads this during a rolling upgrade.
        pipe.set(self.keyspace.legacy_layout, buckets, nx=True)
        pipe.execute()

    def fsync_policy(self) -> str | None:
        """The ledger Redis's ``appendfsync`` (always / everysec / no; on a cluster the
        weakest master's), or None when the server will not say (CONFIG refused)."""
        order = {"always": 0, "everysec": 1, "no": 2}
        try:
            with self.guard():
                if isinstance(self.client, redis.RedisCluster):
                    replies = self.client.config_get(
                        "appendfsync", target_nodes=redis.RedisCluster.PRIMARIES
                    )
                    values = [str(r) for r in replies.values()] if isinstance(replies, dict) else []
                else:
                    values = [str(self.client.config_get("appendfsync").get("appendfsync"))]
        except LedgerError:
            return None
        known = [v for v in values if v in order]
        return max(known, key=order.__getitem__) if known else None

    def check_durability(self) -> None:
        """Refuse a Redis that can forget a record: without AOF, or evicting keys under
        memory pressure (allkeys-*: a live claim; volatile-*: DONE records, which carry a
        TTL). On a cluster every master is checked."""
        try:
            if isinstance(self.client, redis.RedisCluster):
                per_node = [
                    {
                        **self.client.info("persistence", target_nodes=node),
                        **self.client.info("memory", target_nodes=node),
                    }
                    for node in self.client.get_primaries()  # type: ignore[no-untyped-call]
                ]
            else:
                per_node = [{**self.client.info("persistence"), **self.client.info("memory")}]
        except redis.AuthenticationError as exc:
            raise LedgerAuthError(f"ledger Redis refused the credentials: {exc}") from None
        except redis.ResponseError as exc:
            raise VolatileLedgerError(
                f"cannot verify the ledger's persistence ({exc}); grant INFO or allow volatility"
            ) from None
        except REDIS_ERRORS as exc:
            raise LedgerUnavailableError(f"ledger Redis unreachable: {exc}") from None
        for info in per_node:
            if int(info.get("aof_enabled", 0)) != 1:
                raise VolatileLedgerError(
                    "the ledger Redis has no AOF persistence (appendonly no): a restart would "
                    "forget claims and grant them twice. Enable appendonly, or set "
                    "EFFECTQ_ALLOW_VOLATILE_LEDGER=true if this ledger may be volatile."
                )
            policy = info.get("maxmemory_policy", "not reported")
            if policy != "noeviction":
                raise VolatileLedgerError(
                    f"the ledger Redis may evict records (maxmemory-policy is {policy}): an "
                    "evicted claim or receipt is granted again. Set maxmemory-policy "
                    "noeviction, or set EFFECTQ_ALLOW_VOLATILE_LEDGER=true if this ledger "
                    "may be volatile."
                )

    def request_text(self, effect: Effect) -> str:
        """The request stored with a claim (an operator replays from it), bounded. Submit
        checks the same bound, so a call no worker could claim is never enqueued."""
        request = _compact(
            {"scope": effect.scope, "action": effect.action, "args": dict(effect.args)}
        )
        return self._bounded("request", request, self.max_request_bytes, effect.key)

    def _bounded(self, what: str, text: str, limit: int, key: str) -> str:
        size = len(text.encode("utf-8"))
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
        if raw is not None and len(raw.encode("utf-8")) <= self.max_receipt_bytes:
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

    def has_pending(self, key: str) -> bool:
        """A pending marker stands for a message that may still run ``key``."""
        with self.guard(key):
            return self.client.get(self._pending_key(key)) is not None

    def markers(self, *, limit: int = 100) -> list[PendingMarker]:
        """Keys that hold a pending marker and no record a worker holds (none, FAILED,
        REVOKED, SUPERSEDED): the effects only a broker message stands for, which no other
        list shows. A SCAN of the keyspace: an operator's view, not a hot path."""
        found: dict[str, tuple[str, str]] = {}
        with self.guard():
            for name in self.client.scan_iter(match=self.keyspace.markers, count=1000):
                found[str(name).rsplit(":", 1)[1]] = ("", str(name))
                if len(found) >= 20 * limit:
                    break
            pipe = self.client.pipeline(transaction=False)
            for _key, marker_key in found.values():
                pipe.get(marker_key)
                pipe.pttl(marker_key)
            replies = pipe.execute() if found else []
        records = self.get_many(found)
        out: list[PendingMarker] = []
        for n, key in enumerate(found):
            marker, ttl = replies[2 * n], replies[2 * n + 1]
            record = records[key]
            if marker is None or (record is not None and record.state not in CLAIMABLE):
                continue
            parts = str(marker).split("|")
            out.append(
                PendingMarker(
                    key=key,
                    state=record.state.value if record is not None else "ABSENT",
                    tool=record.tool if record is not None else None,
                    message_id=parts[1] if len(parts) > 1 else "",
                    confirmed=len(parts) == 2,
                    ttl_ms=int(ttl) if int(ttl) > 0 else None,
                )
            )
            if len(out) >= limit:
                break
        return out

    def dead_letter(self, *, message_id: str, tool: str, key: str | None, reason: str) -> None:
        """Record why a message was dead-lettered (the broker keeps the message itself)."""
        fields = {"message_id": message_id, "tool": tool, "key": key or "", "reason": reason[:1000]}
        with self.guard(key):
            pipe = self.client.pipeline(transaction=False)
            pipe.xadd(self.keyspace.stream("deadletters"), fields, maxlen=100_000, approximate=True)  # type: ignore[arg-type]
            if key:
                pipe.delete(self._pending_key(key))
            pipe.execute()

    def dead_letters(self, count: int = 100) -> list[dict[str, str]]:
        """The most recent dead-letter records, newest first."""
        return self._newest(self.keyspace.stream("deadletters"), count)

    def _newest(self, stream: str, count: int) -> list[dict[str, str]]:
        with self.guard():
            entries: list[tuple[str, dict[str, str]]] = self.client.xrevrange(  # type: ignore[assignment]
                stream, count=count
            )
        return [{"id": entry_id, **fields} for entry_id, fields in entries]

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

    # -- reads ------------------------------------------------------------------------

    def get(self, key: str) -> EffectRecord | None:
        return self.get_many([key])[key]

    def get_many(self, keys: Iterable[str]) -> dict[str, EffectRecord | None]:
        """Records of ``keys`` in one pipelined round trip (None where there is none)."""
        keys = list(keys)
        if not keys:
            return {}
        # The script is the one reader of the stored form: it answers the record as JSON.
        with self.guard(reread=True):
            replies = self._script_batch([(key, ["get", key]) for key in keys], read_only=True)
        return {
            key: None if reply is None else EffectRecord.from_blob(key, reply[0], int(reply[1]))
            for key, reply in zip(keys, replies, strict=True)
        }

    def _stored(self, key: str) -> dict[str, Any] | None:
        """The record's fields as the script reads them (the JSON object of the format before
        the binary one), for tests and benchmarks that compare whole records."""
        with self.guard(key):
            reply = self._script(self._keys(key), ["get", key], read_only=True)
        return None if reply is None else dict(json.loads(reply[0]))

    def keys_in(self, state: State, *, limit: int = 1000) -> list[str]:
        """Keys of records in ``state``. UNKNOWN, CLAIMED and RECONCILING come from the
        bucket indexes; the expiring states need a SCAN of the keyspace, bounded by
        ``limit``."""
        with self.guard():
            if state in (State.UNKNOWN, State.CLAIMED, State.RECONCILING):
                index = "unknown" if state is State.UNKNOWN else "leases"
                pipe = self.client.pipeline(transaction=False)
                for bucket in range(self.buckets):
                    pipe.zrange(self.keyspace.index(bucket, index), 0, limit - 1)
                keys = [str(k) for found in pipe.execute() for k in found]
            else:
                keys = []
                for name in self.client.scan_iter(match=self.keyspace.records, count=1000):
                    keys.append(str(name).rsplit(":", 1)[1])
                    if len(keys) >= 20 * limit:
                        break
        if state is State.UNKNOWN:
            return keys[:limit]
        records = self.get_many(keys)
        return [k for k, r in records.items() if r is not None and r.state is state][:limit]

    def keys_with_prefix(self, prefix: str, *, limit: int = 100) -> list[str]:
        """Keys of records that start with ``prefix`` (at least 8 hex digits: they name the
        bucket). A SCAN of the keyspace with a pattern: for an operator's search, not for
        a hot path (seconds on millions of keys)."""
        pattern = self.keyspace.records_with_prefix(prefix)
        keys: list[str] = []
        with self.guard():
            for name in self.client.scan_iter(match=pattern, count=1000):
                keys.append(str(name).rsplit(":", 1)[1])
                if len(keys) >= limit:
                    break
        return keys

    def audit(self, **fields: str) -> str:
        """Append an operator action to the audit stream (never trimmed) and, when it names
        an effect, to that effect's own trail (read whole without scanning the stream)."""
        key = fields.get("key")
        with self.guard():
            pipe = self.client.pipeline(transaction=False)
            pipe.xadd(self.keyspace.stream("audit"), fields)  # type: ignore[arg-type]
            if key:
                pipe.xadd(self.keyspace.trail(key), fields)  # type: ignore[arg-type]
            entry = pipe.execute()[0]
        return str(entry)

    def audit_log(self, count: int = 100) -> list[dict[str, str]]:
        """The most recent audit entries, newest first."""
        return self._newest(self.keyspace.stream("audit"), count)

    def stream_page(
        self,
        stream: str,
        *,
        before: str | None = None,
        since_ms: int | None = None,
        count: int = 100,
        key: str | None = None,
    ) -> list[dict[str, str]]:
        """Entries of the ``"audit"`` or ``"deadletters"`` stream (with ``key``: that
        effect's own audit trail, whose ids are its own), newest first: those older than
        entry id ``before`` and no older than ``since_ms`` (server ms), each with its ``id``."""
        if stream not in ("audit", "deadletters"):
            raise ValueError("stream must be audit or deadletters")
        name = self.keyspace.trail(key) if key else self.keyspace.stream(stream)
        newest = f"({before}" if before else "+"
        oldest = f"{since_ms}-0" if since_ms is not None else "-"
        with self.guard():
            entries: list[tuple[str, dict[str, str]]] = self.client.xrevrange(  # type: ignore[assignment]
                name, max=newest, min=oldest, count=count
            )
        return [{"id": entry_id, **fields} for entry_id, fields in entries]

    def index_page(
        self,
        index: str,
        *,
        after: tuple[int, str] | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
        count: int = 100,
    ) -> list[tuple[str, int]]:
        """(key, score) from every bucket's ``"unknown"`` index (score: ms it became
        UNKNOWN) or ``"leases"`` index (score: lease deadline), in (score, key) order: at
        most ``count`` past ``after``, with scores in [since_ms, until_ms]. One pipelined
        round trip; the bulk re-check and ``list --cursor`` page with it."""
        if index not in ("unknown", "leases"):
            raise ValueError("index must be unknown or leases")
        low = since_ms if since_ms is not None else 0
        if after is not None:
            low = max(low, after[0])
        high: int | str = until_ms if until_ms is not None else "+inf"
        pipe = self.client.pipeline(transaction=False)
        for bucket in range(self.buckets):
            name = self.keyspace.index(bucket, index)
            if after is not None and after[0] >= low:
                # Ties on the cursor's score are read whole (same ms: few), then the rest.
                pipe.zrangebyscore(name, after[0], after[0], withscores=True)
                pipe.zrangebyscore(name, f"({after[0]}", high, start=0, num=count,
                                   withscores=True)  # fmt: skip
            else:
                pipe.zrangebyscore(name, low, high, start=0, num=count, withscores=True)
        with self.guard():
            replies = pipe.execute()
        found = sorted((int(score), str(member)) for reply in replies for member, score in reply)
        if after is not None:
            found = [e for e in found if e > after and (until_ms is None or e[0] <= until_ms)]
        return [(member, score) for score, member in found[:count]]

    def server_time_ms(self) -> int:
        with self.guard():
            seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def expired(
        self, buckets: Iterable[int] | None = None, *, limit: int = 100, now_ms: int | None = None
    ) -> list[str]:
        """Keys whose lease deadline has passed (server clock), at most ``limit`` per bucket,
        from ``buckets`` (default all) in one pipelined round trip."""
        now = self.server_time_ms() if now_ms is None else now_ms
        pipe = self.client.pipeline(transaction=False)
        for bucket in range(self.buckets) if buckets is None else buckets:
            leases = self.keyspace.index(bucket, "leases")
            pipe.zrangebyscore(leases, "-inf", now, start=0, num=limit)
        with self.guard():
            found = pipe.execute()
        return [str(key) for keys in found for key in keys]

    def members(self, group: str, member: str, *, ttl_s: float) -> list[str]:
        """Refresh ``member`` of ``group`` and return the live members (seen within ttl)."""
        with self.guard():
            live = self._members(keys=[self.keyspace.group(group)], args=[member, ms(ttl_s)])
        return [str(m) for m in live]

    def leave(self, group: str, member: str) -> None:
        with self.guard():
            self.client.zrem(self.keyspace.group(group), member)

    def campaign_counts(self, tag: str) -> dict[str, int]:
        """State → number of records of campaign ``tag``, summed over buckets (no scan)."""
        states = [s.value for s in State]
        pipe = self.client.pipeline(transaction=False)
        for bucket in range(self.buckets):
            pipe.hmget(self.keyspace.index(bucket, "campaigns"), [f"{tag}:{s}" for s in states])
        with self.guard():
            replies = pipe.execute()
        totals = dict.fromkeys(states, 0)
        for values in replies:
            for state, value in zip(states, values, strict=True):
                totals[state] += int(value or 0)
        return totals

    def counts(self) -> dict[tuple[str, str], int]:
        """(state or "fenced", tool or op) → count, summed over buckets (no keyspace scan)."""
        pipe = self.client.pipeline(transaction=False)
        for bucket in range(self.buckets):
            pipe.hgetall(self.keyspace.index(bucket, "stats"))
        with self.guard():
            replies = pipe.execute()
        totals: dict[tuple[str, str], int] = {}
        for stats in replies:
            for name, value in stats.items():
                kind, _, label = name.partition(":")
                totals[(kind, label)] = totals.get((kind, label), 0) + int(value)
        return totals
