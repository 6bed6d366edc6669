"""The message envelope is strict: what a worker accepts before it derives anything."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from workers import Envelope

GOOD: dict[str, Any] = {"v": 1, "key": "a" * 64, "scope": "s", "action": "default", "args": {}}


def test_a_well_formed_envelope_validates() -> None:
    assert Envelope.model_validate(GOOD).key == "a" * 64


@pytest.mark.parametrize(
    "change",
    [
        {"v": 2},
        {"key": "A" * 64},
        {"key": "a" * 63},
        {"scope": ""},
        {"scope": 5},
        {"args": []},
        {"extra": True},
        {"args": {"x": object()}},
    ],
)
def test_anything_else_is_refused(change: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Envelope.model_validate({**GOOD, **change})
