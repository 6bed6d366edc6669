"""The shipped example tools plus one whose provider refuses every request outright, for
the guard tests (workers load it through ``EFFECTQ_TOOLS``; the test process imports it to
declare the same actor)."""

from __future__ import annotations

from dedupe import RejectedError
from workers.examples import charge, send_email, set_value
from workers.tool import EffectCall, ToolResult, effect_tool

__all__ = ["charge", "refused_charge", "send_email", "set_value"]


@effect_tool(identity=("customer",), bound=("customer", "amount"), normalizers={"amount": "money"})
def refused_charge(call: EffectCall, customer: str, amount: str) -> ToolResult:
    raise RejectedError("provider rejected the request: card declined", key=call.key)
