"""The shipped example tools (DESIGN §8) and their HTTP client for a provider speaking the
sandbox contract (DESIGN §5), at ``EFFECTQ_PROVIDER_URL``.

Run them with ``effectq worker`` (``EFFECTQ_TOOLS=workers.examples``, the default). Their
knobs are theirs, not the core settings': ``EFFECTQ_PROVIDER_URL``,
``EFFECTQ_PROVIDER_TIMEOUT_S``, ``EFFECTQ_EXAMPLE_LEASE_S``, ``EFFECTQ_EXAMPLE_SETTLE_S``.

The client classifies what a failed call established, because only a tool knows its
provider: connection refused, a pre-execution 503 and a 409 stale-token refusal mean *not
executed*; other 4xx mean *rejected*; a timeout after sending, a dropped connection or
another 5xx mean *uncertain* and are left to propagate, so the worker hands the claim to
the reconciler.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import httpx
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from dedupe import NotExecutedError, ProviderError, RejectedError
from reconciler import HttpLookup

from .tool import EffectCall, ToolResult, effect_tool

__all__ = ["ExampleSettings", "charge", "post_effect", "send_email", "set_value"]


class ExampleSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EFFECTQ_", extra="ignore")

    provider_url: str = Field(
        default="http://127.0.0.1:8765", description="base URL of the tools' API"
    )
    provider_timeout_s: float = 10.0
    # Lease and settle window of the example tools (the demo and the tests shorten them).
    example_lease_s: float = 30.0
    example_settle_s: float = 5.0


def example_settings() -> ExampleSettings:
    # Read afresh: a process re-pointed at another deployment (the demo, tests) follows.
    return ExampleSettings()


_local = threading.local()
# One INFO line per provider request drowns the worker log; failures are logged by the worker.
logging.getLogger("httpx").setLevel(logging.WARNING)


def _client() -> httpx.Client:
    # One client per thread and process: connection pools are not shared across fork.
    client: httpx.Client | None = getattr(_local, "client", None)
    if client is None or getattr(_local, "pid", None) != os.getpid():
        cfg = example_settings()
        client = httpx.Client(base_url=cfg.provider_url, timeout=cfg.provider_timeout_s)
        _local.client, _local.pid = client, os.getpid()
    return client


def post_effect(call: EffectCall, body: dict[str, Any]) -> ToolResult:
    """POST one effect under the call's idempotency key and fencing token."""
    headers = {"Idempotency-Key": call.idempotency_key, "Fencing-Token": str(call.token)}
    try:
        response = _client().post("/v1/effects", json=body, headers=headers)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise NotExecutedError(
            f"provider unreachable: {type(exc).__name__}", key=call.key
        ) from None
    status = response.status_code
    if status in (200, 201):
        return ToolResult(receipt=response.json(), raw=response.text)
    if status == 503:
        raise NotExecutedError("provider answered 503 before executing", key=call.key)
    if status == 409:
        raise NotExecutedError("provider refused a stale fencing token", key=call.key)
    if 400 <= status < 500:
        raise RejectedError(f"provider rejected the request: HTTP {status}", key=call.key)
    raise ProviderError(f"provider answered HTTP {status} after the request was sent", key=call.key)


# The reconciler asks the same provider; the URL is read when it first looks something up.
_lookup = HttpLookup(lambda: example_settings().provider_url)
_declared = example_settings()
_lease_s, _settle_s = _declared.example_lease_s, _declared.example_settle_s


@effect_tool(
    identity=("recipient",),
    bound=("recipient",),
    free=("subject", "body"),
    action="receipt",
    actions=("reminder", "notice"),
    normalizers={"recipient": "email"},
    lookup=_lookup,
    provider_idempotency=True,  # the sandbox honours Idempotency-Key
    lease_s=_lease_s,
    settle_s=_settle_s,
)
def send_email(call: EffectCall, recipient: str, subject: str = "", body: str = "") -> ToolResult:
    payload = {"tool": "send_email", "action": call.action, "to": recipient, "subject": subject}
    return post_effect(call, {**payload, "body": body})


@effect_tool(
    identity=("customer",),
    bound=("customer", "amount", "currency"),
    normalizers={"customer": "id", "amount": "money", "currency": "upper"},
    lookup=_lookup,
    provider_idempotency=True,  # the sandbox honours Idempotency-Key
    lease_s=_lease_s,
    settle_s=_settle_s,
)
def charge(call: EffectCall, customer: str, amount: str, currency: str) -> ToolResult:
    body = {"tool": "charge", "customer": customer, "amount": amount, "currency": currency}
    return post_effect(call, body)


@effect_tool(
    identity=("target",),
    bound=("value",),
    normalizers={"target": "id"},
    lookup=_lookup,
    provider_idempotency=True,  # the sandbox honours Idempotency-Key
    lease_s=_lease_s,
    settle_s=_settle_s,
)
def set_value(call: EffectCall, target: str, value: object) -> ToolResult:
    return post_effect(call, {"tool": "set_value", "target": target, "value": value})
