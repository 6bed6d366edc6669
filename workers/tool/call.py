"""What a tool body is given besides its arguments (``EffectCall``) and what it may answer
besides a plain receipt (``ToolResult``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["EffectCall", "ToolResult"]


@dataclass(frozen=True)
class EffectCall:
    """What a tool body gets besides its arguments: pass ``idempotency_key`` to the provider
    as its idempotency key and ``token`` as a fencing token where the provider takes one."""

    tool: str
    key: str
    idempotency_key: str
    token: int
    scope: str
    action: str
    generation: int
    message_id: str


@dataclass(frozen=True)
class ToolResult:
    """A tool's answer: the receipt to store, and the provider's raw response as received."""

    receipt: Mapping[str, Any]
    raw: str | None = None
