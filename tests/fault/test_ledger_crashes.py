"""Crash windows of the ledger itself: a holder SIGKILLed after its claim, and the ledger's
Redis SIGKILLed between claim and commit and restarted from its AOF."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from dedupe import ClaimOutcome, Ledger, State
from tests.support.ledgers import RETENTION_S, charge, poll
from workers.dev.redis_server import RedisServer

HOLDER = textwrap.dedent(
    """
    import sys, time
    from dedupe import Ledger
    from tests.support.ledgers import charge
    ledger = Ledger.from_url(sys.argv[1], namespace="crash")
    claim = ledger.claim(charge(sys.argv[2]), lease_s=float(sys.argv[3]), holder="doomed/1")
    print(claim.outcome.value, claim.token, flush=True)
    time.sleep(60)
    """
)


def test_holder_sigkilled_after_claim_leaves_claimed_then_blocked(
    redis_server: RedisServer,
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, redis_server.url, "order-crash", "0.5"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().split() == ["acquired", "1"]
    proc.kill()
    proc.wait()
    ledger = Ledger.from_url(redis_server.url, namespace="crash")
    effect = charge("order-crash")
    record = ledger.get(effect.key)
    assert record is not None and record.state is State.CLAIMED and record.holder == "doomed/1"
    seen: list[str] = []
    deadline = time.monotonic() + 5
    # Claim across the lease deadline: in_flight before it, blocked after, never acquired.
    while time.monotonic() < deadline and (not seen or seen[-1] != "blocked"):
        seen.append(ledger.claim(effect, lease_s=30, holder="next/1").outcome.value)
        time.sleep(0.02)
    assert seen[-1] == "blocked" and "acquired" not in seen
    assert set(seen) <= {"in_flight", "blocked"}
    record = ledger.get(effect.key)
    assert record is not None and record.state is State.CLAIMED and record.token == 1


def test_redis_killed_between_claim_and_commit_keeps_the_claim(redis_server: RedisServer) -> None:
    ledger = Ledger.from_url(redis_server.url, namespace="aof")
    effect = charge("order-aof")
    claim = ledger.claim(effect, lease_s=60, holder="w/1")
    assert claim.acquired
    redis_server.kill()
    redis_server.start()  # same port and dir: reloads the AOF
    ledger.client.connection_pool.disconnect()
    record = poll(lambda: ledger.get(effect.key), lambda r: r is not None)
    assert record is not None and record.state is State.CLAIMED and record.token == claim.token
    assert ledger.claim(effect, lease_s=60, holder="w/2").outcome is ClaimOutcome.IN_FLIGHT
    assert ledger.commit(effect.key, claim.token, {"id": "eff_9"}, retention_s=RETENTION_S).ok
    again = ledger.claim(effect, lease_s=60, holder="w/3")
    assert again.outcome is ClaimOutcome.DUPLICATE and again.receipt == {"id": "eff_9"}
