"""The ledger's Redis client: built from a URL, and its errors read as LedgerErrors.

``client_from_url`` turns one URL, or several seed URLs of one Redis Cluster, into
redis-py's client (asking the seeds whether they are cluster nodes when not told);
``check_reads_utf8`` refuses options that would not read the script's replies as text;
``ledger_error`` names what a caller may do about a Redis error. Calls on the client, their
retry rule and WAIT: ``dedupe/connection.py``.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Mapping
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode
from redis.connection import parse_url
from redis.retry import Retry

from .errors import LedgerAuthError, LedgerConfigError, LedgerError, LedgerUnavailableError

__all__ = [
    "REDIS_ERRORS",
    "TOPOLOGY",
    "check_reads_utf8",
    "client_from_url",
    "did_not_run",
    "ledger_error",
    "misdetected",
]

# Failover and resharding answers: the call did not run; the next one can.
TOPOLOGY = (
    redis.exceptions.ClusterError,  # CLUSTERDOWN, MASTERDOWN
    redis.exceptions.AskError,  # ASK, MOVED
    redis.exceptions.TryAgainError,
    redis.exceptions.ReadOnlyError,  # a demoted master
    redis.exceptions.RedisClusterException,  # no node for the slot in the client's map
)
# Error replies that mean "this server cannot write now" (memory full under noeviction,
# persistence failing, too few replicas, a script running, loading, a replica, a cluster
# reconfiguring, a script cache that will not reload): the call did not run and a later one
# can, so the message stays alive. Redis 6.2 wraps a script's error as "… -CODE text".
_CANNOT_WRITE = (
    "OOM", "MISCONF", "NOREPLICAS", "BUSY", "LOADING", "READONLY", "MASTERDOWN",
    "CLUSTERDOWN", "TRYAGAIN", "NOSCRIPT",
)  # fmt: skip
_CANNOT_WRITE_REPLY = re.compile(r"(?:^|: -)(" + "|".join(_CANNOT_WRITE) + r")\b")
# redis-py strips the code from the replies it has a class for.
_CODE_OF: dict[type[Exception], str] = {
    redis.exceptions.OutOfMemoryError: "OOM",
    redis.exceptions.BusyLoadingError: "LOADING",
    redis.exceptions.ReadOnlyError: "READONLY",
    redis.exceptions.MasterDownError: "MASTERDOWN",
    redis.exceptions.ClusterDownError: "CLUSTERDOWN",
    redis.exceptions.TryAgainError: "TRYAGAIN",
    redis.exceptions.NoScriptError: "NOSCRIPT",
}
REDIS_ERRORS = (redis.RedisError, redis.exceptions.RedisClusterException)


def did_not_run(exc: BaseException | None) -> bool:
    """The call never reached a server that could run it: refused before running (a
    failover, a moved slot, a demoted master), or its connection never opened — redis-py
    words only a connect failure "connecting to" (``format_error_message``), and a lost
    reply never so."""
    if isinstance(exc, TOPOLOGY):
        return True
    return isinstance(exc, (redis.ConnectionError, redis.TimeoutError)) and (
        "connecting to" in str(exc)
    )


def ledger_error(exc: Exception, *, key: str | None = None) -> LedgerError:
    """The LedgerError for a Redis error: what the caller may do about it.

    LedgerUnavailableError (try again later: the message stays alive) for an unreachable
    server and for every reply that means "cannot write now"; LedgerAuthError for refused
    credentials; LedgerError for any other error reply (a script or configuration fault).
    """
    if isinstance(exc, redis.AuthenticationError):
        return LedgerAuthError(f"ledger Redis refused the credentials: {exc}", key=key)
    code = next((_CODE_OF[c] for c in type(exc).__mro__ if c in _CODE_OF), None)
    if code is None and isinstance(exc, redis.ResponseError):
        found = _CANNOT_WRITE_REPLY.search(str(exc))
        code = found.group(1) if found else None
    if code is not None:
        return LedgerUnavailableError(f"ledger Redis cannot write now ({code}): {exc}", key=key)
    if isinstance(exc, redis.ResponseError) and not isinstance(exc, redis.exceptions.AskError):
        return LedgerError(f"ledger Redis refused the call: {exc}", key=key)
    return LedgerUnavailableError(f"ledger Redis unavailable: {exc}", key=key)


def _url_options(url: str) -> dict[str, Any]:
    """redis-py's reading of one URL (host, port, credentials, db, TLS options…)."""
    options: dict[str, Any] = parse_url(url)  # type: ignore[no-untyped-call]
    return options


