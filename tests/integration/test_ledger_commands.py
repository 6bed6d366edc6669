"""What one transition costs the ledger's server, counted: the commands a claim, a commit and
a duplicate claim run (``INFO commandstats``, which counts a script's inner commands too), on
a redis-server of the test's own (the counts are the server's, not one namespace's). Issue 39
set the budget; these keep the levers taken from silently coming undone."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from dedupe import ClaimOutcome, Ledger
from tests.support.ledgers import RETENTION_S, charge, fresh_ledger
from workers.dev.redis_server import RedisServer

SCRIPT_CALLS = ("fcall", "fcall_ro", "evalsha", "eval")


def _commands(ledger: Ledger, run: Callable[[], object]) -> Counter[str]:
    """The commands the server ran for ``run()``, by name, the INFO calls left out."""

    def snapshot() -> Counter[str]:
        stats = ledger.client.info("commandstats")
        return Counter(
            {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
        )

    before = snapshot()
    run()
    delta = snapshot() - before
    del delta["info"]
    return delta


def _bucket_mates(ledger: Ledger, count: int) -> list[str]:
    """Scopes of ``count`` charges whose keys fall in one bucket (they share its floor)."""
    found: dict[int, list[str]] = {}
    n = 0
    while True:
        scope = f"mate-{n}"
        n += 1
        mates = found.setdefault(ledger.bucket_of(charge(scope).key), [])
        mates.append(scope)
        if len(mates) == count:
            return mates


def test_a_fresh_claim_takes_its_token_from_the_bucket_floor_and_its_commit_writes_no_floor(
    redis_server: RedisServer,
) -> None:
    ledger = fresh_ledger(redis_server.url)
    first, second = (charge(scope) for scope in _bucket_mates(ledger, 2))
    claim = ledger.claim(first, lease_s=30, holder="w/1")
    assert claim.acquired
    commit_cost = _commands(
        ledger, lambda: ledger.commit(first.key, claim.token, {"id": "ch_1"}, retention_s=60)
    )
    # The floor was raised by the claim's INCR: the commit reads it and writes only the
    # record (SET) and the marker (DEL).
    assert commit_cost["set"] == 1 and commit_cost["incr"] == 0, commit_cost
    # Tokens only grow within a bucket's floor: the next fresh record starts above.
    assert ledger.claim(second, lease_s=30, holder="w/1").token > claim.token


def test_claim_and_commit_cost_fifteen_commands_and_a_duplicate_three(
    redis_server: RedisServer,
) -> None:
    ledger = fresh_ledger(redis_server.url)
    # Loaded script, bucket keys that exist: what follows is the steady state.
    ledger.claim(charge(), lease_s=30, holder="w/0")
    effect = charge()

    def first() -> None:
        claim = ledger.claim(effect, lease_s=30, holder="w/1")
        assert claim.acquired
        ledger.commit(effect.key, claim.token, {"id": "ch_1"}, retention_s=RETENTION_S)

    first_cost = _commands(ledger, first)
    # Each call reads the record under both its names (dedupe/keys.py) in one MGET.
    assert sum(first_cost.values()) <= 15 and first_cost["mget"] == 2, first_cost
    assert first_cost["time"] == 2, first_cost

    def duplicate() -> None:
        claim = ledger.claim(effect, lease_s=30, holder="w/2")
        assert claim.outcome is ClaimOutcome.DUPLICATE and claim.receipt == {"id": "ch_1"}

    dup_cost = _commands(ledger, duplicate)
    # The script call, the record's MGET and the dup_claim counter: a duplicate needs no clock.
    assert sum(dup_cost[c] for c in SCRIPT_CALLS) == 1, dup_cost
    assert dup_cost["time"] == 0 and sum(dup_cost.values()) == 3, dup_cost
