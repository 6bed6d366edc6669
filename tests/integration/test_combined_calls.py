"""The threads of one process share round trips to the ledger (``dedupe.combiner``), on a
real redis-server (both binaries): many threads' claims and commits take fewer socket reads
than calls, and each thread gets its own answer; a batch whose replies are lost is
"unavailable" to every claim in it, each sent once, none hanging."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from dedupe import Ledger, LedgerUnavailableError, State
from tests.support.ledgers import RETENTION_S, charge, fresh_ledger, script_calls
from tests.support.proxy import reply_losing_proxy
from workers.dev.redis_server import RedisServer

THREADS, EACH = 12, 25
TIMEOUT_S = 0.3
JOIN_S = 30.0


def reads_processed(server: RedisServer) -> int:
    return int(server.client().info("stats")["total_reads_processed"])


def run_threads(
    count: int,
    body: Callable[[int], None],
    *,
    warm: Callable[[], None] = lambda: None,
    between: Callable[[], None] = lambda: None,
) -> list[BaseException]:
    """``body(i)`` in ``count`` threads at once; ``warm()`` in each thread first, then
    ``between()`` in this one before the bodies start."""
    errors: list[BaseException] = []
    ready, go = threading.Barrier(count + 1), threading.Barrier(count + 1)

    def run(i: int) -> None:
        warm()
        ready.wait(JOIN_S)
        go.wait(JOIN_S)
        try:
            body(i)
        except BaseException as exc:  # collected for the assertions
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    ready.wait(JOIN_S)
    between()
    go.wait(JOIN_S)
    for t in threads:
        t.join(JOIN_S)
        assert not t.is_alive(), "a ledger call never returned"
    return errors


def test_threads_share_round_trips_and_each_gets_its_own_claim_and_commit(
    redis_server: RedisServer,
) -> None:
    ledger = fresh_ledger(redis_server.url)
    effects = [[charge(f"order-{i}-{j}") for j in range(EACH)] for i in range(THREADS)]
    tokens: dict[str, int] = {}
    ledger.get(effects[0][0].key)  # connected, library loaded
    calls, reads = script_calls(redis_server.client()), reads_processed(redis_server)

    def body(i: int) -> None:
        for j, effect in enumerate(effects[i]):
            claim = ledger.claim(effect, lease_s=60, holder=f"w/{i}")
            assert claim.acquired, claim
            tokens[effect.key] = claim.token
            receipt = {"id": f"ch_{i}_{j}"}
            assert ledger.commit(effect.key, claim.token, receipt, retention_s=RETENTION_S).ok

    assert run_threads(THREADS, body) == []
    calls = script_calls(redis_server.client()) - calls
    reads = reads_processed(redis_server) - reads
    assert calls == 2 * THREADS * EACH
    # Shared: at 12 threads most calls travel with another's (unbatched: one read each).
    assert reads < 0.8 * calls, f"{reads} socket reads for {calls} calls"
    check = Ledger.from_url(redis_server.url, namespace=ledger.namespace)
    for i in range(THREADS):
        for j, effect in enumerate(effects[i]):
            record = check.get(effect.key)
            assert record is not None and record.state is State.DONE
            assert record.receipt == {"id": f"ch_{i}_{j}"} and record.token == tokens[effect.key]


def test_a_batch_whose_replies_are_lost_is_unavailable_to_every_claim_in_it_each_sent_once(
    redis_server: RedisServer,
) -> None:
    with reply_losing_proxy(redis_server.port) as proxy:
        ledger = Ledger.from_url(proxy.url, namespace="lostbatch", socket_timeout=TIMEOUT_S)
        effects = [charge(f"order-lost-{i}") for i in range(THREADS)]
        alone = threading.Lock()

        def warm() -> None:
            # Alone, so this thread writes its own call: its connection is open (a
            # connection opened while replies are lost fails at its handshake, unsent).
            with alone:
                ledger.get(effects[0].key)

        before = 0

        def lose() -> None:
            nonlocal before
            before = script_calls(redis_server.client())
            proxy.lose_replies(on_new_connections=True)

        def body(i: int) -> None:
            ledger.claim(effects[i], lease_s=60, holder=f"w/{i}")

        started = time.monotonic()
        errors = run_threads(THREADS, body, warm=warm, between=lose)
        elapsed = time.monotonic() - started
        assert len(errors) == THREADS
        assert all(isinstance(e, LedgerUnavailableError) for e in errors), errors
        # Each claim ran once (fenced calls are never resent), whatever batch it went in.
        assert script_calls(redis_server.client()) - before == THREADS
        # A batch waits for the one on the wire: a few timeouts, not one per thread.
        assert elapsed < THREADS * TIMEOUT_S, f"{elapsed:.2f}s"
        proxy.hear_replies()
    direct = Ledger.from_url(redis_server.url, namespace="lostbatch")
    for i, effect in enumerate(effects):
        record = direct.get(effect.key)
        assert record is not None and record.state is State.CLAIMED and record.holder == f"w/{i}"
