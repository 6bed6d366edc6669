"""One harness per adapter: its fake, how to make the adapter against it, a tool's
arguments, and the fake's switches under the contract suite's names. A new adapter joins
the contract suite by adding a harness here (docs/providers.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dedupe import ToolSpec
from reconciler.providers.base import CallLike, Executed
from reconciler.providers.postmark_email import PostmarkEmail
from reconciler.providers.stripe_payments import StripePaymentIntents
from reconciler.providers.twilio_sms import TwilioSms
from tests.providers.fakes.http import Fake
from tests.providers.fakes.postmark_fake import PostmarkFake
from tests.providers.fakes.stripe_fake import StripeFake
from tests.providers.fakes.twilio_fake import TwilioFake

#: Every lookup method's settle window in the suite, the lag the fakes show (inside it), and
#: the clock skew allowed for (one clock here).
SETTLE_S = 1.0
LAG_S = 0.6
SKEW_S = 0.5


@dataclass
class Harness:
    name: str
    make_fake: Callable[[], Fake]
    make_adapter: Callable[..., Any]  # (base_url, **overrides)
    spec: ToolSpec
    args: Callable[[int], dict[str, Any]]  # the i-th effect's arguments
    changed: Callable[[dict[str, Any]], dict[str, Any]]  # same key, another payload
    run: Callable[[Any, CallLike, dict[str, Any]], Executed]
    keyed: bool  # the provider takes an idempotency key (it refuses a changed payload)
    # A listing that cannot be read whole: fake switches, and the adapter's overrides.
    partial: Callable[[Any], None] = lambda fake: None
    partial_overrides: dict[str, Any] = field(default_factory=dict)
    others_for_partial: int = 0
    # The i-th other effect the partial listing holds besides the target's.
    other: Callable[[dict[str, Any], int], dict[str, Any]] = lambda a, i: {
        **a, "order": f"other-{i}",
    }  # fmt: skip

    def lag(self, fake: Any, seconds: float) -> None:
        fake.search_lag_s = seconds

    def executions(self, fake: Any, idempotency_key: str) -> int:
        return int(fake.executions[idempotency_key])


def _stripe_partial(fake: Any) -> None:
    fake.search_lag_s = 3600.0  # the search index is behind (an outage)
    fake.page_cap = 1


STRIPE = Harness(
    name="stripe",
    make_fake=StripeFake,
    make_adapter=lambda url, **o: StripePaymentIntents(
        "sk_test_fake",
        api_base=url,
        **{"search_settle_s": SETTLE_S, "events_settle_s": SETTLE_S, "skew_s": SKEW_S, **o},
    ),
    spec=ToolSpec(name="stripe_charge", identity=("order",), bound=("amount", "currency")),
    args=lambda i: {"order": f"o-{i}", "amount": 1000 + i, "currency": "usd"},
    changed=lambda a: {**a, "amount": a["amount"] + 1},
    run=lambda adapter, call, a: adapter.execute(
        call,
        amount=a["amount"],
        currency=a["currency"],
        confirm=True,
        payment_method="pm_card_visa",
    ),
    keyed=True,
    # Search behind and inside its settle window: Events must answer, 1 a page, 2 read.
    partial=_stripe_partial,
    partial_overrides={"search_settle_s": 3600.0, "max_pages": 2},
    others_for_partial=3,
)


def _postmark_partial(fake: Any) -> None:
    fake.page_cap = 0  # TotalCount counts the message; the page serves none of it


POSTMARK = Harness(
    name="postmark",
    make_fake=PostmarkFake,
    make_adapter=lambda url, **o: PostmarkEmail(
        "server-token", api_base=url + "/", **{"settle_s": SETTLE_S, "skew_s": SKEW_S, **o}
    ),
    spec=ToolSpec(
        name="postmark_receipt",
        identity=("order",),
        bound=("sender", "to", "subject"),
        free=("text",),
    ),
    args=lambda i: {
        "order": f"o-{i}",
        "sender": "shop@example.com",
        "to": f"buyer{i}@example.com",
        "subject": "Your receipt",
        "text": "Thank you",
    },
    changed=lambda a: {**a, "to": "someone.else@example.com"},
    run=lambda adapter, call, a: adapter.execute(
        call, sender=a["sender"], to=a["to"], subject=a["subject"], text=a["text"]
    ),
    keyed=False,
    partial=_postmark_partial,
)


def _twilio_partial(fake: Any) -> None:
    fake.page_cap = 1


TWILIO = Harness(
    name="twilio",
    make_fake=TwilioFake,
    make_adapter=lambda url, **o: TwilioSms(
        "AC" + "0" * 32,
        "auth-token",
        api_base=url,
        status_callback="https://hooks.example.com/twilio/status",
        **{"settle_s": SETTLE_S, "skew_s": SKEW_S, **o},
    ),
    spec=ToolSpec(name="twilio_sms", identity=("order",), bound=("to", "sender", "body")),
    args=lambda i: {
        "order": f"o-{i}",
        "to": f"+1500555{i:04d}",
        "sender": "+15005550001",
        "body": f"Your code is {1000 + i}",
    },
    changed=lambda a: {**a, "body": a["body"] + "!"},
    run=lambda adapter, call, a: adapter.execute(
        call, to=a["to"], sender=a["sender"], body=a["body"]
    ),
    keyed=False,
    # Texts to the same number after ours, 1 a page, 2 pages read.
    partial=_twilio_partial,
    partial_overrides={"max_pages": 2},
    others_for_partial=3,
    other=lambda a, i: {**a, "order": f"other-{i}", "body": f"Another text {i}"},
)

HARNESSES = [STRIPE, POSTMARK, TWILIO]
