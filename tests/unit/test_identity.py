"""Effect identity: what enters the key, what enters the fingerprint, what is refused."""

from __future__ import annotations

import math
import unicodedata
from decimal import Decimal, InvalidOperation
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dedupe import (
    CanonicalizationError,
    IdentityError,
    MissingFieldError,
    SpecError,
    ToolSpec,
    ValueTooLargeError,
    canonical_bytes,
    derive,
    idempotency_key,
)
from dedupe.normalize import visible

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


SIZES = ToolSpec(name="sizes", identity=("to",), bound=("to", "note"), free=("body",))


@pytest.mark.parametrize(
    ("field", "size", "where"),
    [("to", 9_000, "sizes.identity"), ("note", 70_000, "sizes.bound"),
     ("body", 70_000, "sizes.free")],
)  # fmt: skip
def test_an_oversized_identity_bound_or_free_value_is_refused_whatever_its_spelling(
    field: str, size: int, where: str
) -> None:
    # Plain ASCII takes derive's fast spelling of the canonical forms: its bounds are the
    # same as canonical_bytes' (the bound form's 64 KiB was once skipped there).
    for value in ("x" * size, "é" * size):
        args = {"to": "a", "note": "n", field: value}
        with pytest.raises(ValueTooLargeError, match=rf"^{where}: canonical form is"):
            derive(SIZES, "s", args)


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
# An identity value's characters (tests/unit/test_identity_invisible.py: the rest).
@given(
    st.text(
        alphabet=st.characters(
            codec="utf-8", exclude_categories=["Cc", "Cf", "Co", "Cn", "Zl", "Zp"]
        ).filter(visible),
        min_size=1,
        max_size=30,
    )
)
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


# -- exactness, values as submitted, errors that never echo (issue 15) --------------------

LONG = "12345678901.123456789012345678"  # 29 significant digits: past the default context


def test_money_is_exact_past_28_significant_digits_and_the_last_digit_is_a_conflict() -> None:
    a = derive(CHARGE, "s", {"customer": "c", "amount": LONG, "currency": "usd"})
    b = derive(CHARGE, "s", {"customer": "c", "amount": LONG[:-1] + "9", "currency": "usd"})
    assert a.args["amount"] == LONG and a.normalized["amount"] == LONG
    assert a.key == b.key and a.fingerprint != b.fingerprint


@pytest.mark.parametrize(
    "amount",
    ["1e1000000", "1e-1000000", "-1E+999999999999", "9" * 65, 10**70, "1" + "0" * 5000,
     Decimal("1e999999999"), "1e" + "9" * 300, "0." + "0" * 70 + "1"],
)  # fmt: skip
def test_money_outside_its_bounds_is_a_value_error_never_an_overflow(amount: Any) -> None:
    with pytest.raises(ValueTooLargeError, match=r"^charge\.amount: ") as info:
        derive(CHARGE, "s", {"customer": "c", "amount": amount, "currency": "usd"})
    assert str(amount)[:12] not in str(info.value)


def test_the_tool_receives_the_address_as_submitted_and_the_key_merges_its_spellings() -> None:
    sent = derive(EMAIL, "s", {"recipient": " Stra\u00dfe@example.de\n"})
    assert sent.args["recipient"] == "Stra\u00dfe@example.de"
    nfd = unicodedata.normalize("NFD", "STRASSE@Example.DE")
    assert derive(EMAIL, "s", {"recipient": nfd}).key == sent.key
    assert derive(EMAIL, "s", {"recipient": "strasse@example.de"}).key == sent.key


@pytest.mark.parametrize(
    ("normalizer", "submitted", "received"),
    [("email", " Bob@Example.COM ", "Bob@Example.COM"), ("casefold", " Ab ", "Ab"),
     ("upper", " usd ", "usd"), ("id", " Cus_7 ", "Cus_7"), ("id", 42, 42),
     ("money", " 10.50 ", "10.50"), ("money", 10, 10), ("money", Decimal("1E+3"), "1E+3"),
     ("strip", " x ", "x"), ("text", " x ", " x "),
     ("text", unicodedata.normalize("NFD", "\u00e9"), "\u00e9")],
)  # fmt: skip
def test_every_normalizer_hands_the_tool_the_value_as_submitted(
    normalizer: str, submitted: Any, received: Any
) -> None:
    spec = ToolSpec(name="t", identity=("f",), bound=("f",), normalizers={"f": normalizer})
    effect = derive(spec, "s", {"f": submitted})
    assert effect.args["f"] == received and type(effect.args["f"]) is type(received)
    # A worker derives again from the envelope's arguments: same key, same arguments.
    again = derive(spec, "s", dict(effect.args))
    assert (again.key, again.fingerprint, again.args) == (
        effect.key,
        effect.fingerprint,
        effect.args,
    )


