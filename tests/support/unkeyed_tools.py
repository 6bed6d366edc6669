"""A tools module for the lost-writes guard: one tool whose provider keeps no idempotency
key (plain SMTP, say)."""

from __future__ import annotations

from typing import Any

from workers import EffectCall, effect_tool


@effect_tool(identity=("recipient",), bound=("recipient",))
def smtp_send(call: EffectCall, recipient: str) -> dict[str, Any]:
    return {"sent": call.key}
