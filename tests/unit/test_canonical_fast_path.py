"""``canonical_bytes`` spells plain values with the standard library's JSON encoder and the
rest with ``rfc8785``: here both are held to the same bytes, on generated values that take
the fast path (strings of any code point, control characters included; integers; nested
arrays and objects with ASCII keys) and on the values that must not take it."""

from __future__ import annotations

import unicodedata
from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from dedupe.canonical import MAX_DEPTH, MAX_JSON_INT, _nfc, canonical_bytes, leaf_text
from dedupe.errors import CanonicalizationError

# Text of any code point but lone surrogates (not Unicode text: refused before encoding),
# weighted towards what encoders escape or reorder: controls, quotes, backslashes, U+2028,
# U+007F, characters above U+FFFF.
_SPECIAL = st.sampled_from(
    ['"', "\\", "\b", "\f", "\n", "\r", "\t", "\x00", "\x1f", "\x7f", "\u2028", "\u2029",
     "\ue000", "\uffff", "\U00010000", "\U0001f600", "é", "e\u0301"]
)  # fmt: skip
_TEXT = st.lists(st.one_of(_SPECIAL, st.characters(blacklist_categories=("Cs",))), max_size=12).map(
    "".join
)
_ASCII_KEY = st.text(st.characters(min_codepoint=0, max_codepoint=127), max_size=8)
_INT = st.integers(min_value=-MAX_JSON_INT, max_value=MAX_JSON_INT)
_SCALAR = st.one_of(st.none(), st.booleans(), _INT, _TEXT)
_PLAIN = st.recursive(
    _SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(_ASCII_KEY, inner, max_size=5)
    ),
    max_leaves=25,
)


def _reference(value: Any) -> bytes:
    out: bytes = rfc8785.dumps(_nfc(value, "$", 0, [True]))
    return out


@settings(max_examples=1500, deadline=None)
@given(_PLAIN)
def test_the_fast_path_spells_plain_values_as_rfc8785_does(value: Any) -> None:
    plain = [True]
    _nfc(value, "$", 0, plain)
    assert plain[0]
    assert canonical_bytes(value) == _reference(value)


@settings(max_examples=500, deadline=None)
@given(
    st.recursive(
        st.one_of(_SCALAR, st.floats(allow_nan=False, allow_infinity=False)),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(_TEXT, inner, max_size=4)
        ),
        max_leaves=20,
    )
)
def test_floats_and_non_ascii_keys_are_spelled_by_rfc8785(value: Any) -> None:
    # Whatever path a value takes, the bytes are RFC 8785's.
    try:
        expected = _reference(value)
    except Exception:
        return
    assert canonical_bytes(value) == expected


def test_values_the_stdlib_would_spell_otherwise_leave_the_fast_path() -> None:
    for value in (
        1.0, {"a": 1e21}, [0.1], -0.0,  # ECMAScript number spelling: "1", "1e+21", "0"
        {"\ue000": 1, "\U0001f600": 2},  # code point order differs from UTF-16 order
    ):  # fmt: skip
        plain = [True]
        _nfc(value, "$", 0, plain)
        assert not plain[0], value
        assert canonical_bytes(value) == _reference(value)
    assert canonical_bytes({"\ue000": 1, "\U0001f600": 2}) == '{"\U0001f600":2,"\ue000":1}'.encode()
    assert canonical_bytes(1.0) == b"1"


def test_keys_are_normalized_before_they_are_sorted() -> None:
    decomposed = unicodedata.normalize("NFD", "é")
    assert canonical_bytes({"z": decomposed, "a": [decomposed]}) == '{"a":["é"],"z":"é"}'.encode()


def _nested(depth: int, kind: str, leaf: Any) -> Any:
    for _ in range(depth):
        leaf = {"k": leaf} if kind == "object" else [leaf]
    return leaf


@pytest.mark.parametrize("leaf", ["x", 7, None, True, "é", 2**60, {}])
@pytest.mark.parametrize("kind", ["object", "array"])
def test_the_depth_bound_refuses_one_level_past_it_whatever_the_leaf(kind: str, leaf: Any) -> None:
    """Leaves are kept without a call each, but only where their depth is allowed: a leaf
    inside MAX_DEPTH containers is spelled (or refused for itself), one container more is
    refused for the depth, at the same place as before the shortcut (an object at its key,
    an array at the element)."""
    if leaf != 2**60:
        assert canonical_bytes(_nested(MAX_DEPTH, kind, leaf))
    where = "$" + (".k" * MAX_DEPTH if kind == "object" else "[0]" * (MAX_DEPTH + 1))
    with pytest.raises(CanonicalizationError) as caught:
        canonical_bytes(_nested(MAX_DEPTH + 1, kind, leaf))
    assert caught.value.message == f"{where}: nested deeper than {MAX_DEPTH}"


class _Str(str):
    pass


@settings(max_examples=1500, deadline=None)
@given(
    st.one_of(
        _SCALAR,
        st.integers(),
        st.floats(),
        st.text(st.characters(min_codepoint=0, max_codepoint=127)),
        st.builds(_Str, _TEXT),
        st.lists(_SCALAR, max_size=2),
    ),
    st.dictionaries(_ASCII_KEY, _SCALAR, max_size=4),
)
def test_a_leaf_is_spelled_as_canonical_bytes_and_rfc8785_spell_it(
    value: Any, members: dict[str, Any]
) -> None:
    text = leaf_text(value)
    if text is None:
        # Only what canonical_bytes keeps and spells with the standard library is a leaf.
        assert not (type(value) is str and value.isascii())
        assert type(value) is not int or abs(value) > MAX_JSON_INT
        assert value is not None and type(value) is not bool
        return
    assert text.encode() == canonical_bytes(value) == rfc8785.dumps(value)
    # An object of such leaves, its members in sorted key order, is the object's form.
    spelled = {k: leaf_text(v) for k, v in members.items()}
    if None not in spelled.values():
        body = ",".join(f"{leaf_text(k)}:{spelled[k]}" for k in sorted(members))
        assert f"{{{body}}}".encode() == rfc8785.dumps(members) == canonical_bytes(members)
