"""The ledger as a Redis Function (``dedupe.script``): used where the server takes one,
loaded again when the server lost it, and EVALSHA where Functions are missing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dedupe import ClaimOutcome, Ledger, LedgerUnavailableError, State
from dedupe.script import LIBRARY, READER
from tests.support.ledgers import RETENTION_S, charge
from workers.dev.redis_server import RedisServer, find_redis_binaries


def _major(server: RedisServer) -> int:
    return int(server.version.split(".", 1)[0])


@pytest.fixture
def redis7(tmp_path: Path) -> Iterator[RedisServer]:
    """The system redis-server (CI installs Redis 7): the one with Functions."""
    binary = find_redis_binaries().get("system")
    assert binary is not None, "these tests need a Redis 7 binary"
    with RedisServer(binary, tmp_path / "redis", aof=True) as server:
        assert _major(server) >= 7, "these tests need a Redis 7 binary"
        yield server


def _ledger(server: RedisServer) -> Ledger:
    return Ledger.from_url(server.url, namespace=f"fn{uuid.uuid4().hex[:8]}")


def _pairs(flat: list[Any]) -> dict[str, Any]:
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _libraries(server: RedisServer) -> dict[str, list[str]]:
    """FUNCTION LIST as {library: [function names]} (RESP2 answers flat pairs)."""
    out: dict[str, list[str]] = {}
    for entry in server.client(decode_responses=True).function_list():
        lib = _pairs(entry)
        out[lib["library_name"]] = sorted(_pairs(fn)["name"] for fn in lib["functions"])
    return out


def _calls(server: RedisServer) -> dict[str, int]:
    stats = server.client().info("commandstats")
    return {
        name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
        for name in ("fcall", "fcall_ro", "evalsha", "eval")
    }


def test_each_binary_runs_the_ledger_the_way_it_can(redis_server: RedisServer) -> None:
    # Redis 7: FCALL (writes) and FCALL_RO (reads); Redis 6.2 (the embedded binary): EVALSHA.
    ledger = _ledger(redis_server)
    effect = charge()
    claim = ledger.claim(effect, lease_s=30, holder="w/1")
    assert ledger.commit(effect.key, claim.token, {"id": "ch_1"}, retention_s=RETENTION_S).ok
    record = ledger.get(effect.key)
    assert record is not None and record.state is State.DONE
    calls = _calls(redis_server)
    if _major(redis_server) >= 7:
        assert calls["fcall"] == 2 and calls["fcall_ro"] == 1 and calls["evalsha"] == 0
        assert _libraries(redis_server) == {LIBRARY: sorted([LIBRARY, READER])}
    else:
        assert calls["fcall"] == 0 and calls["evalsha"] >= 3


def test_a_library_the_server_lost_is_loaded_again_and_each_call_runs_once(
    redis7: RedisServer,
) -> None:
    ledger = _ledger(redis7)
    admin = redis7.client()
    effect = charge()
    claim = ledger.claim(effect, lease_s=30, holder="w/1")
    assert claim.outcome is ClaimOutcome.ACQUIRED
    admin.function_flush()  # an operator's FUNCTION FLUSH, or a restart without persistence
    assert ledger.commit(effect.key, claim.token, {"id": "ch_1"}, retention_s=RETENTION_S).ok
    admin.function_flush()
    assert ledger.get(effect.key) is not None  # the read-only function, loaded again
    admin.function_flush()
    other = charge()
    [answer] = ledger.submit_many([(other, "m-1")], pending_s=60)  # a pipeline goes again
    assert answer.status.value == "enqueue"
    record = ledger.get(effect.key)
    assert record is not None and record.state is State.DONE and record.attempts == 1
    assert [step.state for step in record.history] == ["CLAIMED", "DONE"]
    assert ledger.claim(effect, lease_s=30, holder="w/2").outcome is ClaimOutcome.DUPLICATE


def test_another_releases_library_on_the_server_is_left_alone(redis7: RedisServer) -> None:
    # A rolling upgrade: the previous release's library stays (its pods still call it).
    admin = redis7.client()
    old = "effectq_ledger_0000000000000000"
    admin.function_load(f"#!lua name={old}\nredis.register_function('{old}', function() end)")
    ledger = _ledger(redis7)
    effect = charge()
    assert ledger.claim(effect, lease_s=30, holder="w/1").outcome is ClaimOutcome.ACQUIRED
    assert set(_libraries(redis7)) == {old, LIBRARY}


def test_reads_answer_on_a_full_server_and_writes_are_refused_whole(
    redis7: RedisServer,
) -> None:
    ledger = _ledger(redis7)
    effect = charge()
    claim = ledger.claim(effect, lease_s=30, holder="w/1")
    admin = redis7.client()
    admin.config_set("maxmemory", 1)
    try:
        assert ledger.get(effect.key) is not None
        with pytest.raises(LedgerUnavailableError, match="OOM"):
            ledger.commit(effect.key, claim.token, {"id": "x"}, retention_s=60)
    finally:
        admin.config_set("maxmemory", 0)
    record = ledger.get(effect.key)
    assert record is not None and record.state is State.CLAIMED


def test_a_user_refused_fcall_but_granted_function_load_falls_back_to_evalsha(
    redis7: RedisServer,
) -> None:
    # A partial grant: the library loads, FCALL is refused. The refused call did not run;
    # it goes again by EVALSHA, and so does every call after it.
    redis7.client().execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", "partial", "on", ">pw", "~*", "+@all", "-fcall", "-fcall_ro"
    )
    url = f"redis://partial:pw@127.0.0.1:{redis7.port}/0"
    ledger = Ledger.from_url(url, namespace=f"fn{uuid.uuid4().hex[:8]}")
    effect = charge()
    claim = ledger.claim(effect, lease_s=30, holder="w/1")
    assert claim.outcome is ClaimOutcome.ACQUIRED and not ledger._script.functions
    assert ledger.commit(effect.key, claim.token, {"id": "ch_1"}, retention_s=RETENTION_S).ok
    record = ledger.get(effect.key)
    assert record is not None and record.state is State.DONE and record.attempts == 1
