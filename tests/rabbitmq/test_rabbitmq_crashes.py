"""The worker crash tests of tests/fault and cells of the crash-point matrix, with the
broker on RabbitMQ: the same test bodies, on this package's stack, asserting on the
sandbox's own execution counts (its idempotency off).

What RabbitMQ changes underneath: a SIGKILLed worker's unacked messages go back to the
queue as soon as its socket closes (no heartbeat timeout to wait for), a SIGSTOPped one's
once it missed its AMQP heartbeats (3 s here), and a retry waits in ``effectq.DQ`` as an
unacked delivery of the worker that will send it back.
"""

from __future__ import annotations

import pytest

from tests.fault import test_crash_matrix as matrix
from tests.fault import test_worker_crashes as crashes
from workers.dev.local import LocalStack

test_after_commit_kill_redelivery_is_a_duplicate = (
    crashes.test_after_commit_kill_redelivery_is_a_duplicate
)
test_killed_holder_is_never_re_executed_blind = (
    crashes.test_killed_holder_is_never_re_executed_blind
)
test_ledger_redis_killed_mid_run_no_effect_runs_without_a_claim = (
    crashes.test_ledger_redis_killed_mid_run_no_effect_runs_without_a_claim
)
test_sigterm_during_a_slow_effect_finishes_and_acks = (
    crashes.test_sigterm_during_a_slow_effect_finishes_and_acks
)

# The SIGKILLs at after_claim, after_effect and after_commit are the tests above. These are
# holders frozen past their lease, whose unacked message only their missed AMQP heartbeats
# free: before executing (reconciled FAILED, executed once by the redelivery, the woken
# holder fenced) and after (found at the provider, its late commit kept as evidence).
CELLS = [("before_effect", "stop"), ("after_effect", "stop")]


@pytest.mark.slow
@pytest.mark.parametrize(("point", "action"), [pytest.param(*c, id="-".join(c)) for c in CELLS])
def test_crash_point(fenceless: LocalStack, point: str, action: str) -> None:
    matrix.test_crash_point(fenceless, point, action)
