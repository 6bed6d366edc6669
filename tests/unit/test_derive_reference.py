"""``derive`` against a plain restatement of its rules (the derivation of 9bb4158, before
its per-spec plan, leaf-spelled canonical forms and one-pass normalizers): on generated
specs, scopes and arguments, both give the same effect — key, fingerprint, arguments and
key forms — or raise the same error class with the same message. The keys are a public
contract (tests/unit/test_identity_vectors.py freezes some); this holds the fast paths to
them on every input the strategies reach. A successful key is also checked against
``rfc8785`` directly, so the reference's own canonical form is not the only judge."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from decimal import Decimal
from typing import Any

import rfc8785
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dedupe import ToolSpec, derive
from dedupe.canonical import canonical_bytes, nfc_deep
from dedupe.errors import (
    CanonicalizationError,
    IdentityError,
    InvisibleCharacterError,
    MissingFieldError,
    SpecError,
)
from dedupe.identity import MAX_SCOPE_CHARS, Deriver, Effect
from dedupe.normalize import INVISIBLE, NORMALIZERS, FieldNormalizer, visible

# -- the reference: derive's rules as plainly as they can be said ---------------------------


def _ref_scope(scope: object) -> str:
    if not isinstance(scope, str) or not scope.strip():
        raise MissingFieldError("scope must be a non-empty string")
    if len(scope) > MAX_SCOPE_CHARS:
        raise CanonicalizationError(f"scope is longer than {MAX_SCOPE_CHARS} characters")
    out = unicodedata.normalize("NFC", scope.strip())
    if not visible(out):
        raise InvisibleCharacterError(f"scope {INVISIBLE}")
    return out


def _ref_visible_deep(value: Any) -> bool:
    if isinstance(value, str):
        return visible(value)
    if isinstance(value, dict):
        return all(
            (not isinstance(k, str) or visible(k)) and _ref_visible_deep(v)
            for k, v in value.items()
        )
    if isinstance(value, list | tuple):
        return all(_ref_visible_deep(v) for v in value)
    return True


def _ref_field(spec: ToolSpec, name: str, value: Any) -> tuple[Any, Any]:
    fn = spec.normalizer(name)
    field = f"{spec.name}.{name}"
    try:
        if isinstance(fn, FieldNormalizer):
            submitted = fn.submitted(value)
            submitted, form = submitted, fn.key(submitted)
        else:
            submitted = nfc_deep(value, field=field)
            form = submitted
    except IdentityError as exc:
        message = exc.message if exc.message.startswith(field) else f"{field}: {exc.message}"
        raise type(exc)(message, tool=spec.name, field=name) from None
    if fn is not None and not isinstance(fn, FieldNormalizer):
        try:
            form = fn(submitted)
        except IdentityError as exc:
            reason = f"refused by the field's normalizer ({type(exc).__name__})"
            raise type(exc)(f"{field}: {reason}", tool=spec.name, field=name) from None
    if name in spec.identity and not _ref_visible_deep(form):
        raise InvisibleCharacterError(f"{field}: {INVISIBLE}", tool=spec.name, field=name)
    return submitted, form


def _ref_derive(spec: ToolSpec, scope: Any, args: Any, action: str | None = None) -> Effect:
    action = spec.action if action is None else action
    if not isinstance(action, str) or action not in spec.actions:
        shown = repr(action) if isinstance(action, str) and len(action) <= 64 else "given"
        raise SpecError(
            f"{spec.name}: action {shown} is not declared (declared: {list(spec.actions)})",
            tool=spec.name,
        )
    try:
        scope = _ref_scope(scope)
    except IdentityError as exc:
        raise type(exc)(f"{spec.name}: {exc.message}", tool=spec.name) from None
    if not isinstance(args, dict):
        raise CanonicalizationError(f"{spec.name}: arguments must be an object", tool=spec.name)
    if not all(isinstance(name, str) for name in args):
        raise CanonicalizationError(f"{spec.name}: argument names must be strings", tool=spec.name)
    fields = {*spec.identity, *spec.bound, *spec.free}
    if undeclared := sorted(set(args) - fields):
        shown = [n for n in undeclared if re.fullmatch(r"[A-Za-z_][A-Za-z_]{0,31}", n)]
        hidden = [f"{len(undeclared) - len(shown)} unnamed"] if len(shown) < len(undeclared) else []
        named = ", ".join([*map(repr, shown), *hidden])
        raise MissingFieldError(f"{spec.name}: undeclared arguments {named}")
    required = (*spec.identity, *spec.bound)
    if missing := sorted({f for f in required if f not in args or args[f] is None}):
        raise MissingFieldError(f"{spec.name}: missing identity/bound arguments {missing}")
    submitted: dict[str, Any] = {}
    norm: dict[str, Any] = {}
    for name, value in args.items():
        try:
            submitted[name], norm[name] = _ref_field(spec, name, value)
        except IdentityError:
            raise
        except Exception as exc:
            raise CanonicalizationError(
                f"{spec.name}.{name}: the value has no canonical form ({type(exc).__name__})"
            ) from None
    identity = {
        "v": 1, "tool": spec.name, "action": action, "scope": scope,
        "target": {f: norm[f] for f in spec.identity},
    }  # fmt: skip
    key = hashlib.sha256(
        canonical_bytes(identity, field=f"{spec.name}.identity", limit=8192)
    ).hexdigest()
    bound = {"tool": spec.name, "bound": {f: norm[f] for f in spec.bound}}
    fingerprint = hashlib.sha256(canonical_bytes(bound, field=f"{spec.name}.bound")).hexdigest()
    if free := {f: submitted[f] for f in spec.free if f in submitted}:
        canonical_bytes(free, field=f"{spec.name}.free")
    # Not through canonical_bytes: rfc8785 itself over the NFC form.
    assert hashlib.sha256(rfc8785.dumps(nfc_deep(identity))).hexdigest() == key
    assert hashlib.sha256(rfc8785.dumps(nfc_deep(bound))).hexdigest() == fingerprint
    return Effect(spec.name, action, scope, key, fingerprint, submitted, norm)


# -- strategies ----------------------------------------------------------------------------

_SPECIAL = st.sampled_from(
    [" ", "  x ", "\t", "\n", "\x00", "\x7f", '"', "\\", "é", "e\u0301", "ß", "\u017f", "\u200b",
     "\u00a0", "\u216b", "\u0130", "\U0001f600", "\ufeff", "@", ".", "-", "1", "0", "E", "+"]
)  # fmt: skip
_TEXT = st.lists(st.one_of(_SPECIAL, st.characters(codec="utf-8")), max_size=10).map("".join)
_ASCII = st.text(st.characters(min_codepoint=0, max_codepoint=127), max_size=12)
_MONEY = st.one_of(
    st.from_regex(r"\s?[+-]?[0-9]{0,5}(\.[0-9]{0,4})?([eE][+-]?[0-9]{1,3})?\s?", fullmatch=True),
    st.decimals(allow_nan=True, allow_infinity=True),
    st.sampled_from(["10.50", "0", "-0.00", "1e64", "1e-65", "9" * 70, " 7 ", "", "."]),
)
_ID = st.one_of(
    _ASCII,
    st.from_regex(r"\s?[A-Za-z0-9_]{1,12}\s?", fullmatch=True),
    st.integers(min_value=-(2**54), max_value=2**54),
)
_EMAIL = st.one_of(
    st.from_regex(r"\s?[A-Za-z0-9._+-]{1,10}@[A-Za-z0-9-]{1,8}\.[A-Za-z]{2,4}\s?", fullmatch=True),
    _TEXT,
)
_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**54), max_value=2**54),
    st.floats(), _TEXT, _ASCII, st.decimals(allow_nan=False, places=2),
)  # fmt: skip
_JSONISH = st.recursive(
    _LEAF,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.one_of(_ASCII, _TEXT), inner, max_size=3)
    ),
    max_leaves=8,
)
_VALUE = st.one_of(_JSONISH, _MONEY, _ID, _EMAIL)


def _shout(value: Any) -> Any:
    return {"v": str(value).upper() + "e\u0301", "n": [1, 2.5, None, True]}


def _upper_ascii(value: Any) -> Any:
    return str(value).upper()


_NORMALIZER = st.one_of(
    st.sampled_from([*NORMALIZERS, None]), st.sampled_from([_shout, _upper_ascii])
)
_NAMES = ["a", "amount", "to", "b_1", "Zed", "ünï", "x"]


@st.composite
def _cases(draw: st.DrawFn) -> tuple[ToolSpec, Any, dict[str, Any], str | None]:
    names = draw(st.lists(st.sampled_from(_NAMES), min_size=1, max_size=4, unique=True))
    identity = tuple(draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True)))
    bound = tuple(draw(st.lists(st.sampled_from(names), max_size=3, unique=True)))
    free = tuple(n for n in names if n not in identity and n not in bound)
    norms = {n: fn for n in names if (fn := draw(_NORMALIZER)) is not None}
    spec = ToolSpec(
        name=draw(st.sampled_from(["charge", "send.email", "t"])),
        identity=identity,
        bound=bound,
        free=free,
        actions=("refund",),
        normalizers=norms,
    )
    strategies = {"money": _MONEY, "id": _ID, "email": _EMAIL}
    args: dict[str, Any] = {}
    for n in names:
        if draw(st.integers(0, 9)) == 0:
            continue  # absent (a missing identity/bound field is refused)
        given = norms.get(n)
        kind = strategies.get(given) if isinstance(given, str) else None
        args[n] = draw(st.one_of(kind, _VALUE) if kind is not None else _VALUE)
    if draw(st.integers(0, 19)) == 0:
        args["undeclared"] = 1
    scope = draw(st.one_of(st.from_regex(r"[a-z0-9-]{1,12}", fullmatch=True), _TEXT))
    action = draw(st.sampled_from([None, "refund", "default", "nope"]))
    return spec, scope, args, action


def _outcome(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        effect = fn(*args, **kwargs)
    except IdentityError as exc:
        return (type(exc), exc.message)
    return (effect.tool, effect.action, effect.scope, effect.key, effect.fingerprint,
            dict(effect.args), dict(effect.normalized))  # fmt: skip


PROPS = settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))


@PROPS
@given(_cases())
def test_derive_gives_what_its_plain_restatement_gives(
    case: tuple[ToolSpec, Any, dict[str, Any], str | None],
) -> None:
    spec, scope, args, action = case
    expected = _outcome(_ref_derive, spec, scope, args, action)
    assert _outcome(derive, spec, scope, args, action=action) == expected
    # Twice: the second call reads the spec's cached plan.
    assert _outcome(derive, spec, scope, args, action=action) == expected


@PROPS
@given(_cases(), st.data())
def test_a_deriver_gives_what_the_plain_restatement_gives(
    case: tuple[ToolSpec, Any, dict[str, Any], str | None], data: st.DataObject
) -> None:
    spec, scope, args, action = case
    field = data.draw(st.sampled_from(spec.identity))
    shared = {k: v for k, v in args.items() if k != field}
    deriver = Deriver(spec, scope, shared, field, action=action)
    for value in data.draw(st.lists(_VALUE, min_size=1, max_size=3)):
        expected = _outcome(_ref_derive, spec, scope, {**shared, field: value}, action)
        assert _outcome(deriver, value) == expected


def test_money_given_as_a_decimal_keys_as_its_string() -> None:
    spec = ToolSpec(name="charge", identity=("c",), bound=("amount",),
                    normalizers={"amount": "money", "c": "id"})  # fmt: skip
    for amount in (Decimal("10.50"), Decimal("1E+2"), 10, " 10.5 "):
        args = {"c": 7, "amount": amount}
        assert _outcome(derive, spec, "s", args) == _outcome(_ref_derive, spec, "s", args)
