"""Calls on the ledger's Redis: one script call with its retry rule and WAIT, batches,
plain commands, and the Redis errors they meet read as LedgerErrors (``guard``).

``Connection`` is the base of each of ``Ledger``'s parts (``dedupe/transitions.py``,
``dedupe/reads.py``, ``dedupe/checks.py``): it holds the client, the key names
(``dedupe/keys.py``) and the script.

On a Redis Cluster every call stays in one slot: all keys of a call share the bucket's hash
tag ``{namespace:bucket}``. redis-py's cluster pipeline refuses scripts, so batched script
calls go through one ordinary pipeline per master (a slot that moved meanwhile is retried
through the cluster client, which follows the redirect).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .client import REDIS_ERRORS, TOPOLOGY, check_reads_utf8, did_not_run, ledger_error, misdetected
from .errors import LedgerUnavailableError
from .keys import KeySpace
from .records import Submission
from .script import LedgerScript, Many, first_error

__all__ = ["Confirming", "Connection", "Submitting", "ms"]

# Ops sent once more after a lost reply (a timeout, a dropped connection; on a cluster
# after the slot map is re-read): a repeat is harmless even if the first try ran
# (heartbeat extends the lease again; commit, fail and handover under the same token answer
# ok again). Not claim (a repeat answers in_flight against our own claim: the effect waits
# for the lease and the reconciler), takeover (a repeat answers "lease live" and the token
# is lost), unknown (a repeat counts as a fenced write), operate and recheck (a repeat is
# refused): those go again only when the first certainly did not run (did_not_run).
# Submit batches have their own loop (_script_batch). The client never resends itself
# (Connection.__init__).
_REPEATABLE = frozenset({"heartbeat", "commit", "fail", "handover"})
# How long a batch of submits keeps re-sending through a failover (node timeout, election,
# promotion: seconds on a healthy cluster).
_FAILOVER_S = 30.0


def ms(seconds: float) -> int:
    """A duration as the script takes it: whole milliseconds, at least 1."""
    return max(1, int(seconds * 1000))


class Submitting:
    """A submit batch ``Ledger.start_submit`` sent: its answers, read once."""

    def __init__(self, ledger: Connection, keys: list[str], replies: list[Any] | Many) -> None:
        self._ledger, self._keys, self._replies = ledger, keys, replies

    def answers(self) -> list[Submission]:
        replies = self._replies
        if isinstance(replies, Many):
            with self._ledger.guard(reread=True):
                try:
                    replies = first_error(replies.replies())
                except redis.exceptions.MovedError:
                    raise misdetected() from None
        return [
            Submission.from_reply(key, list(reply))
            for key, reply in zip(self._keys, replies, strict=True)
        ]

    def abandon(self) -> None:
        if isinstance(self._replies, Many):
            self._replies.abandon()


class Confirming:
    """A confirm batch ``Ledger.start_confirm`` sent: ``wait`` reads it once."""

    def __init__(self, ledger: Connection, replies: Many | None) -> None:
        self._ledger, self._replies = ledger, replies

    def wait(self) -> None:
        """Raises LedgerUnavailableError (as ``confirm_pending``) if the server failed."""
        replies, self._replies = self._replies, None
        if replies is not None:
            with self._ledger.guard(reread=True):
                try:
                    first_error(replies.replies())
                except redis.exceptions.MovedError:
                    raise misdetected() from None

    def abandon(self) -> None:
        replies, self._replies = self._replies, None
        if replies is not None:
            replies.abandon()


class Connection:
    """The client, the key names and the script of one ledger, and the calls on them."""

    def __init__(
        self,
        client: redis.Redis | redis.RedisCluster,
        *,
        namespace: str,
        buckets: int,
        wait_replicas: int,
        wait_timeout_ms: int,
        short_names: bool = False,
    ) -> None:
        check_reads_utf8(client.get_connection_kwargs())
        # The ledger decides what is sent again after a lost reply (_REPEATABLE), so the
        # client must not: redis-py's constructor and its cluster client resend a command
        # that timed out, which for a claim answers in_flight against its own claim.
        client.set_retry(Retry(NoBackoff(), 0))
        self.client = client
        self.namespace = namespace
        self.buckets = buckets
        self.keyspace = KeySpace(namespace, buckets, short_names)
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        # EVALSHA reloads on NOSCRIPT, so a Redis restart or failover (which empties the
        # script cache) costs one extra round trip, not an error. Functions: script.py.
        self._script = LedgerScript(client, functions=not self.cluster)

    @property
    def cluster(self) -> bool:
        """The ledger runs on a Redis Cluster."""
        return isinstance(self.client, redis.RedisCluster)

    # -- keys -------------------------------------------------------------------------

    def bucket_of(self, key: str) -> int:
        return self.keyspace.bucket_of(key)

    def _keys(self, key: str) -> list[str]:
        return self.keyspace.script_keys(key)

    def _pending_key(self, key: str) -> str:
        """``_keys(key)[3]`` alone (the producer's marker calls need no other)."""
        return self.keyspace.pending(key)

    # -- calls ------------------------------------------------------------------------

    @contextlib.contextmanager
    def guard(self, key: str | None = None, *, reread: bool = False) -> Iterator[None]:
        """Run Redis calls; a Redis error leaves as the LedgerError ``ledger_error`` names.
        ``reread``: a failover or moved slot re-reads the cluster's slot map (calls that go
        through node pipelines, which the cluster client does not watch)."""
        try:
            yield
        except REDIS_ERRORS as exc:
            if reread and isinstance(exc, (redis.ConnectionError, redis.TimeoutError, *TOPOLOGY)):
                self._reread_slots()
            raise ledger_error(exc, key=key) from None

    def _call(self, op: str, key: str, *args: Any, repeat: bool = True) -> list[Any]:
        argv = [op, key, *args]
        try:
            try:  # ``guard(key, reread=True)``, without a generator per call
                return self._send(op, key, argv)
            except REDIS_ERRORS as exc:
                if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, *TOPOLOGY)):
                    self._reread_slots()
                raise ledger_error(exc, key=key) from None
        except LedgerUnavailableError as exc:
            # Once more (on the fresh slot map) where that cannot run it twice: the first
            # did not run, or running it again is harmless (_REPEATABLE).
            cause = exc.__context__
            lost = isinstance(cause, (redis.ConnectionError, redis.TimeoutError))
            if repeat and (did_not_run(cause) or (lost and op in _REPEATABLE)):
                return self._call(op, key, *args, repeat=False)
            raise

    def _send(self, op: str, key: str, argv: list[Any]) -> list[Any]:
        if not self.wait_replicas:
            try:
                reply = self._script(self._keys(key), argv)
            except redis.exceptions.MovedError:
                # A plain client on a cluster node: a misconfiguration, not bad input.
                if self.cluster:
                    raise
                raise misdetected() from None
        else:
            # WAIT counts the replicas that acknowledged *this connection's* writes: the
            # script and WAIT share one pipeline to the key's master.
            def run() -> list[Any]:
                pipe = self._node_pipeline(key)
                self._script.queue(pipe, self._keys(key), argv)
                pipe.execute_command(  # type: ignore[no-untyped-call]
                    "WAIT", self.wait_replicas, self.wait_timeout_ms
                )
                return list(pipe.execute())

            reply, acked = self._script.again_if_lost(run)
            # Every write a failover could lose and that something acts on: a claim (its
            # holder executes), a commit or fail (a duplicate is answered, a floor raised),
            # a takeover, an operator's transition. Not acknowledged: "unavailable", and the
            # caller retries (each of these is safe to repeat or leaves the record held).
            if (
                int(acked) < self.wait_replicas
                and reply[0] in ("acquired", "ok")
                and op in ("claim", "commit", "fail", "takeover", "operate", "unknown")
            ):
                raise LedgerUnavailableError(
                    f"{op} acknowledged by {acked} of {self.wait_replicas} replicas", key=key
                )
        return list(reply)

    def _node_pipeline(self, key: str) -> redis.client.Pipeline:
        """A pipeline on one connection to the server holding ``key``."""
        if isinstance(self.client, redis.RedisCluster):
            return self._node_client(key).pipeline(transaction=False)
        return self.client.pipeline(transaction=False)

    def _node_client(self, key: str) -> redis.Redis:
        """The cluster master serving ``key``'s bucket, as the client's slot map says."""
        assert isinstance(self.client, redis.RedisCluster)
        node = self.client.get_node_from_key(self._keys(key)[0])  # type: ignore[no-untyped-call]
        return self.client.get_redis_connection(node)

    def _reread_slots(self) -> None:
        """A master failed or a slot moved under a node pipeline, which the cluster client
        does not see: re-read the slot map so the next call finds the new master."""
        if isinstance(self.client, redis.RedisCluster):
            # No reachable node, or slots not covered yet mid-failover: keep the old map.
            with contextlib.suppress(redis.RedisError, redis.exceptions.RedisClusterException):
                self.client.nodes_manager.initialize()

    def _script_batch(
        self, calls: list[tuple[str, list[Any]]], *, read_only: bool = False
    ) -> list[Any]:
        """The script for each (effect key, argv), pipelined: one round trip per server.

        Only for calls that are safe to repeat (``submit``: a repeat of one message id
        answers as the first did; ``confirm``). On a cluster, the calls that met a
        failover — a master that does not answer, CLUSTERDOWN while the cluster promotes
        its replica, a slot that moved — go again after the slot map is re-read, backing
        off, for up to ``_FAILOVER_S``: the node pipelines bypass the cluster client, which
        would do that for a single call."""
        if not isinstance(self.client, redis.RedisCluster):
            try:
                if len(calls) == 1:
                    [(key, argv)] = calls
                    return [self._script(self._keys(key), argv, read_only=read_only)]
                keyed = [(self._keys(key), argv) for key, argv in calls]
                return first_error(self._script.many(keyed, read_only=read_only))
            except redis.exceptions.MovedError:
                raise misdetected() from None
        replies: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        deadline = time.monotonic() + _FAILOVER_S
        pause = 0.05
        while True:
            again, failure = self._script_round(calls, todo, replies, read_only)
            if not again:
                return replies
            self._reread_slots()
            if time.monotonic() + pause > deadline:
                raise failure
            time.sleep(pause)
            pause = min(pause * 2, 1.0)
            todo = again

    def _script_round(
        self,
        calls: list[tuple[str, list[Any]]],
        todo: list[int],
        replies: list[Any],
        read_only: bool,
    ) -> tuple[list[int], Exception]:
        """One pipeline per master for the calls ``todo``; fills ``replies``. Returns the
        calls to send again (their master failed or moved) and the last such error."""
        groups: dict[int, tuple[redis.Redis, list[int]]] = {}
        try:
            for i in todo:
                node = self._node_client(calls[i][0])
                groups.setdefault(id(node), (node, []))[1].append(i)
        except redis.exceptions.RedisClusterException as exc:
            return todo, exc  # a slot without a master in the client's map
        again: list[int] = []
        failure: Exception = LedgerUnavailableError("no failure")
        for node, indexes in groups.values():
            pipe = node.pipeline(transaction=False)
            for i in indexes:
                key, argv = calls[i]
                self._script.queue(pipe, self._keys(key), argv, read_only=read_only)
            try:
                results = pipe.execute(raise_on_error=False)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                again.extend(indexes)  # which of them ran is unknown: all go again
                failure = exc
                continue
            for i, reply in zip(indexes, results, strict=True):
                if isinstance(reply, redis.exceptions.AskError) and not isinstance(
                    reply, redis.exceptions.MovedError
                ):
                    # A slot being migrated: the cluster client follows the ASK redirect.
                    key, argv = calls[i]
                    reply = self._script(self._keys(key), argv, read_only=read_only)
                elif isinstance(reply, (*TOPOLOGY, redis.ConnectionError, redis.TimeoutError)):
                    again.append(i)
                    failure = reply
                    continue
                elif isinstance(reply, Exception):
                    raise reply
                replies[i] = reply
        return again, failure

    def commands(self, commands: list[list[Any]]) -> list[Any]:
        """Plain commands in one round trip, their replies in order; the first error reply
        raised. On one server they go on this thread's connection, written at once
        (``dedupe.script.pipelined``: a third of a redis-py pipeline's client CPU per
        command); on a cluster through its pipeline, which routes each to its slot. The
        caller holds ``guard``."""
        if isinstance(self.client, redis.RedisCluster):
            pipe = self.client.pipeline(transaction=False)  # type: ignore[no-untyped-call]
            for command in commands:
                pipe.execute_command(*command)
            return list(pipe.execute())
        return self._script.commands(commands)
