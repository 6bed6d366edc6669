"""Identity properties, for every shipped normalizer (README "Effect identity"):

* the tool receives the value as submitted (up to NFC and trimming), and deriving again
  from what the tool receives — as a worker does from the envelope — gives the same effect;
* equal keys mean the same effect as the docs define it: spellings of one value (case, NFC,
  surrounding whitespace, trailing zeros) give one key;
* unequal bound values give another fingerprint (a conflict), money included, to its last
  digit and at the edges of its bounds;
* any input derives or raises a specific IdentityError subclass whose message and details
  never contain the value.
"""

from __future__ import annotations

import json
import unicodedata
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dedupe import Effect, IdentityError, ToolSpec, derive
from dedupe.normalize import MONEY_MAX_DIGITS, MONEY_MAX_EXPONENT, NORMALIZERS, visible

PROPS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _spec(normalizer: Any) -> ToolSpec:
    norms = {} if normalizer is None else {"f": normalizer}
    return ToolSpec(name="t", identity=("f",), bound=("f",), free=("w",), normalizers=norms)


SPECS = {name: _spec(name) for name in NORMALIZERS} | {"none": _spec(None)}


def _derive(name: str, value: Any) -> Effect:
    return derive(SPECS[name], "scope-1", {"f": value})


def _same_effect_again(name: str, effect: Effect) -> None:
    again = derive(SPECS[name], effect.scope, json.loads(json.dumps(effect.args)))
    assert (again.key, again.fingerprint) == (effect.key, effect.fingerprint)
    assert again.args == effect.args


# -- strategies ----------------------------------------------------------------------------

SPACE = st.sampled_from(["", " ", "  ", "\t", "\n", "\u00a0", "\u2003"])
ATEXT = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&'*+/=?^_`{|}~-"
# Not the Hangul fillers: letters by category, invisible (default-ignorable), refused.
LETTERS = st.characters(
    categories=["Lu", "Ll", "Lo"], exclude_characters="\u0130\u115f\u1160\u3164\uffa0"
)
# What an identity value may hold (tests/unit/test_identity_invisible.py: the rest).
VISIBLE = st.characters(
    codec="utf-8", exclude_categories=["Cc", "Cf", "Co", "Cn", "Zl", "Zp"]
).filter(visible)
atom = st.text(st.one_of(st.sampled_from(ATEXT), LETTERS), min_size=1, max_size=8)
label = st.from_regex(r"[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,8}[a-zA-Z0-9])?", fullmatch=True)
tld = st.from_regex(r"[a-zA-Z]{2,6}", fullmatch=True)
addresses = st.builds(
    lambda atoms, labels, top: ".".join(atoms) + "@" + ".".join([*labels, top]),
    st.lists(atom, min_size=1, max_size=3),
    st.lists(label, min_size=1, max_size=2),
    tld,
).filter(lambda a: len(a.partition("@")[0]) <= 64)

# (negative, significant digits, exponent) within the money bounds
money_parts = st.integers(1, MONEY_MAX_DIGITS).flatmap(
    lambda n: st.tuples(
        st.booleans(),
        st.from_regex(rf"[1-9]([0-9]{{{n - 2}}}[1-9])?" if n > 1 else r"[1-9]", fullmatch=True),
        st.integers(-MONEY_MAX_EXPONENT, MONEY_MAX_EXPONENT - n),
    )
)


def _plain(negative: bool, digits: str, exponent: int, pad: int = 0) -> str:
    """A plain spelling, with ``pad`` extra trailing zeros after the point."""
    if exponent >= 0:
        text = digits + "0" * exponent + ("." + "0" * pad if pad else "")
    else:
        point = len(digits) + exponent
        whole = digits[:point] if point > 0 else "0"
        frac = "0" * max(-point, 0) + digits[max(point, 0) :] + "0" * pad
        text = f"{whole}.{frac}"
    return f"-{text}" if negative else text


def _spellings(negative: bool, digits: str, exponent: int) -> list[Any]:
    sign = "-" if negative else ""
    out: list[Any] = [
        _plain(negative, digits, exponent),
        _plain(negative, digits, exponent, pad=3),
        f" {sign}{digits}e{exponent} ",
        f"{sign}{digits}00E{exponent - 2:+d}",
        Decimal(f"{sign}{digits}E{exponent}"),
    ]
    if exponent >= 0:
        out.append(int(f"{sign}{digits}") * 10**exponent)
    return out


# -- the tool receives the value as submitted ---------------------------------------------


