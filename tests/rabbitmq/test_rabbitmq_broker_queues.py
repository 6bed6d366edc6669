"""On RabbitMQ the broker's queues cannot be read or edited as on Redis: delayed messages
sit in ``<queue>.DQ`` queues that cannot be listed without consuming them, and dead letters
are the queue ``<queue>.XQ``. Every face says so in one line or a 4xx, never a traceback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from typer.testing import CliRunner

from workers import runtime
from workers.api.app import create_app
from workers.cli import app
from workers.dev.local import LocalStack
from workers.settings import Settings

TOKEN = "sre-token-0123456789abcdef"


@pytest.fixture
def own_runtime() -> Iterator[None]:
    previous = runtime.current()
    yield
    runtime.install(previous)


def test_scheduled_requeue_and_purge_say_rabbitmq_cannot(
    live: LocalStack, own_runtime: None
) -> None:
    for argv in (["scheduled"], ["requeue", "--all", "--dry-run"],
                 ["purge", "--all", "--actor", "sre", "--reason", "r"]):  # fmt: skip
        result = CliRunner().invoke(app, argv, env=live.env())
        assert result.exit_code == 2, (argv, result.stdout, result.stderr)
        assert result.stderr.count("\n") == 1 and "needs the Redis broker" in result.stderr
        assert "Traceback" not in result.stderr + result.stdout

    cfg = Settings(api_tokens=SecretStr(f"sre-ana:{TOKEN}:read,operate"))
    with TestClient(create_app(cfg, runtime=runtime.current())) as client:
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        listed = client.get("/v1/scheduled")
        requeued = client.post("/v1/deadletters/requeue", json={"all": True, "reason": "r"})
    assert listed.status_code == 422
    assert listed.json()["message"] == (
        "scheduled needs the Redis broker: on RabbitMQ delayed messages sit in <queue>.DQ "
        "queues, which cannot be listed without consuming them"
    )
    assert requeued.status_code == 422
    assert "its dead letters are the queue <queue>.XQ" in requeued.json()["message"]
    assert runtime.ledger().audit_log() == []
