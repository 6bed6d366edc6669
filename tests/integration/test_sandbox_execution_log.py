"""The sandbox's execution log (``GET /v1/executions``): the ground truth with values that the
system-level chaos checker reads, and the per-key 503 switch (``/v1/admin/fail-next``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from workers.dev.sandbox import SandboxConfig, SandboxProcess


def post(
    client: httpx.Client, key: str, body: dict[str, Any], token: int, effect_key: str | None = None
) -> httpx.Response:
    headers = {"Idempotency-Key": key, "Fencing-Token": str(token)}
    if effect_key is not None:
        headers["Effect-Key"] = effect_key
    return client.post("/v1/effects", json=body, headers=headers)


def test_every_real_execution_is_logged_in_order_with_its_values_and_survives_a_sigkill(
    tmp_path: Path,
) -> None:
    config = SandboxConfig(provider_idempotency=False)
    with SandboxProcess(config, state_file=tmp_path / "sb") as sandbox:
        with httpx.Client(base_url=sandbox.url, timeout=5.0, trust_env=False) as client:
            first = post(client, "k1", {"amount": "10.00"}, 1, effect_key="e" * 64).json()
            post(client, "k2", {"amount": "3"}, 5)
            post(client, "k1", {"amount": "12.00"}, 2)
        before = sandbox.executions()
        sandbox.kill()
        sandbox.start()
        after = sandbox.executions()

    assert [(e["seq"], e["idempotency_key"], e["token"], e["body"]) for e in before] == [
        (1, "k1", 1, {"amount": "10.00"}),
        (2, "k2", 5, {"amount": "3"}),
        (3, "k1", 2, {"amount": "12.00"}),
    ]
    assert before[0]["effect_key"] == "e" * 64 and before[1]["effect_key"] is None
    assert before[0]["id"] == first["id"]
    assert "effect_key" not in first  # the receipt is what it was
    assert after == before


def test_a_stored_receipt_answered_again_is_not_a_second_execution() -> None:
    with SandboxProcess() as sandbox:
        with httpx.Client(base_url=sandbox.url, timeout=5.0, trust_env=False) as client:
            post(client, "k1", {"amount": "1"}, 1)
            post(client, "k1", {"amount": "1"}, 1)
        assert [e["seq"] for e in sandbox.executions()] == [1]


def test_the_log_is_paged_by_sequence_number() -> None:
    with SandboxProcess(SandboxConfig(provider_idempotency=False)) as sandbox:
        with httpx.Client(base_url=sandbox.url, timeout=5.0, trust_env=False) as client:
            for n in range(5):
                post(client, f"k{n}", {"n": n}, 1)
            first = client.get("/v1/executions", params={"limit": 2}).json()
            last = client.get("/v1/executions", params={"after": 4, "limit": 2}).json()
            bad = client.get("/v1/executions", params={"limit": "0"})
        assert [e["seq"] for e in first["executions"]] == [1, 2]
        assert (first["next_after"], first["total"]) == (2, 5)
        assert [e["seq"] for e in last["executions"]] == [5] and last["next_after"] is None
        assert bad.status_code == 400
        assert [e["body"]["n"] for e in sandbox.executions()] == [0, 1, 2, 3, 4]


def test_fail_next_answers_503_for_that_key_only_then_executes() -> None:
    with SandboxProcess() as sandbox:
        sandbox.fail_next("gen-1", count=2)
        with httpx.Client(base_url=sandbox.url, timeout=5.0, trust_env=False) as client:
            codes = [post(client, "gen-1", {"a": 1}, 1).status_code for _ in range(3)]
            other = post(client, "gen-0", {"a": 1}, 1).status_code
        assert codes == [503, 503, 201] and other == 201
        assert [e["idempotency_key"] for e in sandbox.executions()] == ["gen-1", "gen-0"]