@PROPS
@given(addresses, SPACE, SPACE, st.sampled_from(["NFC", "NFD"]))
def test_email_tool_receives_the_address_as_written_and_spellings_share_a_key(
    address: str, before: str, after: str, form: str
) -> None:
    submitted = unicodedata.normalize(form, before + address + after)
    effect = _derive("email", submitted)
    assert effect.args["f"] == unicodedata.normalize("NFC", address).strip()
    _same_effect_again("email", effect)
    # Caseless-equal spellings (Unicode default case folding: dotless i is not i) are one key.
    ascii_swapped = "".join(c.swapcase() if c.isascii() else c for c in address)
    for variant in (ascii_swapped, address.casefold()):
        try:
            other = _derive("email", variant)
        except IdentityError:
            continue  # folding may leave the address grammar ("ﬃ" folds to "ffi": fine)
        assert other.key == effect.key and other.fingerprint == effect.fingerprint
        assert other.args["f"] == unicodedata.normalize("NFC", variant).strip()


@PROPS
@given(st.sampled_from(["text", "strip", "casefold", "upper"]), st.text(VISIBLE, min_size=1), SPACE)
def test_text_normalizers_hand_over_nfc_and_key_the_normalized_form(
    name: str, text: str, pad: str
) -> None:
    assume(name != "text" or visible(pad))  # text does not trim: a tab in an identity is refused
    if name == "upper":  # letters whose capital is not their one-letter pair are refused
        try:
            NORMALIZERS["upper"].key(text)
        except IdentityError:
            assume(False)
    submitted = pad + unicodedata.normalize("NFD", text) + pad
    effect = _derive(name, submitted)
    trimmed = unicodedata.normalize("NFC", submitted)
    expected = trimmed if name == "text" else trimmed.strip()
    assert effect.args["f"] == expected
    _same_effect_again(name, effect)
    assert _derive(name, unicodedata.normalize("NFC", submitted)).key == effect.key
    if name in ("casefold", "upper") and expected.isascii():
        assert _derive(name, expected.swapcase()).key == effect.key


@PROPS
@given(st.one_of(st.integers(-(2**53) + 1, 2**53 - 1), st.text(VISIBLE, min_size=1)), SPACE)
def test_id_tool_receives_the_id_as_submitted(value: Any, pad: str) -> None:
    if isinstance(value, str):
        assume(value.strip())
        value = pad + value + pad
    effect = _derive("id", value)
    expected = value if isinstance(value, int) else unicodedata.normalize("NFC", value).strip()
    assert effect.args["f"] == expected and type(effect.args["f"]) is type(expected)
    _same_effect_again("id", effect)
    assert _derive("id", str(expected)).key == effect.key  # 42 and "42" are one id


@PROPS
@given(money_parts)
def test_money_spellings_of_one_amount_share_a_key_and_the_tool_gets_its_spelling(
    parts: tuple[bool, str, int],
) -> None:
    spellings = _spellings(*parts)
    effects = [_derive("money", s) for s in spellings]
    assert len({(e.key, e.fingerprint, e.normalized["f"]) for e in effects}) == 1
    assert Decimal(effects[0].normalized["f"]) == Decimal(str(spellings[-1]))  # exact
    for spelling, effect in zip(spellings, effects, strict=True):
        expected = spelling.strip() if isinstance(spelling, str) else spelling
        expected = str(expected) if isinstance(expected, Decimal) else expected
        assert effect.args["f"] == expected
        _same_effect_again("money", effect)


# -- unequal bound values conflict ---------------------------------------------------------


@PROPS
@given(money_parts, st.integers(1, 8))
def test_money_differing_in_its_last_digit_is_a_conflict(
    parts: tuple[bool, str, int], delta: int
) -> None:
    negative, digits, exponent = parts
    last = (int(digits[-1]) + delta) % 10
    assume(last != 0 or len(digits) > 1)
    other = digits[:-1] + str(last)
    a = _derive("money", _plain(negative, digits, exponent))
    b = _derive("money", _plain(negative, other, exponent))
    assert a.fingerprint != b.fingerprint


@PROPS
@given(money_parts, money_parts)
def test_money_fingerprints_agree_exactly_when_the_amounts_are_equal(
    a: tuple[bool, str, int], b: tuple[bool, str, int]
) -> None:
    x, y = _derive("money", _plain(*a)), _derive("money", _plain(*b))
    # Decimal comparison is exact, whatever the context's precision.
    assert (x.fingerprint == y.fingerprint) == (Decimal(_plain(*a)) == Decimal(_plain(*b)))


@pytest.mark.parametrize(
    ("a", "b"),
    [("9" * 64, "9" * 63 + "8"), ("0." + "0" * 63 + "1", "0." + "0" * 63 + "2"),
     ("1" + "0" * 63, "1" + "0" * 62 + "1"), ("-0." + "0" * 63 + "1", "0." + "0" * 63 + "1"),
     ("1e63", "1.000000000000000000000000000000000000000000000000000000000000001e63")],
)  # fmt: skip
def test_money_at_the_edges_of_its_bounds_is_exact(a: str, b: str) -> None:
    x, y = _derive("money", a), _derive("money", b)
    assert x.fingerprint != y.fingerprint
    assert Decimal(x.normalized["f"]) == Decimal(a) and Decimal(y.normalized["f"]) == Decimal(b)


