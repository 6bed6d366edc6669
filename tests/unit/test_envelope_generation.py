"""The envelope's ``g``: the generation a message was submitted for (issue 15, item 1)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from workers import Envelope

GOOD: dict[str, Any] = {"v": 1, "key": "a" * 64, "scope": "s", "action": "default", "args": {}}


def test_a_message_without_a_generation_was_submitted_for_generation_zero() -> None:
    assert Envelope.model_validate(GOOD).g == 0
    assert Envelope.model_validate({**GOOD, "g": 3}).g == 3


@pytest.mark.parametrize("g", [-1, "1", 1.0, True, None])
def test_a_generation_is_a_non_negative_integer(g: object) -> None:
    with pytest.raises(ValidationError):
        Envelope.model_validate({**GOOD, "g": g})


def test_an_envelope_at_its_defaults_reads_as_the_previous_release_wrote_it() -> None:
    # A worker of the previous release forbids unknown fields: during a rolling upgrade only
    # a post-revoke submission (g > 0) may carry the new field.
    assert Envelope.model_validate(GOOD).model_dump() == GOOD
    assert Envelope.model_validate({**GOOD, "g": 2}).model_dump() == {**GOOD, "g": 2}
