"""The claim ledger on Redis: ``Ledger``, the one object the rest of effectq holds.

Every transition is one call of ``ledger.lua`` (one round trip, atomic, server time). A
ledger is safe to share across threads (redis-py pools connections) and across ``fork``
(redis-py resets its pool in a child). Its rooms, each below this one:

    dedupe/keys.py          every key name and SCAN pattern, spelled once
    dedupe/client.py        the client from a URL (seeds, cluster detection, UTF-8
                            replies); Redis errors read as LedgerErrors (``ledger_error``)
    dedupe/connection.py    ``Connection``: the client, key names and script; ``guard``,
                            one script call with its retry rule and WAIT, batches
    dedupe/transitions.py   every write of the state machine (submit ... recheck)
    dedupe/reads.py         records, indexes, markers, streams, counts, groups
    dedupe/checks.py        the layout and version check, durability

The three parts are mixins over one ``Connection`` rather than objects this class forwards
to: the public surface stays the one object and the methods it always had, with no second
copy of forty signatures to keep in step, and each part imports only the connection layer,
never another part. They meet here (``adopt_namespace``: the check's write, then the audit).
"""

from __future__ import annotations

import inspect
from typing import Any

import redis

from .checks import LEDGER_FORMAT, Checks
from .client import client_from_url, ledger_error
from .connection import Confirming, Submitting
from .errors import LedgerConfigError
from .keys import SCHEMA_KEY
from .reads import Reads
from .transitions import MAX_TEXT_BYTES, Transitions

__all__ = [
    "DEFAULT_BUCKETS",
    "LEDGER_FORMAT",
    "SCHEMA_KEY",
    "Confirming",
    "Ledger",
    "Submitting",
    "ledger_error",
]

DEFAULT_BUCKETS = 256
# A namespace prefixes every key the ledger writes: bounded (it may come from a command line).
MAX_NAMESPACE = 64


class Ledger(Transitions, Reads, Checks):
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
    short_names:
        write records under short names and settled ones in the tight form
        (``dedupe/keys.py``); ``check_layout`` sets it from the version record. Either way
        records written under the other spelling are found. Not on a namespace an earlier
        release still runs on: it reads hex names only.
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
        short_names: bool = False,
    ) -> None:
        if not 1 <= buckets <= 16384:
            raise LedgerConfigError("buckets must be between 1 and 16384")
        bounds = (max_request_bytes, max_receipt_bytes, max_raw_bytes)
        if max(bounds) > MAX_TEXT_BYTES or min(bounds) < 1:
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
        bad = any(c in namespace for c in "{}: \t\n*?[]\\")
        if not 1 <= len(namespace) <= MAX_NAMESPACE or bad:
            raise LedgerConfigError(
                f"namespace must be 1 to {MAX_NAMESPACE} characters, without braces, colons, "
                "spaces or glob characters (* ? [ ] \\)"
            )
        super().__init__(
            client,
            namespace=namespace,
            buckets=buckets,
            wait_replicas=wait_replicas,
            wait_timeout_ms=wait_timeout_ms,
            short_names=short_names,
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

    def adopt_namespace(self, *, actor: str, reason: str) -> dict[str, Any]:
        """Register this namespace in the ledger's version record on an operator's word
        (``effectq ledger adopt``): the one way a namespace that owns nothing is accepted on
        a ledger written before versions existed. Audited; refused for a namespace laid out
        in another bucket count."""
        known = self._adopt()
        result = f"namespace {self.namespace} adopted, {self.buckets} buckets"
        self.audit(action="ledger_adopt", actor=actor, reason=reason, result=result)
        return {"namespace": self.namespace, "buckets": self.buckets, "format": known}
