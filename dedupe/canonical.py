"""Canonical JSON (RFC 8785 via ``rfc8785``) over NFC-normalized values.

Two spellings of the same value must hash alike (dict order, Unicode normal form), and a
value without one exact spelling (NaN, a float amount, a non-string key) must be refused
rather than guessed at: a guessed canonical form is a key that silently changes. Integers
are I-JSON's (within ±(2**53 - 1)): beyond, a JSON number is not exact.

Error messages name the field (a path of list indices and identifier-like object keys),
never the value: a value may be a recipient or a card number.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

import rfc8785

from .errors import CanonicalizationError, ValueTooLargeError

__all__ = ["MAX_CANONICAL_BYTES", "MAX_DEPTH", "MAX_JSON_INT", "canonical_bytes", "nfc_deep"]

MAX_DEPTH = 32
MAX_CANONICAL_BYTES = 64 * 1024
MAX_JSON_INT = 2**53 - 1
# An object key enters an error's path only when it looks like a field name: keys are data too.
_NAME = re.compile(r"[A-Za-z_][A-Za-z_-]{0,31}")


def _child(field: str, key: str) -> str:
    return f"{field}.{key}" if _NAME.fullmatch(key) else f"{field}.{{…}}"


def nfc_deep(value: Any, *, field: str = "$", depth: int = 0) -> Any:
    """Return ``value`` with every string (keys included) in NFC; refuse what JSON cannot say."""
    if depth > MAX_DEPTH:
        raise CanonicalizationError(f"{field}: nested deeper than {MAX_DEPTH}", field=field)
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise CanonicalizationError(f"{field}: not valid Unicode text", field=field) from None
        return unicodedata.normalize("NFC", value)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if abs(value) > MAX_JSON_INT:
            raise CanonicalizationError(
                f"{field}: an integer beyond ±(2**53 - 1) has no exact JSON number; "
                "pass it as a string",
                field=field,
            )
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise CanonicalizationError(f"{field}: NaN and Infinity have no JSON form", field=field)
        return value
    if isinstance(value, list | tuple):
        return [nfc_deep(v, field=f"{field}[{i}]", depth=depth + 1) for i, v in enumerate(value)]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise CanonicalizationError(f"{field}: object keys must be strings", field=field)
            nk = nfc_deep(k, field=field, depth=depth + 1)
            if nk in out:
                raise CanonicalizationError(
                    f"{field}: keys collide after Unicode normalization", field=field
                )
            out[nk] = nfc_deep(v, field=_child(field, nk), depth=depth + 1)
        return out
    raise CanonicalizationError(f"{field}: {type(value).__name__} is not a JSON value", field=field)


def canonical_bytes(value: Any, *, field: str = "$", limit: int = MAX_CANONICAL_BYTES) -> bytes:
    """RFC 8785 bytes of ``value`` after NFC normalization; bounded by ``limit`` bytes."""
    try:
        out = rfc8785.dumps(nfc_deep(value, field=field))
    except RecursionError:
        raise CanonicalizationError(f"{field}: nested too deeply", field=field) from None
    except (ValueError, TypeError, OverflowError) as exc:
        # rfc8785's messages quote the value (an IntegerDomainError prints the number): the
        # type says enough.
        raise CanonicalizationError(
            f"{field}: no canonical JSON form ({type(exc).__name__})", field=field
        ) from None
    if len(out) > limit:
        raise ValueTooLargeError(
            f"{field}: canonical form is {len(out)} bytes, over the {limit}-byte bound",
            field=field,
            size=len(out),
            limit=limit,
        )
    return out
