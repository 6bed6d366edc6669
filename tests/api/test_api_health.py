"""The probes the chart's API Deployment uses: /healthz (the process serves) and /readyz
(the ledger answers), both without a token."""

from __future__ import annotations

import redis
from fastapi.testclient import TestClient
from pydantic import SecretStr

from dedupe import Ledger
from tests.api.conftest import TOKENS, Api
from workers import runtime
from workers.api.app import create_app
from workers.dev.ports import free_port
from workers.settings import Settings


def test_health_and_readiness_need_no_token(api: Api) -> None:
    with api.client(role=None) as anonymous:
        assert anonymous.get("/healthz").json() == {"status": "ok"}
        ready = anonymous.get("/readyz")
    assert (ready.status_code, ready.json()) == (200, {"status": "ok"})


def test_readiness_fails_while_the_ledger_does_not_answer() -> None:
    cfg = Settings(api_tokens=SecretStr(TOKENS))
    nobody = redis.Redis(
        port=free_port(), socket_connect_timeout=0.5, socket_timeout=0.5, decode_responses=True
    )
    previous = runtime.current()
    dead = runtime.Runtime(cfg, broker=previous.broker, ledger=Ledger(nobody, allow_volatile=True))
    try:
        with TestClient(create_app(cfg, dead)) as client:
            assert client.get("/healthz").status_code == 200
            unready = client.get("/readyz")
    finally:
        runtime.install(previous)
    assert (unready.status_code, unready.json()) == (503, {"status": "unavailable"})
