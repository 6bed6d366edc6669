"""``effectq api`` served by uvicorn in a thread of this process — the producer side of the
session's ``stack`` (real Redis, real worker processes, the real sandbox) — with one token
per role."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from pydantic import SecretStr

from tests.support.stack import wait_for
from workers.api.app import create_app
from workers.dev.local import LocalStack
from workers.dev.ports import free_port
from workers.settings import Settings

# name -> (token, scopes). "sre-ana" is the operator whose name the audit stream records.
ROLES = {
    "shop": ("shop-token-0123456789abcdef", "submit"),
    "dash": ("dash-token-0123456789abcdef", "read"),
    "sre-ana": ("sre-token-0123456789abcdef", "read,operate"),
    "root": ("root-token-0123456789abcdef", "submit,read,operate"),
}
TOKENS = ";".join(f"{name}:{token}:{scopes}" for name, (token, scopes) in ROLES.items())


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {ROLES[name][0]}"}


@dataclass
class Api:
    url: str
    server: uvicorn.Server
    app: FastAPI

    def client(self, role: str | None = "root") -> httpx.Client:
        headers = bearer(role) if role else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)


@pytest.fixture(scope="session")
def api(stack: LocalStack) -> Iterator[Api]:
    # Cookies stay Secure as in production: browsers accept them from http://127.0.0.1.
    app = create_app(Settings(api_tokens=SecretStr(TOKENS), api_max_campaign_bytes=1024 * 1024))
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, access_log=False, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="effectq-api", daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout=15, what="effectq api listening")
    yield Api(f"http://127.0.0.1:{port}", server, app)
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def client(api: Api, live: LocalStack) -> Iterator[httpx.Client]:
    """A root client on a clean slate (``live``: empty ledger and broker, no workers)."""
    with api.client("root") as c:
        yield c


def poll_json(
    client: httpx.Client, path: str, until: Callable[[Any], bool], timeout: float = 60.0
) -> Any:
    """GET ``path`` until ``until(body)`` holds; returns that body."""
    deadline = time.monotonic() + timeout
    while True:
        body = client.get(path).json()
        if until(body):
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"{path}: condition not met in {timeout}s; last {body!r}")
        time.sleep(0.1)
