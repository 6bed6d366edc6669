"""Failpoint specs: parsed strictly, inert unless armed."""

from __future__ import annotations

import pytest

from dedupe import failpoints


def test_spec_arms_each_named_point_with_action_and_probability() -> None:
    armed = failpoints.parse("after_claim=kill;after_effect=kill@0.2;before_commit=sleep:1.5")
    assert armed["after_claim"].action == "kill" and armed["after_claim"].probability == 1
    assert armed["after_effect"].probability == 0.2
    assert armed["before_commit"].action == "sleep" and armed["before_commit"].argument == 1.5


@pytest.mark.parametrize(
    "spec", ["nowhere=kill", "after_claim", "after_claim=explode", "after_claim=sleep"]
)
def test_bad_specs_are_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="bad failpoint"):
        failpoints.parse(spec)


def test_raise_failpoint_raises_and_unarmed_points_do_nothing() -> None:
    failpoints.arm("before_effect=raise")
    try:
        failpoints.failpoint("after_claim")
        with pytest.raises(failpoints.FailpointError, match="before_effect"):
            failpoints.failpoint("before_effect")
    finally:
        failpoints.arm("")
    failpoints.failpoint("before_effect")
