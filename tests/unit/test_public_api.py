"""The public surface of each package is deliberate: this fails when a name appears in or
disappears from an ``__all__`` without this list changing with it."""

from __future__ import annotations

import importlib

import pytest

PUBLIC = {
    "dedupe": {
        "CampaignNotFoundError", "CampaignPlan", "CampaignStore", "CanonicalizationError",
        "Claim", "ClaimOutcome", "ConflictError", "Effect", "EffectRecord", "EffectqError",
        "Found", "IdentityError",
        "KeyFormatError", "LayoutChangedError", "Ledger", "LedgerAuthError", "LedgerConfigError",
        "LedgerError", "LedgerUnavailableError", "Lookup", "LookupResult",
        "MessageError", "MissingFieldError", "NotExecutedError", "NotFound", "NotFoundError",
        "OperatorError", "ProviderError", "RecordTooLargeError", "RejectedError", "SpecError",
        "StaleMessageError", "State",
        "SubmitStatus", "Submission", "Takeover", "ToolSpec", "Transition",
        "TransitionRefusedError", "Unavailable", "ValueTooLargeError", "VolatileLedgerError",
        "WaitTimeout", "Write", "campaign_tag", "canonical_bytes", "derive", "idempotency_key",
    },
    "workers": {
        "CampaignReport", "EffectCall", "EffectTool", "Envelope", "Handle", "RetryLater",
        "Status", "ToolResult", "WaitTimeout", "campaign_status", "effect_tool", "get_tool",
        "submit", "submit_campaign",
    },
    "reconciler": {"Decision", "HttpLookup", "Operator", "Reconciler", "decide"},
}  # fmt: skip


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_public_names_are_exactly_the_declared_ones(package: str) -> None:
    module = importlib.import_module(package)
    assert set(module.__all__) == PUBLIC[package]
    for name in module.__all__:
        assert hasattr(module, name), name


@pytest.mark.parametrize("package", ["dedupe", "reconciler"])
def test_dependencies_point_one_way_no_dramatiq_below_workers(package: str) -> None:
    import subprocess
    import sys

    probe = (
        f"import {package}, sys; "
        "print(any(m.split('.')[0] in ('dramatiq', 'workers') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr
