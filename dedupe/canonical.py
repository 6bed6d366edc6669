"""Canonical JSON (RFC 8785 via ``rfc8785``) over NFC-normalized values.

Two spellings of the same value must hash alike (dict order, Unicode normal form), and a
value without one exact spelling (NaN, a float amount, a non-string key) must be refused
rather than guessed at: a guessed canonical form is a key that silently changes. Integers
are I-JSON's (within ±(2**53 - 1)): beyond, a JSON number is not exact.

Error messages name the field (a path of list indices and identifier-like object keys),
never the value: a value may be a recipient or a card number.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable
from typing import Any

import rfc8785

from .errors import CanonicalizationError, ValueTooLargeError

__all__ = [
    "MAX_CANONICAL_BYTES", "MAX_DEPTH", "MAX_JSON_INT", "canonical_bytes", "leaf_text", "nfc_deep",
]  # fmt: skip

MAX_DEPTH = 32
MAX_CANONICAL_BYTES = 64 * 1024
MAX_JSON_INT = 2**53 - 1
# An object key enters an error's path only when it looks like a field name: keys are data too.
_NAME = re.compile(r"[A-Za-z_][A-Za-z_-]{0,31}")


# Where a value sits inside its field, kept as (parent, index or key) links and spelled
# out only for an error message: building the string for every node cost more than the
# normalization itself.
_Path = tuple[Any, int | str] | str


def _where(path: _Path) -> str:
    steps: list[str] = []
    while isinstance(path, tuple):
        path, step = path
        if isinstance(step, int):
            steps.append(f"[{step}]")
        else:
            steps.append(f".{step}" if _NAME.fullmatch(step) else ".{…}")
    return path + "".join(reversed(steps))


def nfc_deep(value: Any, *, field: str = "$", depth: int = 0) -> Any:
    """Return ``value`` with every string (keys included) in NFC; refuse what JSON cannot say."""
    return _nfc(value, field, depth, [True])


# Values the standard library's encoder (below) spells exactly as RFC 8785 does: strings
# (both escape '"', '\\' and U+0000-U+001F alike: \b \t \n \f \r, else \u00xx in
# lowercase; neither escapes anything else), integers (within ±(2**53 - 1), checked below),
# true / false / null, arrays, and objects whose keys are ASCII (sorting by code point is then
# sorting by UTF-16 code unit, RFC 8785's order). A float (ECMAScript's number spelling)
# or a non-ASCII key anywhere, or a subclass of any of these, goes to ``rfc8785``.
# tests/unit/test_canonical_fast_path.py holds the two to the same bytes.
_PLAIN = frozenset({str, int, bool, type(None), list, tuple, dict})
_STDLIB = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
)


def _refuse(path: _Path, problem: str) -> CanonicalizationError:
    where = _where(path)
    return CanonicalizationError(f"{where}: {problem}", field=where)


def _is_leaf(v: Any) -> bool:
    t = type(v)
    if t is str:
        return v.isascii()  # type: ignore[no-any-return]
    if t is int:
        return -MAX_JSON_INT <= v <= MAX_JSON_INT  # type: ignore[no-any-return]
    return v is None or t is bool


def _nfc(value: Any, path: _Path, depth: int, plain: list[bool]) -> Any:
    """``nfc_deep``; clears ``plain[0]`` on a value whose RFC 8785 form the standard
    library's JSON encoder may spell otherwise (see ``_PLAIN``)."""
    if type(value) not in _PLAIN:
        plain[0] = False
    if depth > MAX_DEPTH:
        raise _refuse(path, f"nested deeper than {MAX_DEPTH}")
    if isinstance(value, str):
        if value.isascii():  # NFC and valid as it is: most keys, names and identifiers
            return value
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _refuse(path, "not valid Unicode text") from None
        return unicodedata.normalize("NFC", value)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if abs(value) > MAX_JSON_INT:
            raise _refuse(
                path,
                "an integer beyond ±(2**53 - 1) has no exact JSON number; pass it as a string",
            )
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise _refuse(path, "NaN and Infinity have no JSON form")
        return value
    # A child that is its own form (an ASCII string, an exact int in range, a bool, None)
    # is kept without a call per child: most values are flat objects of such leaves. Only
    # where the child's depth is still allowed, so the depth error stays where it was.
    flat = depth < MAX_DEPTH
    if isinstance(value, list | tuple):
        return [
            v if flat and _is_leaf(v) else _nfc(v, (path, i), depth + 1, plain)
            for i, v in enumerate(value)
        ]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if flat and type(k) is str and k.isascii():
                nk = k
            else:
                if not isinstance(k, str):
                    raise _refuse(path, "object keys must be strings")
                if not k.isascii():
                    plain[0] = False
                nk = _nfc(k, path, depth + 1, plain)
            if nk in out:
                raise _refuse(path, "keys collide after Unicode normalization")
            out[nk] = v if flat and _is_leaf(v) else _nfc(v, (path, nk), depth + 1, plain)
        return out
    raise _refuse(path, f"{type(value).__name__} is not a JSON value")


# The standard library encoder's own spelling of a string (``ensure_ascii=False``).
_JSON_STRING: Callable[[str], str] = json.encoder.encode_basestring


def leaf_text(value: Any) -> str | None:
    """The canonical JSON of a leaf that ``canonical_bytes`` keeps as it is and spells with
    the standard library (an ASCII string, an integer within ±(2**53 - 1), a bool, None),
    in the same characters; None for anything else. A caller that builds an object's
    canonical form from its members' (in RFC 8785's key order) saves the walk and the
    encoder; tests/unit/test_canonical_fast_path.py holds it to ``rfc8785``."""
    kind = type(value)
    if kind is str:
        return _JSON_STRING(value) if value.isascii() else None
    if kind is int:
        return int.__repr__(value) if -MAX_JSON_INT <= value <= MAX_JSON_INT else None
    if kind is bool:
        return "true" if value else "false"
    return "null" if value is None else None


def canonical_bytes(value: Any, *, field: str = "$", limit: int = MAX_CANONICAL_BYTES) -> bytes:
    """RFC 8785 bytes of ``value`` after NFC normalization; bounded by ``limit`` bytes."""
    plain = [True]
    try:
        normalized = _nfc(value, field, 0, plain)
        # The standard library's C encoder where it spells the value alike (5x faster).
        out = _STDLIB.encode(normalized).encode() if plain[0] else rfc8785.dumps(normalized)
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
