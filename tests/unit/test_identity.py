"""Effect identity: what enters the key, what enters the fingerprint, what is refused."""

from __future__ import annotations

import math
import unicodedata
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dedupe import (
    CanonicalizationError,
    MissingFieldError,
    SpecError,
    ToolSpec,
    ValueTooLargeError,
    canonical_bytes,
    derive,
    idempotency_key,
)

EMAIL = ToolSpec(
    name="send_email",
    action="receipt",
    identity=("recipient",),
    bound=("recipient",),
    free=("subject", "body"),
    normalizers={"recipient": "email"},
)
CHARGE = ToolSpec(
    name="charge",
    identity=("customer",),
    bound=("customer", "amount", "currency"),
    normalizers={"customer": "id", "amount": "money", "currency": "upper"},
)


def test_reworded_free_content_keeps_key_and_fingerprint() -> None:
    a = derive(EMAIL, "order-1", {"recipient": "bob@example.com", "subject": "Hi", "body": "x"})
    b = derive(EMAIL, "order-1", {"recipient": "bob@example.com", "subject": "Hello!", "body": "y"})
    assert (a.key, a.fingerprint) == (b.key, b.fingerprint)


def test_changed_bound_field_keeps_key_but_changes_fingerprint() -> None:
    a = derive(CHARGE, "order-9", {"customer": "cus_1", "amount": "10.00", "currency": "usd"})
    b = derive(CHARGE, "order-9", {"customer": "cus_1", "amount": "12.00", "currency": "usd"})
    assert a.key == b.key
    assert a.fingerprint != b.fingerprint


def test_two_scopes_with_identical_arguments_are_two_effects() -> None:
    args = {"customer": "cus_1", "amount": "10", "currency": "EUR"}
    assert derive(CHARGE, "order-1", args).key != derive(CHARGE, "order-2", args).key


def test_action_tag_separates_effects_to_the_same_target() -> None:
    reminder = ToolSpec(
        name="send_email", action="reminder", identity=("recipient",), bound=("recipient",)
    )
    args = {"recipient": "bob@example.com"}
    assert derive(EMAIL, "o-1", args).key != derive(reminder, "o-1", args).key


def test_scope_replayed_the_next_day_maps_to_the_same_key(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    args = {"recipient": "bob@example.com"}
    first = derive(EMAIL, "event-77", args).key
    monkeypatch.setattr(time, "time", lambda: 1e10)
    monkeypatch.setattr(time, "time_ns", lambda: 10**19)
    assert derive(EMAIL, "event-77", args).key == first


def test_normalizers_resolve_spellings_of_one_target() -> None:
    a = derive(EMAIL, "s", {"recipient": "  Bob@Example.COM "})
    b = derive(EMAIL, "s", {"recipient": "bob@example.com"})
    assert a.key == b.key
    c = derive(CHARGE, "s", {"customer": " cus_1", "amount": "10.50", "currency": "usd"})
    d = derive(CHARGE, "s", {"customer": "cus_1", "amount": "10.5", "currency": "USD"})
    assert c.fingerprint == d.fingerprint


def test_float_money_is_refused() -> None:
    with pytest.raises(CanonicalizationError, match=r"charge\.amount: .*never a float"):
        derive(CHARGE, "s", {"customer": "c", "amount": 10.5, "currency": "usd"})


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_are_refused(value: float) -> None:
    with pytest.raises(CanonicalizationError, match="NaN and Infinity"):
        canonical_bytes({"x": value})


def test_non_string_dict_keys_are_refused() -> None:
    with pytest.raises(CanonicalizationError, match="keys must be strings"):
        canonical_bytes({1: "a"})


def test_oversized_values_are_refused() -> None:
    with pytest.raises(ValueTooLargeError, match="over the"):
        derive(EMAIL, "s", {"recipient": "a@b.co", "body": "x" * 70_000})


def test_missing_identity_field_is_refused_by_name() -> None:
    expected = r"missing identity/bound arguments \['recipient'\]"
    with pytest.raises(MissingFieldError, match=expected):
        derive(EMAIL, "s", {"subject": "hi"})


def test_undeclared_argument_is_refused() -> None:
    with pytest.raises(MissingFieldError, match="undeclared arguments"):
        derive(EMAIL, "s", {"recipient": "a@b.co", "cc": "x@y.z"})


def test_invalid_email_error_never_echoes_the_recipient() -> None:
    with pytest.raises(CanonicalizationError) as info:
        derive(EMAIL, "s", {"recipient": "secret-person-at-nowhere"})
    assert "secret-person" not in str(info.value)


def test_lone_surrogates_are_refused() -> None:
    with pytest.raises(CanonicalizationError, match="not valid Unicode"):
        canonical_bytes({"x": "\ud800"})


def test_spec_refuses_retention_shorter_than_provider_window() -> None:
    with pytest.raises(SpecError, match="retention_s"):
        ToolSpec(name="t", identity=("a",), provider_window_s=100, retention_s=10)


def test_spec_refuses_free_field_that_is_effect_bearing() -> None:
    with pytest.raises(SpecError, match="free fields"):
        ToolSpec(name="t", identity=("a",), bound=("b",), free=("b",))


def test_idempotency_key_is_the_key_at_generation_zero_and_fresh_after() -> None:
    key = derive(EMAIL, "s", {"recipient": "a@b.co"}).key
    assert idempotency_key(key, 0) == key
    assert idempotency_key(key, 1) not in (key, idempotency_key(key, 2))


# -- properties ---------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(min_size=1), json_values, min_size=1, max_size=6))
def test_canonical_form_is_stable_under_dict_ordering(d: dict[str, Any]) -> None:
    reversed_d = dict(reversed(list(d.items())))
    assert canonical_bytes(d) == canonical_bytes(reversed_d)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=30))
def test_key_is_stable_under_unicode_normal_forms(name: str) -> None:
    spec = ToolSpec(name="set_value", identity=("target",), bound=("value",))
    forms = {unicodedata.normalize(f, name) for f in ("NFC", "NFD")}
    keys = {derive(spec, "op-1", {"target": f, "value": f}).key for f in forms}
    prints = {derive(spec, "op-1", {"target": f, "value": f}).fingerprint for f in forms}
    assert len(keys) == 1 and len(prints) == 1


anything = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
    | st.binary(max_size=4)
    | st.decimals(allow_nan=True),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.one_of(st.text(), st.integers()), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(anything)
def test_any_value_canonicalizes_or_raises_the_specific_error(value: Any) -> None:
    try:
        out = canonical_bytes(value)
    except (CanonicalizationError, ValueTooLargeError):
        return
    assert isinstance(out, bytes)
    out.decode("utf-8")
