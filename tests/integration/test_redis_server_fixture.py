"""The RedisServer fixture layer itself, on every available redis-server binary."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis

from workers.dev.redis_server import RedisServer, find_redis_binaries

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    # Signal 0 only checks existence; a pid we have reaped is gone, not a zombie.
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _kind(binary: str) -> str:
    return next(kind for kind, path in find_redis_binaries().items() if path == binary)


def test_acked_write_survives_sigkill_and_restart(redis_server: RedisServer) -> None:
    client = redis_server.client()
    client.set("effect:1", "claimed")
    old_pid, port = redis_server.pid, redis_server.port

    redis_server.kill()
    assert not redis_server.running
    assert not _alive(old_pid)

    redis_server.restart()
    assert redis_server.port == port
    assert redis_server.pid != old_pid
    assert redis_server.client().get("effect:1") == b"claimed"
    # 7.x writes a multi-part AOF under appendonlydir/, 6.2 a single file; both reloaded.
    assert (redis_server.dir / "appendonlydir").is_dir() or (
        redis_server.dir / "appendonly.aof"
    ).is_file()


def test_stop_is_idempotent(redis_binary: str, tmp_path: Path) -> None:
    RedisServer(redis_binary, tmp_path / "never").stop()  # never started: no-op

    server = RedisServer(redis_binary, tmp_path / "r").start()
    pid = server.pid
    server.stop()
    server.stop()
    server.kill()
    assert not server.running
    assert not _alive(pid)


def test_stop_handles_a_sigstopped_server(redis_server: RedisServer) -> None:
    redis_server.sigstop()
    frozen = redis_server.client(socket_timeout=0.3)
    with pytest.raises(redis.TimeoutError):
        frozen.ping()
    redis_server.sigcont()
    assert redis_server.client().ping()

    redis_server.sigstop()
    redis_server.stop()
    assert not redis_server.running


def test_two_servers_get_different_ports(redis_binary: str, tmp_path: Path) -> None:
    with (
        RedisServer(redis_binary, tmp_path / "a") as a,
        RedisServer(redis_binary, tmp_path / "b") as b,
    ):
        assert a.port != b.port
        assert a.url != b.url
        a.client().set("k", "a")
        assert b.client().get("k") is None
        assert redis.Redis.from_url(a.url).get("k") == b"a"


def test_version_matches_binary(redis_server: RedisServer, redis_binary: str) -> None:
    major, minor = (int(part) for part in redis_server.version.split(".")[:2])
    if _kind(redis_binary) == "embedded":
        assert (major, minor) == (6, 2)
    else:
        # The point of the "system" leg is to exercise a Redis other than the embedded 6.2.
        assert major >= 7


def test_failed_start_raises_with_log_tail(redis_binary: str, tmp_path: Path) -> None:
    server = RedisServer(redis_binary, tmp_path / "r", extra_args=["--no-such-option", "1"])
    with pytest.raises(RuntimeError, match="no-such-option"):
        server.start()
    assert not server.running


def test_atexit_kills_a_server_left_running(redis_binary: str, tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from workers.dev.redis_server import RedisServer
        print(RedisServer({redis_binary!r}, Path({str(tmp_path / "r")!r})).start().pid)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, check=True, capture_output=True, timeout=30
    )
    pid = int(out.stdout)
    # The child python reaped its server before exiting, so the pid must be gone already.
    assert not _alive(pid)


def test_shared_redis_starts_empty(shared_redis: redis.Redis) -> None:
    assert shared_redis.dbsize() == 0
    shared_redis.set("left-behind", 1)  # the next user of shared_redis must not see this


def test_shared_redis_is_flushed_between_tests(shared_redis: redis.Redis) -> None:
    assert shared_redis.get("left-behind") is None


def test_local_redis_uses_db_15(local_redis: redis.Redis) -> None:
    assert local_redis.connection_pool.connection_kwargs["db"] == 15
    assert local_redis.ping()
