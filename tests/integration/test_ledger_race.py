"""Many OS processes (and threads) racing one key: exactly one claim is granted."""

from __future__ import annotations

import multiprocessing as mp
import threading
from collections import Counter
from typing import Any

import pytest

from dedupe import Ledger, State
from tests.support.cluster import LocalCluster
from tests.support.ledgers import charge
from workers.dev.redis_server import RedisServer

ROUNDS = 20


def _racer(url: str, namespace: str, threads: int, barrier: Any, out: Any) -> None:
    ledger = Ledger.from_url(url, namespace=namespace)
    for round_no in range(ROUNDS):
        effect = charge(f"race-{round_no}")

        def one(effect: Any = effect, round_no: int = round_no) -> None:
            barrier.wait(timeout=30)
            out.put((round_no, ledger.claim(effect, lease_s=30, holder="racer").outcome.value))

        pool = [threading.Thread(target=one) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()


@pytest.mark.parametrize(("processes", "threads"), [(50, 1), (2, 8)], ids=["50x1", "2x8"])
def test_racing_claims_grant_exactly_one(
    ledger_server: RedisServer | LocalCluster, processes: int, threads: int
) -> None:
    namespace = f"race{processes}x{threads}"
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(processes * threads)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_racer, args=(ledger_server.url, namespace, threads, barrier, out))
        for _ in range(processes)
    ]
    for p in procs:
        p.start()
    results: dict[int, Counter[str]] = {r: Counter() for r in range(ROUNDS)}
    for _ in range(ROUNDS * processes * threads):
        round_no, outcome = out.get(timeout=60)
        results[round_no][outcome] += 1
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    contenders = processes * threads
    ledger = Ledger.from_url(ledger_server.url, namespace=namespace)
    for round_no, counts in results.items():
        assert counts == Counter(acquired=1, in_flight=contenders - 1), (round_no, counts)
        record = ledger.get(charge(f"race-{round_no}").key)
        # One grant: one claim step (a fresh token is its bucket floor's INCR, not always 1).
        assert record is not None and record.attempts == 1
        assert [(t.state, t.token) for t in record.history] == [(State.CLAIMED, record.token)]
    bucket_keys = list(ledger.client.scan_iter(match=f"{{{namespace}:*}}:r:*"))  # every master
    assert len(bucket_keys) == ROUNDS  # one record per raced key, nothing else
