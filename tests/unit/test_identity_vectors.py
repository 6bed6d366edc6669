"""Frozen effect keys and fingerprints: a key that changes between releases makes every
recorded effect new again (a second payment after an upgrade). ``data/identity_vectors.json``
was written by the derivation of 0.2.0; any change to ``derive``, the canonical form or a
built-in normalizer that moves one of these is a breaking change, not a refactor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dedupe import ToolSpec, derive

_FILE = Path(__file__).parent / "data" / "identity_vectors.json"


def _vectors() -> dict[str, dict[str, str]]:
    return {v["name"]: v for v in json.loads(_FILE.read_text(encoding="utf-8"))}


def _shout(value: Any) -> Any:
    """A user's normalizer that returns a decomposed (non-NFC) string and a nested value."""
    return {"v": str(value).upper() + "e\u0301", "n": [1, 2.5, None, True]}


CASES: list[dict[str, Any]] = [
    {"name": "charge", "identity": ("customer",), "bound": ("customer", "amount", "currency"),
     "normalizers": {"customer": "id", "amount": "money", "currency": "upper"},
     "scope": "order-1", "args": {"customer": "cus_42", "amount": "10.50", "currency": "usd"}},
    {"name": "charge-money-forms", "identity": ("customer",), "bound": ("customer", "amount"),
     "normalizers": {"customer": "id", "amount": "money"},
     "scope": "  order-1  ", "args": {"customer": " CUS_42 ", "amount": "10.5"}},
    {"name": "email", "identity": ("to",), "bound": ("to", "subject"),
     "normalizers": {"to": "email", "subject": "text"}, "free": ("body",),
     "scope": "campaign-7", "args": {"to": "Ada@Example.COM", "subject": "Caf\u00e9",
                                     "body": {"html": "<p>hi</p>", "tags": ["a", "b"]}}},
    {"name": "unicode-scope", "identity": ("who",), "bound": ("who",),
     "normalizers": {"who": "casefold"},
     "scope": "Cafe\u0301 \U0001f600", "args": {"who": "STRASSE \u00df"}},
    {"name": "strip-upper", "identity": ("a", "b"), "bound": ("a", "b", "c"),
     "normalizers": {"a": "strip", "b": "upper"},
     "scope": "s", "args": {"a": "  x ", "b": "\u00e9t\u00e9", "c": [1, {"z": 0.1, "y": -0.0}]}},
    {"name": "numbers", "identity": ("n",), "bound": ("n", "f", "big"),
     "scope": "s", "args": {"n": 9007199254740991, "f": 1e21, "big": "123456789012345678901"}},
    {"name": "nested-unnormalized", "identity": ("obj",), "bound": ("obj",),
     "scope": "s", "args": {"obj": {"k\u0065\u0301y": ["e\u0301", {"b": 1, "a": [None, False]}]}}},
    {"name": "user-normalizer", "identity": ("x",), "bound": ("x",),
     "normalizers": {"x": _shout}, "scope": "s", "args": {"x": "abc"}},
    {"name": "action", "identity": ("id",), "bound": ("id",), "actions": ("refund",),
     "action": "refund", "scope": "s", "args": {"id": "ch_1"}},
    {"name": "optional-bound-absent", "identity": ("id",), "bound": ("id",), "free": ("note",),
     "scope": "s", "args": {"id": "x"}},
]  # fmt: skip


def spec_of(case: dict[str, Any]) -> ToolSpec:
    return ToolSpec(
        name=case["name"],
        identity=case["identity"],
        bound=case["bound"],
        free=case.get("free", ()),
        normalizers=case.get("normalizers", {}),
        actions=case.get("actions", ()),
    )


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_keys_and_fingerprints_are_the_frozen_ones(case: dict[str, Any]) -> None:
    effect = derive(spec_of(case), case["scope"], case["args"], action=case.get("action"))
    frozen = _vectors()[case["name"]]
    assert (effect.key, effect.fingerprint) == (frozen["key"], frozen["fingerprint"])


def test_every_case_has_a_frozen_vector() -> None:
    assert sorted(_vectors()) == sorted(c["name"] for c in CASES)
