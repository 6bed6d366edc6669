"""Per-field normalizers: the key form of a value, and the form the tool receives.

A tool names them in its spec (``{"recipient": "email", "amount": "money"}``), so the spec
stays plain data the reconciler can read. A callable is accepted too, for custom resolution.

Normalization serves identity only. Each built-in normalizer has two faces:

* ``submitted`` — what the tool body receives, the envelope carries and the ledger stores:
  the value as submitted, in NFC, strings trimmed (nothing else is rewritten: the mail goes
  to ``Straße@example.de``, never to ``strasse@example.de``);
* ``key`` — the resolved form that enters the key and the fingerprint, so that spellings of
  one target merge and changed values conflict.

``key(submitted(v)) == key(v)`` and ``submitted(submitted(v)) == submitted(v)``: a worker
derives again from the envelope's arguments and finds the same key and the same arguments.
Every refusal is an IdentityError whose message says what is wrong, never the value.

What names a target is what a person sees: ``visible`` refuses the code points that would
make one visible spelling two values (``cus_1`` and ``cus_1`` + U+200B, two customers charged
twice). The normalizers that name things (``id``, ``email``, ``upper``, ``casefold``) refuse
them wherever they are used; ``text`` and ``strip`` do not (a free field's emoji keeps its
joiner), and ``dedupe.identity`` refuses them in every identity field, the scope and a
campaign id whatever the normalizer.

No normalizer makes two values equal that the provider would receive as different, beyond
the merge it is named for (DESIGN §1): where one would, it refuses the value instead of
spelling it otherwise, so every value it still accepts keeps the key it had.

Money is exact: parsed as a decimal string with integer arithmetic, never rounded, within
``MONEY_MAX_DIGITS`` significant digits, below ``10**MONEY_MAX_EXPONENT`` in magnitude and
with no digit below ``10**-MONEY_MAX_EXPONENT`` (anything outside is a ValueTooLargeError).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from .errors import (
    CanonicalizationError,
    InvisibleCharacterError,
    SpecError,
    ValueTooLargeError,
)

__all__ = [
    "DEFAULT_IGNORABLE",
    "EMAIL_MAX_CHARS",
    "INVISIBLE",
    "JSON_SAFE_INT",
    "MONEY_MAX_CHARS",
    "MONEY_MAX_DIGITS",
    "MONEY_MAX_EXPONENT",
    "NORMALIZERS",
    "FieldNormalizer",
    "Normalizer",
    "resolve_normalizer",
    "visible",
]

Normalizer = Callable[[Any], Any]

MONEY_MAX_DIGITS = 64
MONEY_MAX_EXPONENT = 64
MONEY_MAX_CHARS = 256
EMAIL_MAX_CHARS = 254
JSON_SAFE_INT = 2**53 - 1  # I-JSON: integers beyond this have no exact JSON number


@dataclass(frozen=True)
class FieldNormalizer:
    """A built-in normalizer: the key form and the form the tool receives (see above).
    ``both``, where given, returns ``(submitted(v), key(submitted(v)))`` in one pass (the
    key form then need not read the submitted form again), raising what they raise."""

    name: str
    key: Normalizer
    submitted: Normalizer
    both: Callable[[Any], tuple[Any, Any]] | None = field(default=None, compare=False)

    def __call__(self, value: Any) -> Any:
        return self.key(value)

    def forms(self, value: Any) -> tuple[Any, Any]:
        """(the form the tool receives, the key form): what derive takes of an argument."""
        if self.both is not None:
            return self.both(value)
        submitted = self.submitted(value)
        return submitted, self.key(submitted)


def _text(value: Any) -> str:
    if type(value) is str and value.isascii():  # NFC and valid as it is
        return value
    if not isinstance(value, str):
        raise CanonicalizationError(f"expected a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise CanonicalizationError("not valid Unicode text") from None
    return unicodedata.normalize("NFC", value)


def _strip(value: Any) -> str:
    return _text(value).strip()


# Default_Ignorable_Code_Point as DerivedCoreProperties.txt lists it since Unicode 14 (U+180F
# joined then; tests/unit/test_identity_invisible.py holds it to the regex module's UCD):
# code points a renderer shows as nothing. Some are letters or marks by category (fillers,
# variation selectors, the grapheme joiner), and the reserved ranges are refused before
# anything is assigned there.
DEFAULT_IGNORABLE: tuple[tuple[int, int], ...] = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
    (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
    (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
)  # fmt: skip
_IGNORABLE = re.compile("[" + "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in DEFAULT_IGNORABLE) + "]")
INVISIBLE = (
    "holds a control, format, invisible, unassigned or private-use character "
    "(refused: it would make one target look like two)"
)


def visible(text: str) -> bool:
    """False if ``text`` holds a code point an identity refuses: a control (Cc), format
    (Cf), surrogate (Cs), private-use (Co) or unassigned (Cn, noncharacters included)
    character, a line or paragraph separator (Zl, Zp), or a default-ignorable one. Spaces
    (Zs) are visible: trimmed at the ends, kept inside.

    Unassigned ones too: what this Python does not know it cannot show to be visible (and
    what a later Unicode assigns there may be a format character)."""
    # str.isprintable() is False exactly for the categories C* and Z* but the ASCII space:
    # in C, one pass, and enough alone for ASCII text (no default-ignorable there).
    if text.isprintable():
        return text.isascii() or _IGNORABLE.search(text) is None
    if not all(c.isprintable() or unicodedata.category(c) == "Zs" for c in text):
        return False
    return _IGNORABLE.search(text) is None


def _visible(text: str) -> str:
    if not visible(text):
        raise InvisibleCharacterError(INVISIBLE)
    return text


def _caseless(text: str) -> str:
    # Unicode canonical caseless matching (D145): casefold between canonical decompositions,
    # recomposed so that the key form is NFC like every other string.
    return unicodedata.normalize("NFC", unicodedata.normalize("NFD", text).casefold())


def _casefold(value: Any) -> str:
    # Unicode default caseless matching, merges included (Straße ≡ STRASSE, a long s ≡ s): what a
    # caseless provider matches by (PRECIS, RFC 8265, folds so), as the email key does.
    return _caseless(_visible(_strip(value)))


def _upper(value: Any) -> str:
    # Codes (currencies, countries, tickers) that a provider takes case-blind. Python's
    # upper() merges more than case: a long s → S, ß → SS, ﬀ → FF, a dotless i → I, the micro
    # sign → a capital mu, a titlecase digraph → its capital — spellings no provider takes
    # for one ("usd" with a long s is not "USD" to it). So a letter is accepted only where it
    # and its capital are one simple case pair (é/É; ASCII always), the merge the normalizer
    # is named for, and refused otherwise rather than kept as written: re-spelling it would
    # move every key it had, and a DONE effect submitted again after an upgrade would not
    # find its record. What is accepted keeps the key upper() gave it.
    text = _visible(_strip(value))
    if not text.isascii() and not all(map(_simple_case, text)):
        raise CanonicalizationError(
            "upper merges a letter with its capital only: a letter whose capital is another "
            "letter or several (a long s, a sharp s, a ligature, a dotless i, a final sigma) "
            "is refused (use casefold, or no normalizer)"
        )
    return unicodedata.normalize("NFC", text.upper())


def _simple_case(char: str) -> bool:
    """``char`` is uncased, or one of a pair of one-letter cases that map to each other."""
    upper, lower = char.upper(), char.lower()
    if upper != char:
        return len(upper) == 1 and upper.lower() == char
    return lower == char or (len(lower) == 1 and lower.upper() == char)


# RFC 5322 dot-atom text, plus non-ASCII letters, marks and digits (RFC 6531); never a
# quote, bracket, space, separator, control or format character, nor non-ASCII punctuation
# (a fullwidth at sign or less-than sign is a look-alike, not a mailbox name).
_ATEXT = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&'*+/=?^_`{|}~-"
)


def _letter(char: str) -> bool:
    return ord(char) > 127 and unicodedata.category(char)[0] in "LMN"


def _label(label: str) -> bool:
    """A host name label: 1-63 letters, digits or inner hyphens (IDN letters allowed)."""
    if not 0 < len(label) <= 63 or label[0] == "-" or label[-1] == "-":
        return False
    return all((c.isascii() and (c.isalnum() or c == "-")) or _letter(c) for c in label)


# The plain ASCII address ``_checked`` accepts, in one match instead of a loop over every
# character (most addresses; a third of derive's time for an email tool went there).
_ASCII_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_ASCII_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_ASCII_ADDRESS = re.compile(
    rf"(?=[^@]{{1,64}}@){_ASCII_ATOM}(?:\.{_ASCII_ATOM})*@(?:{_ASCII_LABEL}\.)+{_ASCII_LABEL}"
)


def _address(value: Any) -> str:
    address = _strip(value)
    if len(address) > EMAIL_MAX_CHARS:
        raise CanonicalizationError(f"not an email address (over {EMAIL_MAX_CHARS} characters)")
    if _plain_ascii(address):
        return address
    # Before the address checks: a format character is refused there too, but a variation
    # selector is a mark and a Hangul filler a letter to them.
    return _checked(_visible(address))


def _plain_ascii(address: str) -> bool:
    return (
        address.isascii()
        and _ASCII_ADDRESS.fullmatch(address) is not None
        and not address.rpartition(".")[2].isdigit()
    )


def _checked(address: str) -> str:
    local, at, domain = address.partition("@")
    if not at:
        raise CanonicalizationError("not an email address (no @)")
    if not local or not domain:
        raise CanonicalizationError("not an email address (empty local part or domain)")
    if "@" in domain:
        raise CanonicalizationError("not an email address (more than one @)")
    if len(local) > 64 or any(not atom for atom in local.split(".")):
        raise CanonicalizationError("not an email address (malformed local part)")
    if any(c not in _ATEXT and c != "." and not _letter(c) for c in local):
        raise CanonicalizationError(
            "not an email address (a character a mailbox name cannot hold: quotes, brackets, "
            "spaces, separators and control characters are refused)"
        )
    labels = domain.split(".")
    if len(labels) < 2 or not all(_label(label) for label in labels):
        raise CanonicalizationError(
            "not an email address (the domain must be dot-separated host names)"
        )
    if labels[-1].isdigit():
        raise CanonicalizationError("not an email address (an IP address is not a domain)")
    return address


def _email(value: Any) -> str:
    # Casefolding the whole address is a deliberate over-merge for the key only: two local
    # parts differing in case are almost always one mailbox, and a missed duplicate costs
    # more than a merge. The tool still receives the address as written.
    return _caseless(_address(value))


def _id_submitted(value: Any) -> str | int:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise CanonicalizationError(f"expected an id string or integer, got {type(value).__name__}")
    if isinstance(value, int):
        if abs(value) > JSON_SAFE_INT:
            raise ValueTooLargeError("an integer id must be within ±(2**53 - 1): pass a string")
        return value
    out = _strip(value)
    if not out:
        raise CanonicalizationError("empty identifier")
    return _visible(out)


def _identifier(value: Any) -> str:
    return str(_id_submitted(value))


def _id_forms(value: Any) -> tuple[str | int, str]:
    submitted = _id_submitted(value)
    # An integer's key is its digits; an ASCII id, trimmed and visible, is its own key
    # (``_identifier`` of it reads it back unchanged).
    if type(submitted) is int or (type(submitted) is str and submitted.isascii()):
        return submitted, str(submitted)
    return submitted, _identifier(submitted)


_DECIMAL = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]+))?", re.ASCII)


def _money_submitted(value: Any) -> str | int:
    """The amount as submitted: a string trimmed, an integer as is, a Decimal as its exact
    string (JSON has no Decimal); checked against the bounds."""
    if isinstance(value, float):
        raise CanonicalizationError("money must be a decimal string or integer, never a float")
    if isinstance(value, bool) or not isinstance(value, str | int | Decimal):
        raise CanonicalizationError(f"money must be a decimal string, got {type(value).__name__}")
    out: str | int
    if isinstance(value, str):
        if len(value) > MONEY_MAX_CHARS:
            raise ValueTooLargeError(f"money is over {MONEY_MAX_CHARS} characters")
        out = _strip(value)
    elif isinstance(value, Decimal):
        _money_parts(value)  # bounded before str(): a huge exponent is refused, not printed
        out = str(value)
    else:
        out = value
    _money_parts(out)
    return out


def _money_parts(value: str | int | Decimal) -> tuple[bool, str, int]:
    """(negative, significant digits without leading/trailing zeros, exponent): exact."""
    if isinstance(value, int):
        if abs(value) >= 10**MONEY_MAX_EXPONENT:
            raise ValueTooLargeError(f"money is not below 10**{MONEY_MAX_EXPONENT}")
        negative, digits, exponent = value < 0, str(abs(value)), 0
    elif isinstance(value, Decimal):
        sign, tup, exp = value.as_tuple()
        if not isinstance(exp, int):
            raise CanonicalizationError("money must be finite")
        if len(tup) > MONEY_MAX_CHARS:
            raise ValueTooLargeError(f"money has over {MONEY_MAX_CHARS} digits")
        negative, digits, exponent = bool(sign), "".join(map(str, tup)), exp
    else:
        match = _DECIMAL.fullmatch(value)
        if match is None or not (match[2] or match[3]):
            raise CanonicalizationError("not a decimal amount (ASCII digits, one point)")
        whole, frac = match[2], match[3] or ""
        negative, digits = match[1] == "-", whole + frac
        exponent = int(match[4] or 0) - len(frac)  # bounded: the string is
    stripped = digits.lstrip("0")
    if not stripped:
        return False, "", 0
    significant = stripped.rstrip("0")
    exponent += len(stripped) - len(significant)
    if len(significant) > MONEY_MAX_DIGITS:
        raise ValueTooLargeError(f"money has over {MONEY_MAX_DIGITS} significant digits")
    if exponent + len(significant) > MONEY_MAX_EXPONENT:
        raise ValueTooLargeError(f"money is not below 10**{MONEY_MAX_EXPONENT}")
    if exponent < -MONEY_MAX_EXPONENT:
        raise ValueTooLargeError(f"money has a digit below 10**-{MONEY_MAX_EXPONENT}")
    return negative, significant, exponent


def _money(value: Any) -> str:
    """The exact plain decimal string: "10.50", "10.5", "1.05E+1" → "10.5"; 10 → "10"."""
    return _money_text(*_money_parts(_money_submitted(value)))


def _money_forms(value: Any) -> tuple[str | int, str]:
    if type(value) is not str:
        submitted = _money_submitted(value)
        return submitted, _money(submitted)
    # A string: its parts read once. What they accept is ASCII, so trimming it again (as
    # ``_money`` of the submitted form would) changes nothing.
    if len(value) > MONEY_MAX_CHARS:
        raise ValueTooLargeError(f"money is over {MONEY_MAX_CHARS} characters")
    submitted = _strip(value)
    return submitted, _money_text(*_money_parts(submitted))


def _money_text(negative: bool, digits: str, exponent: int) -> str:
    if not digits:
        return "0"
    if exponent >= 0:
        text = digits + "0" * exponent
    else:
        point = len(digits) + exponent
        whole = digits[:point] if point > 0 else "0"
        text = f"{whole}.{'0' * max(-point, 0)}{digits[max(point, 0) :]}"
    return f"-{text}" if negative else text


NORMALIZERS: Mapping[str, FieldNormalizer] = {
    n.name: n
    for n in (
        FieldNormalizer("text", _text, _text),
        FieldNormalizer("strip", _strip, _strip),
        FieldNormalizer("casefold", _casefold, _strip),
        FieldNormalizer("upper", _upper, _strip),
        FieldNormalizer("email", _email, _address),
        FieldNormalizer("id", _identifier, _id_submitted, _id_forms),
        FieldNormalizer("money", _money, _money_submitted, _money_forms),
    )
}


def resolve_normalizer(name_or_fn: str | Normalizer) -> Normalizer:
    if callable(name_or_fn):
        return name_or_fn
    try:
        return NORMALIZERS[name_or_fn]
    except (KeyError, TypeError):
        known = ", ".join(sorted(NORMALIZERS))
        raise SpecError(f"unknown normalizer {name_or_fn!r} (known: {known})") from None
