"""The shipped example tools (DESIGN §8), calling the provider at ``EFFECTQ_PROVIDER_URL``.

Run them with ``effectq worker`` or plain ``dramatiq workers.examples``.
"""

from __future__ import annotations

from reconciler import HttpLookup

from .provider import post_effect
from .settings import settings
from .tool import EffectCall, ToolResult, effect_tool

# The reconciler asks the same provider; the URL is read when it first looks something up.
_lookup = HttpLookup(lambda: settings().provider_url)

__all__ = ["charge", "send_email", "set_value"]


@effect_tool(
    identity=("recipient",),
    bound=("recipient",),
    free=("subject", "body"),
    action="receipt",
    actions=("reminder", "notice"),
    normalizers={"recipient": "email"},
    lookup=_lookup,
    lease_s=settings().example_lease_s,
    settle_s=settings().example_settle_s,
)
def send_email(call: EffectCall, recipient: str, subject: str = "", body: str = "") -> ToolResult:
    payload = {"tool": "send_email", "action": call.action, "to": recipient, "subject": subject}
    return post_effect(call, {**payload, "body": body})


@effect_tool(
    identity=("customer",),
    bound=("customer", "amount", "currency"),
    normalizers={"customer": "id", "amount": "money", "currency": "upper"},
    lookup=_lookup,
    lease_s=settings().example_lease_s,
    settle_s=settings().example_settle_s,
)
def charge(call: EffectCall, customer: str, amount: str, currency: str) -> ToolResult:
    body = {"tool": "charge", "customer": customer, "amount": amount, "currency": currency}
    return post_effect(call, body)


@effect_tool(
    identity=("target",),
    bound=("value",),
    normalizers={"target": "id"},
    lookup=_lookup,
    lease_s=settings().example_lease_s,
    settle_s=settings().example_settle_s,
)
def set_value(call: EffectCall, target: str, value: object) -> ToolResult:
    return post_effect(call, {"tool": "set_value", "target": target, "value": value})
