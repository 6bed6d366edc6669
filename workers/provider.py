"""The example tools' HTTP client for a provider speaking the sandbox contract (DESIGN §5).

It classifies what a failed call established, because only a tool knows its provider:
connection refused, a pre-execution 503 and a 409 stale-token refusal mean *not executed*;
other 4xx mean *rejected*; a timeout after sending, a dropped connection or another 5xx mean
*uncertain* and are left to propagate, so the worker hands the claim to the reconciler.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import httpx

from dedupe import NotExecutedError, ProviderError, RejectedError

from .settings import settings
from .tool import EffectCall, ToolResult

__all__ = ["post_effect"]

_local = threading.local()
# One INFO line per provider request drowns the worker log; failures are logged by the worker.
logging.getLogger("httpx").setLevel(logging.WARNING)


def _client() -> httpx.Client:
    # One client per thread and process: connection pools are not shared across fork.
    client: httpx.Client | None = getattr(_local, "client", None)
    if client is None or getattr(_local, "pid", None) != os.getpid():
        cfg = settings()
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
