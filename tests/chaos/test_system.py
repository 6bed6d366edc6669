"""The system checker over real processes: issue 37's hole 1, step by step (see
``tests.chaos.system.voided_generation_scenario``), and a CI-size seeded workload
(``tests.chaos.system.run_workload``). The hole-1 scenario failed on the script before
2b7490c: generation 1 executed the voided 10.00 under its own idempotency key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.system import parse_args, run_workload, voided_generation_scenario


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_voided_generation_never_runs_after_the_new_generation_failed(tmp_path: Path) -> None:
    result = voided_generation_scenario(tmp_path)
    print(result)
    assert result["violations"] == []
    assert result["quiet"]
    assert result["final"]["state"] == "DONE" and result["final"]["generation"] == 1
    amounts = [e["body"]["amount"] for e in result["executions"]]
    assert amounts == ["10.00", "12.00"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_seeded_workload_under_faults_keeps_the_promise_at_the_provider(
    tmp_path: Path,
) -> None:
    """40 effects with duplicates, conflicts, revoke/supersede + resubmission, replay and
    resolve, through a worker SIGKILL, a failpoint-armed pool, a SIGSTOP past the lease, a
    broker that forgets (then every key resubmitted), 503s, lost acks, a lookup outage and
    a ledger restart from AOF: the provider's log shows each generation at most once with
    its submitted values, and every effect ends visible."""
    args = parse_args(["--seed", "3", "--effects", "40", "--kills", "1", "--quiet"])
    result = run_workload(args, tmp_path)
    print(result)
    assert result["violations"] == []
    assert result["effects"] == 40
    assert result["faults"]["broker_loss"] == 1
    assert result["broker_lost_messages"] >= 1  # the loss took messages no worker had
    assert result["steps"]["resubmit after loss"] >= 1
    # At least one effect was voided and resubmitted with new values, and it ran again.
    assert result["checker"]["generations_opened"] >= 1
