"""How the ledger names Redis's error replies (issue 15, item 2): a server that cannot
write now is "ledger unavailable" (the message stays alive), never a script error (bad
input). The replies are parsed by redis-py's own parser, as they arrive from a server."""

from __future__ import annotations

import pytest
import redis
from redis._parsers.base import BaseParser

from dedupe import LedgerAuthError, LedgerError, LedgerUnavailableError
from dedupe.ledger import ledger_error

# Redis 7 passes a script's error reply through; Redis 6.2 wraps it in its own text.
WRAPPED = "Error running script (call to f_0a1b): @user_script:1: @user_script: 1: -"

CANNOT_WRITE_NOW = [
    "OOM command not allowed when used memory > 'maxmemory'.",
    "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist "
    "to disk. Commands that may modify the data set are disabled.",
    "NOREPLICAS Not enough good replicas to write.",
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
    "LOADING Redis is loading the dataset in memory",
    "READONLY You can't write against a read only replica.",
    "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
    "CLUSTERDOWN The cluster is down",
    "TRYAGAIN Multiple keys request during rehashing of slot",
    "NOSCRIPT No matching script. Please use EVAL.",
    WRAPPED + "OOM command not allowed when used memory > 'maxmemory'.",
    WRAPPED + "MISCONF Errors writing to the AOF file: No space left on device",
    WRAPPED + "NOREPLICAS Not enough good replicas to write.",
]


@pytest.mark.parametrize("reply", CANNOT_WRITE_NOW, ids=lambda r: r.split(" ")[0][:12])
def test_a_server_that_cannot_write_now_is_unavailable(reply: str) -> None:
    error = ledger_error(BaseParser.parse_error(reply), key="k" * 64)
    assert type(error) is LedgerUnavailableError
    code = reply.removeprefix(WRAPPED).split(" ")[0]
    assert code in error.message and error.key == "k" * 64


@pytest.mark.parametrize(
    "reply",
    [
        "ERR user_script:42: Script attempted to access nonexistent global variable 'x'",
        "WRONGTYPE Operation against a key holding the wrong kind of value",
        "ERR unknown ledger op frobnicate",
        "BUSYKEY Target key name already exists.",
        "NOPERM this user has no permissions to access one of the keys used as arguments",
    ],
)
def test_any_other_error_reply_is_a_ledger_error(reply: str) -> None:
    error = ledger_error(BaseParser.parse_error(reply))
    assert type(error) is LedgerError


@pytest.mark.parametrize(
    "exc",
    [
        redis.ConnectionError("Connection refused"),
        redis.TimeoutError("Timeout reading from socket"),
        redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
        redis.exceptions.ClusterError("TTL exhausted."),
        redis.exceptions.RedisClusterException("No node for slot"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_unreachable_server_is_unavailable(exc: Exception) -> None:
    assert type(ledger_error(exc)) is LedgerUnavailableError  # type: ignore[arg-type]


def test_refused_credentials_are_an_auth_error() -> None:
    error = ledger_error(BaseParser.parse_error("WRONGPASS invalid username-password pair"))
    assert type(error) is LedgerAuthError and "refused the credentials" in error.message
