"""The README's Stripe charge as `effectq worker` and `effectq reconciler` import it
(``EFFECTQ_TOOLS=tests.providers.readme_tools``) in ``test_readme_stripe.py``: the README's
declaration and body, with three test-only changes — Stripe's base URL is the local fake
(``STRIPE_API_BASE``), the lease is 2 s and the settle windows 1-2 s (so the test waits
seconds, not the README's 30 s lease and Search's minute), and the name is
``stripe_charge`` (``workers.examples`` already declares a ``charge`` in the test process).
"""

from __future__ import annotations

import os

from reconciler.providers.stripe_payments import StripePaymentIntents
from workers import EffectCall, ToolResult, effect_tool

stripe_pi = StripePaymentIntents(
    lambda: os.environ["STRIPE_API_KEY"],
    api_base=lambda: os.environ["STRIPE_API_BASE"],
    search_settle_s=2.0,
    events_settle_s=1.0,
)


@effect_tool(
    name="stripe_charge",
    identity=("customer",),
    bound=("customer", "amount", "currency", "payment_method"),
    normalizers={"customer": "id", "currency": "upper"},
    lease_s=2,
    provider_window_s=86400,  # Stripe keeps idempotency keys 24 h
    lookup=stripe_pi,  # what the reconciler asks: recorded id, Search, Events
)
def charge(
    call: EffectCall, customer: str, amount: int, currency: str, payment_method: str
) -> ToolResult:
    return ToolResult(
        *stripe_pi.execute(
            call, amount=amount, currency=currency, customer=customer,
            payment_method=payment_method, confirm=True,
        )
    )  # fmt: skip