def _seeds(url: str) -> list[str]:
    """The comma-separated URLs of ``url``, checked to differ in host and port only (one
    scheme, credentials, database and options: the cluster client takes them from one).
    Errors name the position, never the URL (it may hold a password)."""
    seeds = [part.strip() for part in url.split(",") if part.strip()]
    if not seeds:
        raise LedgerError("the ledger URL is empty")
    shared = []
    for n, seed in enumerate(seeds, start=1):
        try:
            options = _url_options(seed)
        except ValueError:
            raise LedgerError(
                f"ledger URL {n} of {len(seeds)} is not a redis:// or rediss:// URL"
            ) from None
        options.pop("host", None)
        options.pop("port", None)
        shared.append(options)
    if any(options != shared[0] for options in shared[1:]):
        raise LedgerError(
            "the ledger's seed URLs differ in more than host and port: list nodes of one "
            "cluster with one scheme, credentials, database and options"
        )
    return seeds


def _is_cluster(seeds: list[str], client_options: dict[str, Any]) -> bool:
    """Ask the seeds in turn whether they are cluster nodes; the first answer decides."""
    # One attempt and one reconnect per seed: the next seed is the retry.
    probe_options = {**client_options, "retry": Retry(NoBackoff(), 1)}
    errors: list[str] = []
    for seed in seeds:
        probe = redis.Redis.from_url(seed, **probe_options)
        try:
            return int(probe.info("cluster").get("cluster_enabled", 0)) == 1
        except redis.AuthenticationError as exc:
            raise LedgerAuthError(f"ledger Redis refused the credentials: {exc}") from None
        except redis.RedisError as exc:
            errors.append(str(exc))
        finally:
            probe.close()
    raise LedgerUnavailableError(
        f"ledger Redis unreachable: no seed node of the ledger URL answered INFO cluster "
        f"({len(seeds)} tried; last: {errors[-1]}), so it cannot tell a Redis Cluster "
        "from a single Redis"
    )


def _cluster_client(seeds: list[str], client_options: dict[str, Any]) -> redis.RedisCluster:
    """redis-py's cluster client bootstrapped from every seed (options from the first)."""
    if int(_url_options(seeds[0]).get("db", 0)) != 0:
        raise LedgerError("a Redis Cluster has only database 0: the ledger URL names another")
    others = [_url_options(seed) for seed in seeds[1:]]
    startup = [
        ClusterNode(o.get("host", "localhost"), o.get("port", 6379))  # type: ignore[no-untyped-call]
        for o in others
    ]
    try:
        return redis.RedisCluster(url=seeds[0], startup_nodes=startup, **client_options)
    except redis.AuthenticationError as exc:
        raise LedgerAuthError(f"ledger Redis refused the credentials: {exc}") from None
    except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
        raise LedgerUnavailableError(f"no seed node of the ledger URL answered: {exc}") from None


def misdetected() -> LedgerUnavailableError:
    return LedgerUnavailableError(
        "the ledger Redis answered MOVED: it is a Redis Cluster node, but this ledger was "
        "built with a plain client. List the cluster's nodes in the ledger URL (cluster "
        "detection asks them) or pass cluster=True."
    )


def check_reads_utf8(options: Mapping[str, Any]) -> None:
    """Refuse client ``options`` (redis-py's connection keyword arguments) that would not
    read the script's replies as the UTF-8 text they are.
    Without decoding, a claim granted on the server fails to parse here (and its retry meets
    its own claim); another codec or error handler alters a non-ASCII receipt or request
    on its way back. ``decode_responses`` is taken as redis-py takes it (a URL's
    ``?decode_responses=False`` is a non-empty string: it decodes). The message names the
    options, never their values (they may come from a URL)."""
    encoding = options.get("encoding") or "utf-8"
    try:
        codec = codecs.lookup(encoding).name if isinstance(encoding, str) else None
    except LookupError:
        codec = None
    if (
        not options.get("decode_responses")
        or codec != "utf-8"
        or options.get("encoding_errors", "strict") != "strict"
    ):
        raise LedgerConfigError(
            "the ledger's Redis client must decode replies as UTF-8: decode_responses=True, "
            "encoding utf-8, encoding_errors strict (check the client's options or the "
            "ledger URL's query)"
        )


def client_from_url(
    url: str, *, cluster: bool | None, options: dict[str, Any]
) -> redis.Redis | redis.RedisCluster:
    """redis-py's client for ``url`` (``Ledger.from_url`` says what it takes) with
    ``options``, redis-py's keyword arguments."""
    seeds = _seeds(url)
    # Before any call (INFO cluster is read through the same options); redis-py lets a
    # URL's query override the keyword arguments.
    check_reads_utf8({**options, **_url_options(seeds[0])})
    if cluster is None:
        cluster = _is_cluster(seeds, options)
    if cluster:
        return _cluster_client(seeds, options)
    if len(seeds) > 1:
        raise LedgerError(
            "the ledger URL lists several nodes, but a plain Redis takes one URL (several "
            "are seed nodes of a Redis Cluster, and this one is not a Redis Cluster node)"
        )
    return redis.Redis.from_url(seeds[0], **options)
