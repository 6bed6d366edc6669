"""``workers.guard`` on its own (no framework): what a guarded call answers the model in
each case, against real workers, the reconciler and the sandbox."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from dedupe import MissingFieldError
from tests.support.stack import broker_messages
from workers import EffectTool, get_tool, runtime
from workers.dev.local import LocalStack
from workers.guard import OutcomeStatus, effect_scope, guarded

ORDER = {"customer": "cus_7", "amount": "10.50", "currency": "usd"}


@pytest.fixture
def charge(fenceless: LocalStack) -> EffectTool:
    return get_tool("charge")


def test_a_changed_bound_argument_is_a_conflict_and_never_executes(
    fenceless: LocalStack, charge: EffectTool
) -> None:
    fenceless.start_workers(1, 2)
    pay = guarded(charge, scope="order-7")
    first = pay(**ORDER)
    assert first.status is OutcomeStatus.DONE and not first.replayed
    changed = pay(**{**ORDER, "amount": "99.00"})
    assert changed.status is OutcomeStatus.CONFLICT and changed.key == first.key
    assert "NOT executed: conflict" in str(changed) and first.key in str(changed)
    assert "amount" in str(changed)
    again = pay(**ORDER)  # the original call, repeated: its receipt, nothing new
    assert again.status is OutcomeStatus.DONE and again.replayed
    assert again.receipt == first.receipt
    assert fenceless.stats()["executions"] == {first.key: 1}


def test_past_its_timeout_a_call_is_pending_and_calling_again_never_resubmits(
    fenceless: LocalStack, charge: EffectTool
) -> None:
    impatient = guarded(charge, scope="order-8", timeout=0.3)
    first = impatient(**ORDER)  # no worker is running yet
    assert first.status is OutcomeStatus.PENDING and "still pending" in str(first)
    assert first.key is not None and first.key in str(first)
    second = impatient(**ORDER)
    assert second.status is OutcomeStatus.PENDING and second.replayed
    assert second.key == first.key
    assert broker_messages(fenceless)["live"] == 1  # one message, however often called
    fenceless.start_workers(1, 2)
    done = guarded(charge, scope="order-8", timeout=30)(**ORDER)
    assert done.status is OutcomeStatus.DONE and done.key == first.key
    assert fenceless.stats()["executions"] == {first.key: 1}


def test_an_unknown_outcome_waits_for_an_operator_and_is_never_refired(
    fenceless: LocalStack, charge: EffectTool
) -> None:
    # The provider executes, the worker dies before recording it, and lookups fail: the
    # reconciler cannot establish the outcome and leaves it UNKNOWN.
    fenceless.sandbox.configure(lookup_enabled=False)
    fenceless.start_workers(1, 2, EFFECTQ_FAILPOINTS="after_effect=kill")
    fenceless.start_reconciler(EFFECTQ_RECONCILER_BUDGET="3", EFFECTQ_RECONCILER_BACKOFF_S="0.1")
    pay = guarded(charge, scope="order-9", timeout=60)
    first = pay(**ORDER)
    assert first.status is OutcomeStatus.UNKNOWN
    assert "outcome unknown, waiting for an operator" in str(first)
    assert first.key is not None and first.key in str(first)
    retry = pay(**ORDER)
    assert retry.status is OutcomeStatus.UNKNOWN and retry.replayed
    assert fenceless.stats()["executions"] == {first.key: 1}


def test_the_model_cannot_choose_the_scope_or_the_generation(
    fenceless: LocalStack, charge: EffectTool
) -> None:
    pay = guarded(charge, scope="order-10")
    refused = pay(**ORDER, scope="order-11", generation=2)
    assert refused.status is OutcomeStatus.INVALID and refused.key is None
    assert "generation, scope cannot be set by a tool call" in str(refused)
    for scope in ("order-10", "order-11"):
        assert runtime.ledger().get(charge.derive(scope, ORDER).key) is None
    assert broker_messages(fenceless)["live"] == 0


def test_without_a_runtime_scope_the_integrator_gets_an_error_not_the_model(
    fenceless: LocalStack, charge: EffectTool
) -> None:
    with pytest.raises(MissingFieldError, match="no scope for this call"):
        guarded(charge)(**ORDER)
    with effect_scope("order-12"):
        pending = guarded(charge, timeout=0)(**ORDER)
    assert pending.key == charge.derive("order-12", ORDER).key


CUSTOMERS = {"ana@example.com": "cus_7"}


def _by_email(args: Mapping[str, Any]) -> Mapping[str, Any]:
    found = CUSTOMERS.get(str(args["customer"]).strip().casefold())
    if found is None:
        raise LookupError("no customer with that email address")
    return {**args, "customer": found}


def test_identity_is_keyed_on_the_customer_the_resolver_found(
    fenceless: LocalStack, charge: EffectTool
) -> None:
    pay = guarded(charge, scope="order-13", timeout=0, resolver=_by_email)
    one = pay(**{**ORDER, "customer": "Ana@Example.com"})
    other = pay(**{**ORDER, "customer": " ana@example.com "})
    assert one.key == other.key == charge.derive("order-13", ORDER).key
    assert broker_messages(fenceless)["live"] == 1
    stranger = pay(**{**ORDER, "customer": "bob@example.com"})
    assert stranger.status is OutcomeStatus.INVALID
    assert "could not resolve the arguments: no customer with that email" in str(stranger)


def test_a_rejected_effect_is_reported_failed_with_its_reason_not_pending(
    fenceless: LocalStack,
) -> None:
    from tests.agents.refusing_tools import refused_charge

    fenceless.start_workers(1, 2, EFFECTQ_TOOLS="tests.agents.refusing_tools")
    pay = guarded(refused_charge, scope="order-14", timeout=20)
    first = pay(customer="cus_7", amount="10.50")
    assert first.status is OutcomeStatus.FAILED, str(first)
    assert "NOT executed" in str(first) and "card declined" in str(first)
    assert first.key is not None and first.key in str(first)
    assert fenceless.stats()["total"] == 0
