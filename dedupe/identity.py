"""Effect identity: the key ("have I done this, for this reason, to this target?") and the
fingerprint of what the effect carries.

key         = SHA-256(JCS({v, tool, action, scope, target}))   — addresses the ledger record
fingerprint = SHA-256(JCS({tool, bound}))                      — a replay with other bound
                                                                 values is a conflict
idempotency = key at generation 0, else SHA-256(JCS({key, generation}))

The generation lives in the ledger record, not in the record's address: a producer must be
able to find the record from the arguments alone, and only an operator (revoke, supersede)
moves it. The provider sees a fresh idempotency key per generation, so a re-issued effect is
not swallowed by the provider's own deduplication of the voided one.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .canonical import canonical_bytes
from .errors import CanonicalizationError, EffectqError, MissingFieldError, SpecError
from .spec import ToolSpec

__all__ = ["MAX_SCOPE_CHARS", "Effect", "derive", "idempotency_key"]

MAX_SCOPE_CHARS = 256
_VERSION = 1


@dataclass(frozen=True)
class Effect:
    """One logical effect, derived before execution. ``args`` are the normalized arguments."""

    tool: str
    action: str
    scope: str
    key: str
    fingerprint: str
    args: Mapping[str, Any]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _normalized(spec: ToolSpec, args: Mapping[str, Any]) -> dict[str, Any]:
    if undeclared := sorted(set(args) - spec.fields):
        raise MissingFieldError(
            f"{spec.name}: undeclared arguments {undeclared}", tool=spec.name, fields=undeclared
        )
    required = (*spec.identity, *spec.bound)
    if missing := sorted({f for f in required if f not in args or args[f] is None}):
        raise MissingFieldError(
            f"{spec.name}: missing identity/bound arguments {missing}",
            tool=spec.name,
            fields=missing,
        )
    out: dict[str, Any] = {}
    for name, value in args.items():
        fn = spec.normalizer(name)
        try:
            out[name] = fn(value) if fn is not None else value
        except EffectqError as exc:
            # Name the field, never echo the value: it may be a recipient.
            raise type(exc)(
                f"{spec.name}.{name}: {exc.message}", tool=spec.name, field=name
            ) from None
    return out


def derive(
    spec: ToolSpec, scope: str, args: Mapping[str, Any], *, action: str | None = None
) -> Effect:
    """Derive the effect of calling ``spec`` for ``scope`` with ``args`` (and one of the
    tool's declared actions; its default when None)."""
    action = spec.action if action is None else action
    if action not in spec.actions:
        raise SpecError(
            f"{spec.name}: action {action!r} is not declared (declared: {list(spec.actions)})",
            tool=spec.name,
        )
    if not isinstance(scope, str) or not scope.strip():
        raise MissingFieldError(f"{spec.name}: scope must be a non-empty string", tool=spec.name)
    if len(scope) > MAX_SCOPE_CHARS:
        raise CanonicalizationError(
            f"{spec.name}: scope longer than {MAX_SCOPE_CHARS} characters", tool=spec.name
        )
    scope = unicodedata.normalize("NFC", scope.strip())
    norm = _normalized(spec, args)
    identity: dict[str, Any] = {
        "v": _VERSION,
        "tool": spec.name,
        "action": action,
        "scope": scope,
        "target": {f: norm[f] for f in spec.identity},
    }
    key = _sha256(canonical_bytes(identity, field=f"{spec.name}.identity", limit=8192))
    bound = {"tool": spec.name, "bound": {f: norm[f] for f in spec.bound}}
    fingerprint = _sha256(canonical_bytes(bound, field=f"{spec.name}.bound"))
    # Free content must still be JSON: it travels in the message and the stored request.
    canonical_bytes({f: norm[f] for f in spec.free if f in norm}, field=f"{spec.name}.free")
    return Effect(spec.name, action, scope, key, fingerprint, norm)


def idempotency_key(key: str, generation: int) -> str:
    """The key the provider deduplicates on, fresh for each operator-opened generation."""
    if generation == 0:
        return key
    return _sha256(canonical_bytes({"generation": generation, "key": key}))
