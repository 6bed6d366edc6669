"""The README's Stripe charge end to end on the Stripe fake: real `effectq worker` processes
(one SIGKILLed right after Stripe executed, before its commit), a real `effectq reconciler`,
the official SDK on both sides. The reconciler finds the intent at Stripe: DONE "found at
the provider", one execution, and the redelivered message is a duplicate."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dedupe import State
from tests.providers.fakes.http import serving
from tests.providers.fakes.stripe_fake import StripeFake
from tests.support.stack import wait_for, wait_states
from workers import runtime, submit
from workers.dev.local import LocalStack


@pytest.fixture
def stripe_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[StripeFake, dict[str, str]]]:
    fake = StripeFake()
    with serving(fake) as url:
        env = {
            "EFFECTQ_TOOLS": "tests.providers.readme_tools",
            "STRIPE_API_KEY": "sk_test_fake",
            "STRIPE_API_BASE": url,
        }
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        yield fake, env


def test_readme_charge_killed_after_stripe_executed_is_done_found_at_the_provider_once(
    live: LocalStack, stripe_env: tuple[StripeFake, dict[str, str]]
) -> None:
    fake, env = stripe_env
    import tests.providers.readme_tools  # noqa: F401  (declares stripe_charge here too)

    live.start_workers(1, 2, EFFECTQ_FAILPOINTS="after_effect=kill", **env)
    live.start_reconciler(**env)
    key = submit(
        "stripe_charge", scope="order-1042", customer="cus_7", amount=1050, currency="usd",
        payment_method="pm_card_visa",
    ).key  # fmt: skip
    wait_for(lambda: "restarting in" in live.log("workers.log"),
             what="worker SIGKILLed after Stripe executed")  # fmt: skip
    [record] = wait_states(runtime.ledger(), [key], timeout=60).values()
    assert record is not None and record.state is State.DONE
    assert record.reason == "reconciled: found at the provider"
    [intent] = fake.intents.values()
    assert record.receipt is not None
    assert record.receipt["provider_object_id"] == intent["id"]
    assert intent["metadata"]["effectq_key"] == record.idempotency_key
    assert dict(fake.executions) == {record.idempotency_key: 1}
