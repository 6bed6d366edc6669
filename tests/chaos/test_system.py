"""The system checker over real processes: issue 37's hole 1, step by step (see
``tests.chaos.system.voided_generation_scenario``). It failed on the script before 2b7490c:
generation 1 executed the voided 10.00 under its own idempotency key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.system import voided_generation_scenario


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
