"""Per-field normalizers: the resolved form of a value before it enters a key or fingerprint.

A tool names them in its spec (``{"recipient": "email", "amount": "money"}``), so the spec
stays plain data the reconciler can read. A callable is accepted too, for custom resolution.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from .errors import CanonicalizationError, SpecError

__all__ = ["NORMALIZERS", "Normalizer", "resolve_normalizer"]

Normalizer = Callable[[Any], Any]


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise CanonicalizationError(f"expected a string, got {type(value).__name__}")
    return unicodedata.normalize("NFC", value)


def _strip(value: Any) -> str:
    return _text(value).strip()


def _casefold(value: Any) -> str:
    return _strip(value).casefold()


def _upper(value: Any) -> str:
    return _strip(value).upper()


def _email(value: Any) -> str:
    # Casefolding the whole address is a deliberate over-merge: two local parts differing in
    # case are almost always one mailbox, and a missed duplicate costs more than a merge.
    address = _casefold(value)
    local, at, domain = address.rpartition("@")
    if not at or not local or not domain or "." not in domain or any(c.isspace() for c in address):
        raise CanonicalizationError("not an email address")
    return address


def _identifier(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise CanonicalizationError(f"expected an id string or integer, got {type(value).__name__}")
    out = _strip(str(value))
    if not out:
        raise CanonicalizationError("empty identifier")
    return out


def _money(value: Any) -> str:
    """Decimal amount as a plain string: "10.50", "10.5" and 10 → "10.5", "10.5", "10"."""
    if isinstance(value, float):
        raise CanonicalizationError("money must be a decimal string or integer, never a float")
    if isinstance(value, bool) or not isinstance(value, str | int | Decimal):
        raise CanonicalizationError(f"money must be a decimal string, got {type(value).__name__}")
    try:
        amount = Decimal(value.strip() if isinstance(value, str) else value)
    except InvalidOperation:
        raise CanonicalizationError("not a decimal amount") from None
    if not amount.is_finite():
        raise CanonicalizationError("money must be finite")
    text = format(amount.normalize(), "f")
    return "0" if text in ("-0", "0") else text


NORMALIZERS: Mapping[str, Normalizer] = {
    "text": _text,
    "strip": _strip,
    "casefold": _casefold,
    "upper": _upper,
    "email": _email,
    "id": _identifier,
    "money": _money,
}


def resolve_normalizer(name_or_fn: str | Normalizer) -> Normalizer:
    if callable(name_or_fn):
        return name_or_fn
    try:
        return NORMALIZERS[name_or_fn]
    except KeyError:
        known = ", ".join(sorted(NORMALIZERS))
        raise SpecError(f"unknown normalizer {name_or_fn!r} (known: {known})") from None
