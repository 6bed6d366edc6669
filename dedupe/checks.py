"""What a process checks of its ledger Redis before it trusts it: the layout (namespace
and bucket count) against the version record, and the persistence that keeps a claim.
Part of ``Ledger`` (``dedupe/ledger.py``); the key names are ``dedupe/keys.py``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import redis

from .client import REDIS_ERRORS
from .connection import Connection
from .errors import (
    LayoutChangedError,
    LedgerAuthError,
    LedgerError,
    LedgerUnavailableError,
    VolatileLedgerError,
)
from .keys import FOREIGN_PATTERNS, SCHEMA_KEY, SCHEMA_NAMES, SCHEMA_NAMESPACE, schema_field

__all__ = ["LEDGER_FORMAT", "SHORT_NAMES_FORMAT", "Checks"]

#: The newest layout and record format this release writes and reads (the version record's
#: ``format``); a ledger written by a newer release is refused.
LEDGER_FORMAT = 2
#: The format of a ledger that holds a namespace with short record names (``dedupe/keys.py``):
#: releases before it read hex names only, so they must refuse such a ledger at start.
SHORT_NAMES_FORMAT = 2


class Checks(Connection):
    """The layout, version and durability checks of a ledger."""

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
            names = schema.get(SCHEMA_NAMES + self.namespace)
            if stored is None:
                stored = self._legacy_layout()
            if stored is None:
                # Its own records, from before any layout key, are hex-named: releases
                # before this one may still run on them (a rolling upgrade).
                owned = self._owns_keys()
                if not owned and self._foreign_keys(schema):
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
                # Laid out by this release: its records get short names.
                self._register(str(self.buckets), short=not owned, known=known)
                stored, names = str(self.buckets), None if owned else "short"
            elif schema_field(self.namespace) not in schema:
                self._register(stored)
        self._same_buckets(stored)
        # Write records under the spelling the version record names for this namespace
        # (short when this release laid it out; hex for one laid out before). Reads find
        # either, so a ledger that never asked (tests, embedding code) misreads nothing.
        self.keyspace = replace(self.keyspace, short=names == "short")

    def _adopt(self) -> int:
        """``Ledger.adopt_namespace``'s write: this namespace's bucket count in the version
        record, refused for a namespace laid out in another bucket count; the ledger's
        format. Hex-named (the ledger's other namespaces may run the previous release, which
        a short-named namespace would make refuse it)."""
        with self.guard():
            stored = self.client.hget(SCHEMA_KEY, schema_field(self.namespace))
            stored = stored if stored is not None else self._legacy_layout()
            if stored is not None:
                self._same_buckets(stored)
            self._register(str(self.buckets))
            return int(self.client.hget(SCHEMA_KEY, "format") or 1)

    def _same_buckets(self, stored: str | bytes) -> None:
        """Refuse a namespace laid out in ``stored`` buckets, not this ledger's."""
        if int(stored) != self.buckets:
            raise LayoutChangedError(
                f"namespace {self.namespace!r} was laid out in {int(stored)} buckets, not "
                f"{self.buckets}: a changed bucket count moves every key. Restore it."
            )

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

    def _register(self, buckets: str, *, short: bool = False, known: int = 0) -> None:
        pipe = self.client.pipeline(transaction=False)
        if short:
            # A release that reads hex names only must refuse this ledger from now on.
            if known < SHORT_NAMES_FORMAT:
                pipe.hset(SCHEMA_KEY, "format", SHORT_NAMES_FORMAT)
            pipe.hsetnx(SCHEMA_KEY, SCHEMA_NAMES + self.namespace, "short")
        else:
            pipe.hsetnx(SCHEMA_KEY, "format", 1)
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
                    # Each master by itself, as check_durability reads them.
                    replies = [
                        self.client.config_get("appendfsync", target_nodes=node)
                        for node in self.client.get_primaries()  # type: ignore[no-untyped-call]
                    ]
                else:
                    replies = [self.client.config_get("appendfsync")]
                values = [str(reply.get("appendfsync")) for reply in replies]
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