@PROPS
@given(st.sampled_from(["text", "strip", "none"]), st.text(), st.text())
def test_different_text_is_a_conflict(name: str, a: str, b: str) -> None:
    try:
        x, y = _derive(name, a), _derive(name, b)
    except IdentityError:
        return
    same = x.normalized["f"] == y.normalized["f"]
    assert (x.fingerprint == y.fingerprint) == same


# -- any input derives or raises a specific identity error that never echoes it ------------

big_ints = st.one_of(
    st.integers(),
    st.builds(lambda e, s: s * 10**e + 7, st.integers(15, 6000), st.sampled_from([1, -1])),
)
look_alikes = st.sampled_from(
    ["\uff21@x.com", "a\uff20x.com", "a@x\u3002com", "\u0430@x.com", "a@x.c\u200bom",
     "\u202ea@x.com", "\uff11\uff10.5", "\u0661\u0660", "1_000", "1\u00a0000", "\ufeff10",
     "12345678901234567890123456789012345678901234567890123456789012345", "NaN", "-Infinity",
     "sNaN", "1e999999999", "0x10", "1,5", "\U0001d7d9.5", "a@b@c.de", "<a@b.de>"]
)  # fmt: skip
decimals = st.one_of(
    st.decimals(allow_nan=True, allow_infinity=True),
    st.builds(
        lambda d, e: Decimal(f"{d}E{e}"),
        st.integers(0, 10**80),
        st.integers(-(10**12), 10**12),
    ),
)
scalars = st.one_of(
    st.none(), st.booleans(), big_ints, st.floats(allow_nan=True, allow_infinity=True),
    st.text(), look_alikes, st.binary(max_size=16), decimals,
    st.builds(bytearray, st.binary(max_size=8)), st.complex_numbers(),
    st.from_type(type).flatmap(st.from_type), st.sets(st.integers(), max_size=3),
)  # fmt: skip
anything = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), inner, max_size=3)
    ),
    max_leaves=8,
)


def _error(name: str, value: Any, slot: str) -> IdentityError | None:
    args = {"f": value} if slot == "f" else {"f": "1", "w": value}
    try:
        effect = derive(SPECS[name], "scope-1", args)
    except IdentityError as exc:
        return exc
    _same_effect_again(name, effect)
    return None


def _echoes(value: Any, text: str) -> bool:
    """Whether ``text`` shows ``value`` (not merely a word of a refusal's fixed wording)."""
    try:
        shown = {str(value), repr(value)}
    except ValueError:  # a huge int has no str(): it cannot be echoed either
        return False
    noise = TEMPLATES + type(value).__name__  # "got NotImplementedType" shows a type
    return any(len(s) >= 4 and s in text and s not in noise for s in shown)


# Every refusal's fixed wording, from canned inputs: a value that is a word of it is no echo.
TEMPLATES = " ".join(
    str(e)
    for e in (
        _error(n, v, "f")
        for n in SPECS
        for v in (
            None,
            1.5,
            True,
            "",
            " ",
            "a@",
            "a@@b.c",
            "1e999",
            "9" * 300,
            10**99,
            [float("nan")],
            {1: 2},
            b"xx",
            "\ud800",
            Decimal("NaN"),
            "abc",
        )
    )
    if e is not None
)


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(sorted(SPECS)), anything, st.sampled_from(["f", "w"]))
def test_any_input_derives_or_raises_a_specific_identity_error_that_never_echoes_it(
    name: str, value: Any, slot: str
) -> None:
    exc = _error(name, value, slot)
    if exc is None:
        return
    assert type(exc) is not IdentityError  # a subclass says which rule refused
    assert exc.message.startswith(("t.f", "t: ") if slot == "f" else "t")
    text = str(exc) + " " + repr(exc.details)
    assert not _echoes(value, text), text
    if isinstance(value, list | tuple | dict):
        for leaf in value.values() if isinstance(value, dict) else value:
            assert not _echoes(leaf, text), text


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from([ValueError, TypeError, ArithmeticError, KeyError, RuntimeError, OSError,
                     RecursionError, IndexError, UnicodeError, IdentityError]),
    st.text(min_size=4),
)  # fmt: skip
def test_a_users_normalizer_raising_anything_is_a_canonicalization_error_naming_the_field(
    kind: type[Exception], value: str
) -> None:
    def normalizer(v: Any) -> Any:
        raise kind(v)

    spec = ToolSpec(name="t", identity=("f",), normalizers={"f": normalizer})
    with pytest.raises(IdentityError) as info:
        derive(spec, "s", {"f": value})
    assert type(info.value) is not IdentityError or kind is IdentityError
    assert info.value.message.startswith("t.f: ")
    assert info.value.details == {"tool": "t", "field": "f"}
    assert info.value.message.endswith(f"({kind.__name__})")
