"""What operators, metrics and the reconciler read of a ledger: records, the bucket
indexes, pending markers, the audit and dead-letter streams (and their two writes),
counts, the server's clock, and the reconciler group's membership. Part of ``Ledger``
(``dedupe/ledger.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import cached_property
from typing import Any

from redis.commands.core import Script

from .connection import Connection, ms
from .keys import effect_key_of
from .records import EffectRecord, PendingMarker, State
from .states import CLAIMABLE, INDEXED

__all__ = ["Reads"]

# Group membership on the server's clock: refresh one member, drop the silent, list the rest.
_MEMBERS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""


class Reads(Connection):
    """The reads of a ledger, and the streams beside its records."""

    @cached_property
    def _members(self) -> Script:
        return self.client.register_script(_MEMBERS)

    # -- markers ----------------------------------------------------------------------

    def lease_indexes(self) -> list[str]:
        """Every bucket's lease index (a sorted set of keys by lease deadline, in ms), for
        readers that watch the backlog without a script (the metrics' scrape)."""
        return [self.keyspace.index(bucket, "leases") for bucket in range(self.buckets)]

    def has_pending(self, key: str) -> bool:
        """A pending marker stands for a message that may still run ``key``."""
        with self.guard(key):
            return self.client.get(self._pending_key(key)) is not None

    def markers(self, *, limit: int = 100) -> list[PendingMarker]:
        """Keys that hold a pending marker and no record a worker holds (none, FAILED,
        REVOKED, SUPERSEDED): the effects only a broker message stands for, which no other
        list shows. A SCAN of the keyspace: an operator's view, not a hot path."""
        found: dict[str, None] = {}  # SCAN may return a key twice
        with self.guard():
            for name in self.client.scan_iter(match=self.keyspace.markers, count=1000):
                found[str(name).rsplit(":", 1)[1]] = None
                if len(found) >= 20 * limit:
                    break
            pipe = self.client.pipeline(transaction=False)
            for key in found:
                pipe.get(self._pending_key(key))
                pipe.pttl(self._pending_key(key))
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
            if state in INDEXED:
                index = "unknown" if state is State.UNKNOWN else "leases"
                pipe = self.client.pipeline(transaction=False)
                for bucket in range(self.buckets):
                    pipe.zrange(self.keyspace.index(bucket, index), 0, limit - 1)
                keys = [str(k) for found in pipe.execute() for k in found]
            else:
                keys = []
                for name in self.client.scan_iter(match=self.keyspace.records, count=1000):
                    keys.append(effect_key_of(str(name).rsplit(":", 1)[1]))
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
        keys: list[str] = []
        with self.guard():
            # Both spellings (dedupe/keys.py): a record moves to its ledger's on a write.
            for pattern in self.keyspace.records_with_prefix(prefix):
                for name in self.client.scan_iter(match=pattern, count=1000):
                    key = effect_key_of(str(name).rsplit(":", 1)[1])
                    if key.startswith(prefix) and key not in keys:
                        keys.append(key)
                        if len(keys) >= limit:
                            return keys
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
