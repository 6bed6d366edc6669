"""The sandbox provider over real HTTP: a child process per server, httpx as the client."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import pytest

from workers.dev.sandbox import MAX_BODY_BYTES, SandboxConfig, SandboxProcess


@pytest.fixture(scope="module")
def shared_sandbox() -> Iterator[SandboxProcess]:
    with SandboxProcess() as sandbox:
        yield sandbox


@pytest.fixture
def sandbox(shared_sandbox: SandboxProcess) -> SandboxProcess:
    """The shared server, with default switches and no effects."""
    shared_sandbox.configure(**asdict(SandboxConfig()))
    shared_sandbox.reset()
    return shared_sandbox


@pytest.fixture
def client(sandbox: SandboxProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sandbox.url, timeout=5.0, trust_env=False) as c:
        yield c


def post(
    client: httpx.Client, key: str, body: dict[str, Any] | None = None, token: int | None = None
) -> httpx.Response:
    headers = {"Idempotency-Key": key}
    if token is not None:
        headers["Fencing-Token"] = str(token)
    return client.post(
        "/v1/effects", json=body if body is not None else {"to": "a@x"}, headers=headers
    )


def executions(sandbox: SandboxProcess, key: str) -> int:
    count: int = sandbox.stats()["executions"].get(key, 0)
    return count


def test_first_post_executes_and_returns_a_receipt(
    sandbox: SandboxProcess, client: httpx.Client
) -> None:
    before = time.time()
    response = post(client, "email:1", {"to": "a@x", "n": 1}, token=3)

    assert response.status_code == 201
    receipt = response.json()
    assert receipt["id"].startswith("eff_") and len(receipt["id"]) == len("eff_") + 12
    assert receipt["key"] == "email:1"
    assert receipt["token"] == 3
    assert receipt["body"] == {"to": "a@x", "n": 1}
    assert before <= receipt["created_at"] <= time.time()
    assert sandbox.stats() == {"executions": {"email:1": 1}, "total": 1}
    assert client.get("/v1/effects/email:1").json() == receipt


def test_repeated_key_returns_the_stored_receipt_without_executing(
    sandbox: SandboxProcess, client: httpx.Client
) -> None:
    first = post(client, "k-1")
    again = post(client, "k-1", {"different": True})

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    assert executions(sandbox, "k-1") == 1


def test_without_provider_idempotency_every_post_executes_again() -> None:
    with (
        SandboxProcess(SandboxConfig(provider_idempotency=False)) as sandbox,
        httpx.Client(base_url=sandbox.url, trust_env=False) as client,
    ):
        first, second = post(client, "k"), post(client, "k")

        assert (first.status_code, second.status_code) == (201, 201)
        assert first.json()["id"] != second.json()["id"]
        assert sandbox.stats() == {"executions": {"k": 2}, "total": 2}
        assert client.get("/v1/effects/k").json() == second.json()  # the latest receipt


def test_stale_fencing_token_is_rejected_and_not_executed(
    sandbox: SandboxProcess, client: httpx.Client
) -> None:
    sandbox.configure(provider_idempotency=False)  # so only the fence can stop a re-run
    assert post(client, "k", token=5).status_code == 201

    stale = post(client, "k", token=4)
    assert stale.status_code == 409
    assert stale.json() == {"error": "stale fencing token", "highest": 5}
    assert executions(sandbox, "k") == 1

    assert post(client, "k", token=5).status_code == 201  # equal is not stale
    assert post(client, "k", token=9).status_code == 201
    assert post(client, "k", token=8).json()["highest"] == 9
    assert executions(sandbox, "k") == 3


def test_lookup_token_fences_a_later_post_with_an_older_token(
    sandbox: SandboxProcess, client: httpx.Client
) -> None:
    # A reconciler looked up under token 7: the paused holder of token 6 must not execute.
    lookup = client.get("/v1/effects/k", headers={"Fencing-Token": "7"})
    assert lookup.status_code == 404

    late = post(client, "k", token=6)
    assert late.status_code == 409
    assert late.json()["highest"] == 7
    assert executions(sandbox, "k") == 0

    assert client.get("/v1/effects/k", headers={"Fencing-Token": "6"}).status_code == 409
    assert post(client, "k", token=7).status_code == 201


def test_lookup_lag_hides_a_new_effect_then_shows_it(
    sandbox: SandboxProcess, client: httpx.Client
) -> None:
    sandbox.configure(lookup_lag_s=0.5)
    receipt = post(client, "k").json()
    assert client.get("/v1/effects/k").status_code == 404

    deadline = time.monotonic() + 5.0
    while (found := client.get("/v1/effects/k")).status_code == 404:
        assert time.monotonic() < deadline, "effect never became visible"
        time.sleep(0.05)

    assert found.status_code == 200
    assert found.json() == receipt
    assert time.time() >= receipt["created_at"] + 0.5


def test_lookup_disabled_answers_501(sandbox: SandboxProcess, client: httpx.Client) -> None:
    post(client, "k")
    sandbox.configure(lookup_enabled=False)

    response = client.get("/v1/effects/k")
    assert response.status_code == 501
    assert response.json() == {"error": "lookup disabled"}


def test_failure_rate_one_answers_503_and_executes_nothing(
    sandbox: SandboxProcess, client: httpx.Client
) -> None:
    sandbox.configure(fail_rate=1.0)

    assert [post(client, "k").status_code for _ in range(3)] == [503, 503, 503]
    assert sandbox.stats() == {"executions": {}, "total": 0}


def test_dropped_ack_is_a_transport_error_but_the_effect_is_committed(
    sandbox: SandboxProcess, client: httpx.Client
) -> None:
    sandbox.configure(drop_ack_rate=1.0)

    with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
        post(client, "k", {"n": 1})

    assert executions(sandbox, "k") == 1
    found = client.get("/v1/effects/k")
    assert found.status_code == 200
    assert found.json()["body"] == {"n": 1}
    # The retry is answered (only new executions lose their ack) and not executed again.
    sandbox.configure(drop_ack_rate=0.0)
    assert post(client, "k").json() == found.json()
    assert executions(sandbox, "k") == 1


@pytest.mark.parametrize(
    ("headers", "content", "status"),
    [
        ({}, b"{}", 400),
        ({"Idempotency-Key": ""}, b"{}", 400),
        ({"Idempotency-Key": "has space"}, b"{}", 400),
        ({"Idempotency-Key": "x" * 201}, b"{}", 400),
        ({"Idempotency-Key": "k", "Fencing-Token": "one"}, b"{}", 400),
        ({"Idempotency-Key": "k"}, b"[1, 2]", 400),
        ({"Idempotency-Key": "k"}, b"not json", 400),
        ({"Idempotency-Key": "k"}, b'{"pad": "' + b"x" * MAX_BODY_BYTES + b'"}', 413),
    ],
    ids=["no-key", "empty-key", "bad-char", "long-key", "bad-token", "array", "garbage", "big"],
)
def test_bad_requests_are_rejected_with_a_json_error(
    sandbox: SandboxProcess,
    client: httpx.Client,
    headers: dict[str, str],
    content: bytes,
    status: int,
) -> None:
    response = client.post("/v1/effects", content=content, headers=headers)

    assert response.status_code == status
    assert "error" in response.json()
    assert sandbox.stats()["total"] == 0


def test_seeded_fault_schedule_replays_after_reset(
    sandbox: SandboxProcess, client: httpx.Client
) -> None:
    sandbox.configure(seed=42, fail_rate=0.5)

    def schedule() -> list[int]:
        sandbox.reset()
        return [post(client, f"k{i}").status_code for i in range(20)]

    first = schedule()
    assert {201, 503} <= set(first)
    assert schedule() == first


def test_admin_config_rejects_unknown_or_mistyped_switches(
    sandbox: SandboxProcess, client: httpx.Client
) -> None:
    assert client.post("/v1/admin/config", json={"nope": 1}).status_code == 400
    assert client.post("/v1/admin/config", json={"fail_rate": 2}).status_code == 400
    assert client.post("/v1/admin/config", json={"lookup_enabled": 1}).status_code == 400
    assert sandbox.configure(latency_ms=1)["latency_ms"] == 1.0
    assert client.get("/v1/admin/config").json() == {**asdict(SandboxConfig()), "latency_ms": 1.0}


@pytest.mark.parametrize(
    "content",
    [b'{"amount": NaN}', b'{"amount": Infinity}', b'{"a": [-Infinity]}', b'{"amount": 1e999}'],
    ids=["nan", "infinity", "minus-infinity", "overflow"],
)
def test_a_body_with_nan_or_infinity_is_refused_and_never_executed(
    sandbox: SandboxProcess, client: httpx.Client, content: bytes
) -> None:
    response = client.post("/v1/effects", content=content, headers={"Idempotency-Key": "nan-1"})

    assert response.status_code == 400
    assert "NaN or Infinity" in response.json()["error"]
    assert sandbox.stats()["total"] == 0
    assert client.get("/v1/effects/nan-1").status_code == 404  # a lookup still answers


@pytest.mark.parametrize("value", [b"NaN", b"Infinity", b"1e999"])
@pytest.mark.parametrize("switch", ["fail_rate", "latency_ms", "lookup_lag_s"])
def test_nan_or_infinity_is_refused_as_config(
    sandbox: SandboxProcess, client: httpx.Client, switch: str, value: bytes
) -> None:
    body = b'{"' + switch.encode() + b'": ' + value + b"}"
    response = client.post("/v1/admin/config", content=body)

    assert response.status_code == 400
    assert client.get("/v1/admin/config").json() == asdict(SandboxConfig())
    with pytest.raises(ValueError, match="finite"):
        SandboxConfig(**{switch: float(value)})


def test_state_file_survives_sigkill_and_restart(tmp_path: Path) -> None:
    with SandboxProcess(state_file=tmp_path / "effects.jsonl") as sandbox:
        with httpx.Client(base_url=sandbox.url, trust_env=False) as client:
            receipt = post(client, "a", token=4).json()
            post(client, "b")
        stats = sandbox.stats()

        sandbox.kill()
        with pytest.raises(httpx.TransportError):
            sandbox.stats()
        sandbox.restart()

        assert sandbox.stats() == stats == {"executions": {"a": 1, "b": 1}, "total": 2}
        with httpx.Client(base_url=sandbox.url, trust_env=False) as client:
            assert client.get("/v1/effects/a").json() == receipt
            assert post(client, "a", token=4).json() == receipt  # still idempotent
            assert post(client, "a", token=3).status_code == 409  # still fenced
        assert sandbox.stats() == stats


def test_a_token_seen_only_by_a_lookup_still_fences_after_sigkill(tmp_path: Path) -> None:
    """A reconciler's lookup with token 7 fences the paused holder's token 5 — also after
    the sandbox was SIGKILLed and restarted between the lookup and the late POST."""
    with SandboxProcess(state_file=tmp_path / "effects.jsonl") as sandbox:
        with httpx.Client(base_url=sandbox.url, trust_env=False) as client:
            lookup = client.get("/v1/effects/late", headers={"Fencing-Token": "7"})
            assert lookup.status_code == 404
        sandbox.kill()
        sandbox.restart()
        with httpx.Client(base_url=sandbox.url, trust_env=False) as client:
            assert post(client, "late", token=5).status_code == 409
            assert post(client, "late", token=7).status_code == 201
        assert sandbox.stats()["executions"] == {"late": 1}


def test_a_sandbox_child_is_pointed_at_the_tree_that_holds_workers() -> None:
    # PYTHONPATH of the child: the tree its parent imported `workers` from, whatever the
    # child's cwd (it pointed inside `workers/` once the module had moved a level down).
    from workers.dev.sandbox import process

    beside = process._SOURCE_ROOT / "workers" / "dev" / "sandbox" / "process.py"
    assert beside.exists() and beside.samefile(process.__file__)