@pytest.mark.parametrize(
    "address",
    ["a@@x.com", "<a@x.com>", "Bob <a@x.com>", "a@x.com>", "a b@x.com", "a@x .com", "@x.com",
     "a@", "a@x.com,b@y.com", "a@x.com;b@y.com", "a@x.com\r\nBcc: c@y.com", "a\x00@x.com",
     "a@x..com", ".a@x.com", "a.@x.com", "a..b@x.com", '"a b"@x.com', "a@[127.0.0.1]",
     "a@-x.com", "a@x-.com", "a@x", "a@x.c\u200bom", "a\u202e@x.com", "a(c)@x.com",
     "a@x.com.", "a" * 65 + "@x.com", "a@" + "x" * 64 + ".com", "mailto:a@x.com"],
)  # fmt: skip
def test_addresses_that_are_not_addresses_are_refused(address: str) -> None:
    with pytest.raises(CanonicalizationError, match=r"^send_email\.recipient: ") as info:
        derive(EMAIL, "s", {"recipient": address})
    assert address.strip() not in str(info.value)


@pytest.mark.parametrize(
    "address",
    [
        "Stra\u00dfe@example.de",
        "o'brien+tag@mail.example.co.uk",
        "\u7528\u6237@\u4f8b\u5b50.\u5e7f\u544a",
        "x@xn--bcher-kva.example",
    ],
)
def test_real_addresses_are_accepted(address: str) -> None:
    assert derive(EMAIL, "s", {"recipient": address}).args["recipient"] == address


def _raises(exc: BaseException) -> Any:
    def normalizer(value: Any) -> Any:
        raise exc

    return normalizer


@pytest.mark.parametrize(
    "exc",
    [ZeroDivisionError(), ValueError("4111111111111111"), KeyError("4111111111111111"),
     RecursionError(), InvalidOperation(), CanonicalizationError("4111111111111111")],
)  # fmt: skip
def test_a_normalizer_raising_anything_is_an_identity_error_naming_only_the_field(
    exc: BaseException,
) -> None:
    spec = ToolSpec(name="t", identity=("card",), normalizers={"card": _raises(exc)})
    with pytest.raises(CanonicalizationError, match=r"^t\.card: ") as info:
        derive(spec, "s", {"card": "4111111111111111"})
    assert "4111111111111111" not in str(info.value) + repr(info.value.details)


@pytest.mark.parametrize(
    ("spec", "args"),
    [(CHARGE, {"customer": 10**5000, "amount": "1", "currency": "usd"}),
     (CHARGE, {"customer": 4111111111111111111, "amount": "1", "currency": "usd"}),
     (ToolSpec(name="t", identity=("v",)), {"v": 4111111111111111111}),
     (ToolSpec(name="t", identity=("v",)), {"v": 10**5000}),
     (ToolSpec(name="t", identity=("v",)), {"v": [1.5, 4111111111111111111]}),
     (ToolSpec(name="t", identity=("v",), free=("w",)), {"v": 1, "w": {"n": 4111111111111111111}}),
     (ToolSpec(name="t", identity=("v",)), {"v": 1, "4111111111111111": 2}),
     (ToolSpec(name="t", identity=("v",)), {"v": 1, 4111111111111111: 2, "x": 1})],
)  # fmt: skip
def test_identity_errors_never_echo_the_value(spec: ToolSpec, args: dict[Any, Any]) -> None:
    with pytest.raises(IdentityError) as info:
        derive(spec, "s", args)
    text = str(info.value) + repr(info.value.details)
    assert "4111111111" not in text and "0000000000" not in text


@pytest.mark.parametrize(
    "key", ["", "0" * 63, "0" * 65, "A" * 64, "0" * 63 + "\n", "g" * 64, "bob@example.com", 42]
)
def test_a_malformed_key_is_a_key_format_error_that_never_echoes_it(key: Any) -> None:
    from dedupe.errors import KeyFormatError
    from dedupe.identity import check_key

    with pytest.raises(KeyFormatError, match="64 lowercase hex") as info:
        check_key(key)
    assert isinstance(info.value, IdentityError)
    assert "bob@" not in str(info.value)
    assert check_key("ab" * 32) == "ab" * 32


@pytest.mark.parametrize(
    ("amount", "key"),
    [("0.0101", "0.0101"), ("101e-4", "0.0101"), ("10.0101", "10.0101"), ("-0.50", "-0.5"),
     ("1.5E+3", "1500"), ("-0.000", "0"), (Decimal("-0E-7"), "0"), ("+7", "7"), (".5", "0.5")],
)  # fmt: skip
def test_money_key_form_is_the_exact_plain_decimal(amount: Any, key: str) -> None:
    assert (
        derive(CHARGE, "s", {"customer": "c", "amount": amount, "currency": "usd"}).normalized[
            "amount"
        ]
        == key
    )


def test_a_value_refused_before_a_users_normalizer_runs_says_why() -> None:
    spec = ToolSpec(name="t", identity=("f",), normalizers={"f": lambda v: v})
    with pytest.raises(CanonicalizationError, match=r"^t\.f\[0\]: NaN and Infinity"):
        derive(spec, "s", {"f": [math.nan]})
