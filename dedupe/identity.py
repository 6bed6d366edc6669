"""Effect identity: the key ("have I done this, for this reason, to this target?") and the
fingerprint of what the effect carries.

key         = SHA-256(JCS({v, tool, action, scope, target}))   — addresses the ledger record
fingerprint = SHA-256(JCS({tool, bound}))                      — a replay with other bound
                                                                 values is a conflict
idempotency = key at generation 0, else SHA-256(JCS({key, generation}))

Normalization serves identity only: ``Effect.normalized`` holds the key forms the key and
fingerprint are computed from; ``Effect.args`` holds the arguments as submitted (NFC,
trimmed where the field's normalizer trims) — what the tool receives, the envelope carries
and the ledger stores (``dedupe.normalize``). ``derive`` of an effect's ``args`` gives the
same effect again, so a worker recomputes the key from the envelope.

What names the effect is what a person sees: every identity field's key form (whatever its
normalizer, strings anywhere inside it), the scope and a campaign id (``normalize_scope``)
refuse control, format, default-ignorable, unassigned and private-use code points
(``dedupe.normalize.visible``) with one InvisibleCharacterError naming the field. Free
content is not identity and keeps them.

``derive`` raises an IdentityError or nothing: whatever a normalizer raises (a decimal
signal, a ValueError, a user's callable failing) becomes a CanonicalizationError naming
``tool.field``, and no message carries the value.

The generation lives in the ledger record, not in the record's address: a producer must be
able to find the record from the arguments alone, and only an operator (revoke, supersede)
moves it. The provider sees a fresh idempotency key per generation, so a re-issued effect is
not swallowed by the provider's own deduplication of the voided one.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .canonical import MAX_CANONICAL_BYTES, canonical_bytes, leaf_text, nfc_deep
from .errors import (
    CanonicalizationError,
    IdentityError,
    InvisibleCharacterError,
    KeyFormatError,
    MissingFieldError,
    SpecError,
)
from .normalize import INVISIBLE, FieldNormalizer, Normalizer, visible
from .spec import ToolSpec

__all__ = [
    "EFFECT_KEY", "KEY_OR_PREFIX", "MAX_SCOPE_CHARS", "Deriver", "Effect", "check_key", "derive",
    "idempotency_key", "normalize_scope",
]  # fmt: skip

MAX_SCOPE_CHARS = 256
_VERSION = 1
_IDENTITY_LIMIT = 8192
_JSON_STRING = json.JSONEncoder(ensure_ascii=False).encode
#: An effect key as the ledger writes it: 64 lowercase hex digits (a SHA-256). Unanchored
#: (``fullmatch`` checks one; ``f"^{EFFECT_KEY.pattern}$"`` where a schema wants anchors).
EFFECT_KEY = re.compile(r"[0-9a-f]{64}")
#: An effect key or its first 12 or more digits, as the logs print it (``workers.logs``):
#: what a key search, ``inspect`` and the audit filter take.
KEY_OR_PREFIX = re.compile(r"[0-9a-f]{12,64}")
# Argument names enter a message only when they look like names: a name is data too.
_ARG_NAME = re.compile(r"[A-Za-z_][A-Za-z_]{0,31}")


@dataclass(frozen=True)
class Effect:
    """One logical effect, derived before execution. ``args`` are the arguments as submitted
    (what the tool receives), ``normalized`` their key forms (what key and fingerprint hash)."""

    tool: str
    action: str
    scope: str
    key: str
    fingerprint: str
    args: Mapping[str, Any]
    normalized: Mapping[str, Any]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_key(key: object) -> str:
    """``key`` if it is an effect key (64 lowercase hex digits), else KeyFormatError."""
    if not isinstance(key, str) or not EFFECT_KEY.fullmatch(key):
        raise KeyFormatError("not an effect key: an effect key is 64 lowercase hex digits")
    return key


def _names(names: list[str]) -> str:
    shown = [n for n in names if _ARG_NAME.fullmatch(n)]
    hidden = len(names) - len(shown)
    return ", ".join([*map(repr, shown), *([f"{hidden} unnamed"] if hidden else [])])


class _Plan:
    """What ``derive`` reads from one spec on every call, read once per spec object (a spec
    is frozen): its fields, resolved normalizers, and the fixed parts of the canonical
    identity and bound forms. ``target`` and ``bound`` are None where a field name is not
    ASCII (RFC 8785 orders such keys otherwise than Python does); ``canonical_bytes`` then
    spells every call."""

    __slots__ = ("bound", "bound_tail", "fields", "free", "heads", "identity", "normalizers",
                 "required", "spec", "tail", "target")  # fmt: skip

    def __init__(self, spec: ToolSpec) -> None:
        self.spec = weakref.ref(spec)
        self.fields = spec.fields
        self.identity = frozenset(spec.identity)
        self.required = (*spec.identity, *spec.bound)
        self.free = spec.free
        self.normalizers = {name: spec.normalizer(name) for name in self.fields}
        tool = _JSON_STRING(spec.name)
        # The canonical forms' members in RFC 8785's order: action, scope, target, tool, v
        # (identity) and bound, tool (fingerprint); each field's name spelled once.
        self.heads = {a: f'{{"action":{_JSON_STRING(a)},"scope":' for a in spec.actions}
        self.tail = f'}},"tool":{tool},"v":{_VERSION}}}'
        self.bound_tail = f'}},"tool":{tool}}}'
        self.target = _members(spec.identity)
        self.bound = _members(spec.bound)

    def identity_text(self, action: str, scope: str, norm: Mapping[str, Any]) -> str | None:
        """The canonical identity form where every part is a leaf ``leaf_text`` spells."""
        scope_text = leaf_text(scope)
        if self.target is None or scope_text is None:
            return None
        target = _object_text(self.target, norm)
        if target is None:
            return None
        return f'{self.heads[action]}{scope_text},"target":{{{target}{self.tail}'

    def bound_text(self, norm: Mapping[str, Any]) -> str | None:
        """The canonical bound form (what the fingerprint hashes), likewise."""
        if self.bound is None:
            return None
        members = _object_text(self.bound, norm)
        return None if members is None else f'{{"bound":{{{members}{self.bound_tail}'


def _members(names: tuple[str, ...]) -> tuple[tuple[str, str], ...] | None:
    """(name, its JSON and a colon) for an object of these keys, sorted; None unless every
    name is an ASCII string (code point order is then RFC 8785's UTF-16 order)."""
    unique = set(names)
    if not all(type(n) is str and n.isascii() for n in unique):
        return None
    return tuple((n, f"{_JSON_STRING(n)}:") for n in sorted(unique))


def _object_text(members: tuple[tuple[str, str], ...], norm: Mapping[str, Any]) -> str | None:
    parts = []
    for name, head in members:
        text = leaf_text(norm[name])
        if text is None:
            return None
        parts.append(head + text)
    return ",".join(parts)


# Plans by spec object; an entry leaves with its spec (a ToolSpec is not hashable: it holds
# a dict of normalizers).
_PLANS: dict[int, _Plan] = {}


def _plan(spec: ToolSpec) -> _Plan:
    plan = _PLANS.get(id(spec))
    if plan is None or plan.spec() is not spec:
        plan = _PLANS[id(spec)] = _Plan(spec)
        weakref.finalize(spec, _PLANS.pop, id(spec), None)
    return plan


def _forms(spec: ToolSpec, plan: _Plan, name: str, value: Any) -> tuple[Any, Any]:
    """(as submitted, key form) of one argument; see ``dedupe.normalize``."""
    submitted, form = _field_forms(spec, name, value, plan.normalizers[name])
    if name in plan.identity and not _visible_deep(form):
        raise InvisibleCharacterError(
            f"{spec.name}.{name}: {INVISIBLE}", tool=spec.name, field=name
        )
    return submitted, form


def _field_forms(spec: ToolSpec, name: str, value: Any, fn: Normalizer | None) -> tuple[Any, Any]:
    try:
        if isinstance(fn, FieldNormalizer):
            return fn.forms(value)
        submitted = nfc_deep(value, field=f"{spec.name}.{name}")
    except IdentityError as exc:
        # A built-in's message says what is wrong without the value: keep it, by field
        # (``nfc_deep`` already names the field, or a path inside it).
        field = f"{spec.name}.{name}"
        message = exc.message if exc.message.startswith(field) else f"{field}: {exc.message}"
        raise type(exc)(message, tool=spec.name, field=name) from None
    if fn is None:
        return submitted, submitted
    # The key form is computed from the submitted form, as a worker computes it from the
    # envelope: both sides see the same input. A user's normalizer may say anything, the
    # value included: only its error type is kept.
    try:
        return submitted, fn(submitted)
    except IdentityError as exc:
        reason = f"refused by the field's normalizer ({type(exc).__name__})"
        raise type(exc)(f"{spec.name}.{name}: {reason}", tool=spec.name, field=name) from None


def _visible_deep(value: Any) -> bool:
    """Every string in ``value`` (object keys too) is ``visible``; a user's normalizer may
    map a character away, and then the key holds none."""
    if isinstance(value, str):
        return visible(value)
    if isinstance(value, dict):
        return all(
            (not isinstance(k, str) or visible(k)) and _visible_deep(v) for k, v in value.items()
        )
    if isinstance(value, list | tuple):
        return all(_visible_deep(v) for v in value)
    return True


def _check_names(spec: ToolSpec, plan: _Plan, args: Mapping[str, Any]) -> None:
    if not isinstance(args, Mapping):
        raise CanonicalizationError(f"{spec.name}: arguments must be an object", tool=spec.name)
    for name in args:
        if not isinstance(name, str):
            raise CanonicalizationError(
                f"{spec.name}: argument names must be strings", tool=spec.name
            )
    if not plan.fields.issuperset(args):
        undeclared = sorted(set(args) - plan.fields)
        raise MissingFieldError(
            f"{spec.name}: undeclared arguments {_names(undeclared)}",
            tool=spec.name,
            fields=[n for n in undeclared if _ARG_NAME.fullmatch(n)],
        )
    for field in plan.required:
        if field not in args or args[field] is None:
            missing = sorted({f for f in plan.required if f not in args or args[f] is None})
            raise MissingFieldError(
                f"{spec.name}: missing identity/bound arguments {missing}",
                tool=spec.name,
                fields=missing,
            )


def _all_forms(
    spec: ToolSpec, plan: _Plan, args: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    submitted: dict[str, Any] = {}
    normalized: dict[str, Any] = {}
    for name, value in args.items():
        try:
            submitted[name], normalized[name] = _forms(spec, plan, name, value)
        except IdentityError:
            raise
        except Exception as exc:  # a decimal signal, a str(int) limit, a user's normalizer
            raise CanonicalizationError(
                f"{spec.name}.{name}: the value has no canonical form ({type(exc).__name__})",
                tool=spec.name,
                field=name,
            ) from None
    return submitted, normalized


def _scope_and_action(spec: ToolSpec, scope: str, action: str | None) -> tuple[str, str]:
    action = spec.action if action is None else action
    if not isinstance(action, str) or action not in spec.actions:
        shown = repr(action) if isinstance(action, str) and len(action) <= 64 else "given"
        raise SpecError(
            f"{spec.name}: action {shown} is not declared (declared: {list(spec.actions)})",
            tool=spec.name,
        )
    try:
        return normalize_scope(scope), action
    except IdentityError as exc:
        raise type(exc)(f"{spec.name}: {exc.message}", tool=spec.name) from None


def normalize_scope(scope: object, what: str = "scope") -> str:
    """The scope as it enters the key: NFC, surrounding space trimmed, every character
    visible. A campaign id is the scope of its recipients' keys (``what`` names it)."""
    if not isinstance(scope, str) or not scope.strip():
        raise MissingFieldError(f"{what} must be a non-empty string")
    if len(scope) > MAX_SCOPE_CHARS:
        raise CanonicalizationError(f"{what} is longer than {MAX_SCOPE_CHARS} characters")
    out = scope.strip()
    if not out.isascii():  # ASCII text is its own NFC
        out = unicodedata.normalize("NFC", out)
    if not visible(out):
        raise InvisibleCharacterError(f"{what} {INVISIBLE}")
    return out


def _identity(spec: ToolSpec, action: str, scope: str, norm: Mapping[str, Any]) -> dict[str, Any]:
    target = {f: norm[f] for f in spec.identity}
    return {"v": _VERSION, "tool": spec.name, "action": action, "scope": scope, "target": target}


def _bound(spec: ToolSpec, norm: Mapping[str, Any]) -> dict[str, Any]:
    return {"tool": spec.name, "bound": {f: norm[f] for f in spec.bound}}


def derive(
    spec: ToolSpec, scope: str, args: Mapping[str, Any], *, action: str | None = None
) -> Effect:
    """Derive the effect of calling ``spec`` for ``scope`` with ``args`` (and one of the
    tool's declared actions; its default when None). Raises an IdentityError, no other."""
    plan = _plan(spec)
    scope, action = _scope_and_action(spec, scope, action)
    _check_names(spec, plan, args)
    args, norm = _all_forms(spec, plan, args)
    # The canonical forms spelled from their leaves where each is one (an ASCII string, an
    # exact integer, ...: canonical_bytes' own spelling of them, tests/unit/
    # test_derive_reference.py), through canonical_bytes otherwise (and over the bound:
    # its error).
    text = plan.identity_text(action, scope, norm)
    if text is not None and len(text) <= _IDENTITY_LIMIT:
        key = _sha256(text.encode())
    else:
        identity = _identity(spec, action, scope, norm)
        key = _sha256(
            canonical_bytes(identity, field=f"{spec.name}.identity", limit=_IDENTITY_LIMIT)
        )
    text = plan.bound_text(norm)
    if text is not None and len(text) <= MAX_CANONICAL_BYTES:  # ASCII: characters are bytes
        fingerprint = _sha256(text.encode())
    else:
        fingerprint = _sha256(canonical_bytes(_bound(spec, norm), field=f"{spec.name}.bound"))
    # Free content must still be JSON: it travels in the message and the stored request.
    if plan.free and (free := {f: args[f] for f in plan.free if f in args}):
        canonical_bytes(free, field=f"{spec.name}.free")
    return Effect(spec.name, action, scope, key, fingerprint, args, norm)


class Deriver:
    """``derive`` for many calls of one tool under one scope and action that differ in one
    identity field only: a campaign's recipients. Gives derive's effect, byte for byte
    (tests/unit/test_deriver.py), and raises what derive raises.

    The shared arguments are normalized once, and where the varying field's key form is an
    ASCII string (an address, an id: nearly every recipient) the canonical identity and
    bound forms are that string's JSON between two fixed byte strings, taken once from the
    canonical form of the shared part around a placeholder. Any other value, and shared
    arguments derive would refuse, go through derive itself."""

    def __init__(
        self,
        spec: ToolSpec,
        scope: str,
        shared: Mapping[str, Any],
        field: str,
        action: str | None = None,
    ) -> None:
        self.spec, self.scope, self.field, self.action = spec, scope, field, action
        self.shared = dict(shared)
        self._fast: _Template | None = None
        try:
            self._fast = _Template.of(spec, scope, self.shared, field, action)
        except Exception:  # derive raises it, per call, as always
            self._fast = None

    def __call__(self, value: Any) -> Effect:
        fast = self._fast
        effect = fast.effect(self.spec, self.field, value) if fast is not None else None
        if effect is None:
            effect = derive(
                self.spec, self.scope, {**self.shared, self.field: value}, action=self.action
            )
        return effect


_PLACEHOLDER = "effectq:varying-field:5f0c2d9a"


@dataclass(frozen=True)
class _Template:
    """The canonical identity and bound forms of a Deriver's calls, split where the varying
    field's value goes; ``bound`` None when the field is not bound (one fingerprint)."""

    action: str
    scope: str
    args: dict[str, Any]
    norm: dict[str, Any]
    identity: tuple[bytes, bytes]
    bound: tuple[bytes, bytes] | None
    fingerprint: str

    @classmethod
    def of(
        cls,
        spec: ToolSpec,
        scope: str,
        shared: dict[str, Any],
        field: str,
        action: str | None,
    ) -> _Template | None:
        """None where the fast path does not apply; raises where derive would raise for
        every value (the caller then leaves every call to derive)."""
        scope, action = _scope_and_action(spec, scope, action)
        if field not in spec.identity or field in shared:
            return None
        # derive's checks (with the field present) and the forms of the shared part.
        plan = _plan(spec)
        _check_names(spec, plan, {**shared, field: _PLACEHOLDER})
        args, norm = _all_forms(spec, plan, shared)
        if free := {f: args[f] for f in spec.free if f in args}:
            canonical_bytes(free, field=f"{spec.name}.free")
        marked = {**norm, field: _PLACEHOLDER}
        identity = _split(
            canonical_bytes(_identity(spec, action, scope, marked), limit=_IDENTITY_LIMIT)
        )
        bound = _split(canonical_bytes(_bound(spec, marked))) if field in spec.bound else None
        if identity is None or (field in spec.bound and bound is None):
            return None
        fingerprint = "" if bound is not None else _sha256(canonical_bytes(_bound(spec, norm)))
        return cls(action, scope, args, norm, identity, bound, fingerprint)

    def effect(self, spec: ToolSpec, field: str, value: Any) -> Effect | None:
        """The effect for ``value``, or None: derive decides (and words any refusal)."""
        if value is None:  # missing, to derive, whatever a user's normalizer makes of it
            return None
        try:
            submitted, form = _forms(spec, _plan(spec), field, value)
        except Exception:  # derive raises it, worded as always
            return None
        if type(form) is not str or not form.isascii():
            return None
        # An ASCII string's JSON is the standard library's, as canonical_bytes writes it.
        text = _JSON_STRING(form).encode()
        head, tail = self.identity
        identity = head + text + tail
        if len(identity) > _IDENTITY_LIMIT:
            return None
        fingerprint = self.fingerprint
        if self.bound is not None:
            fingerprint = _sha256(self.bound[0] + text + self.bound[1])
        args = {**self.args, field: submitted}
        norm = {**self.norm, field: form}
        return Effect(
            spec.name, self.action, self.scope, _sha256(identity), fingerprint, args, norm
        )


def _split(canonical: bytes) -> tuple[bytes, bytes] | None:
    """``canonical`` cut around the placeholder's JSON, where it occurs exactly once."""
    parts = canonical.split(_JSON_STRING(_PLACEHOLDER).encode())
    return (parts[0], parts[1]) if len(parts) == 2 else None


def idempotency_key(key: str, generation: int) -> str:
    """The key the provider deduplicates on, fresh for each operator-opened generation."""
    if generation == 0:
        return key
    return _sha256(canonical_bytes({"generation": generation, "key": key}))
