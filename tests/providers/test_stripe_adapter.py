"""What only the Stripe adapter decides: a replayed 500 proves nothing either way, the key's
length and characters, the error map, and Events past their 30-day retention."""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import stripe

from dedupe import NotExecutedError, RejectedError
from dedupe.spec import Found, LookupContext, Unavailable
from reconciler.providers.base import provider_key
from reconciler.providers.stripe_payments import StripePaymentIntents
from tests.providers.fakes.http import serving
from tests.providers.fakes.stripe_fake import StripeFake

KEY = "ab" * 32


@pytest.fixture
def stripe_fake() -> Iterator[tuple[StripeFake, StripePaymentIntents]]:
    fake = StripeFake()
    with serving(fake) as url:
        yield (
            fake,
            StripePaymentIntents(
                "sk_test_fake", api_base=url, search_settle_s=1.0, events_settle_s=1.0
            ),
        )


def _call(key: str = KEY) -> SimpleNamespace:
    return SimpleNamespace(key=key, idempotency_key=key)


def _pay(adapter: StripePaymentIntents, key: str = KEY) -> object:
    return adapter.execute(_call(key), amount=500, currency="eur", confirm=True,
                           payment_method="pm_card_visa")  # fmt: skip


def test_a_replayed_500_is_uncertain_every_time_and_the_lookup_finds_the_intent(
    stripe_fake: tuple[StripeFake, StripePaymentIntents],
) -> None:
    fake, adapter = stripe_fake
    fake.replay_500 = True
    for _ in range(2):  # the first 500 is saved: the retry under the key replays it
        with pytest.raises(stripe.APIError) as raised:
            _pay(adapter)
        assert not isinstance(raised.value, NotExecutedError)
    assert fake.executions[KEY] == 1
    now = int(time.time() * 1000)
    found = adapter.lookup_effect(LookupContext(
        key=KEY, idempotency_key=KEY, token=2, tool="pay", generation=0,
        claimed_ms=now - 10_000, now_ms=now, args={"amount": 500, "currency": "eur"},
    ))  # fmt: skip
    assert isinstance(found, Found)
    assert found.receipt["status"] == "succeeded"


def test_a_request_refused_before_execution_is_rejected_not_uncertain(
    stripe_fake: tuple[StripeFake, StripePaymentIntents],
) -> None:
    _fake, adapter = stripe_fake
    with pytest.raises(RejectedError):  # a 400 before execution: Stripe saved nothing
        adapter.execute(_call(), amount="lots", currency="eur")  # type: ignore[arg-type]
    assert issubclass(RejectedError, NotExecutedError)


def test_events_past_their_retention_never_rule_the_effect_out(
    stripe_fake: tuple[StripeFake, StripePaymentIntents],
) -> None:
    """Stripe lists events of the last 30 days: an older claim's empty listing says
    nothing (Search, which keeps intents, still may)."""
    _fake, adapter = stripe_fake
    now = int(time.time() * 1000)
    old = LookupContext(
        key=KEY, idempotency_key=KEY, token=2, tool="pay", generation=0,
        claimed_ms=now - 31 * 86_400_000, now_ms=now,
    )  # fmt: skip
    result = adapter._by_events(old)
    assert isinstance(result, Unavailable)
    assert "retention" in result.reason


@pytest.mark.parametrize("max_len", [255, 64, 45, 32])
def test_the_provider_key_fits_the_provider_and_keeps_128_bits(max_len: int) -> None:
    key = provider_key(KEY, max_len=max_len)
    assert len(key) <= max_len
    assert KEY[:32] in key
    assert provider_key(KEY, max_len=max_len, dash=False).isalnum()
    with pytest.raises(ValueError):
        provider_key(KEY, max_len=31)
