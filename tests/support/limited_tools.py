"""A tools module for the limits tests: the shipped examples, plus a tool declaring its
provider's rate limit and one declaring a concurrency limit that logs when each call starts
and ends (``EFFECTQ_TEST_SPANS``: a file every process appends to)."""

from __future__ import annotations

import os
import time

import workers.examples  # noqa: F401  (the pause tests run `charge` beside these)
from workers import EffectCall, ToolResult, effect_tool
from workers.examples import post_effect

RATE = 5
CONCURRENCY = 2


@effect_tool(identity=("target",), bound=("target",), rate=f"{RATE}/s")
def rated_set(call: EffectCall, target: str) -> ToolResult:
    return post_effect(call, {"target": target})


@effect_tool(identity=("target",), bound=("target",), concurrency=CONCURRENCY)
def narrow_set(call: EffectCall, target: str) -> ToolResult:
    started = time.time()
    result = post_effect(call, {"target": target})
    # One short line per call, appended whole (O_APPEND): the test reads the overlaps.
    with open(os.environ["EFFECTQ_TEST_SPANS"], "a", encoding="utf-8") as spans:
        spans.write(f"{started} {time.time()}\n")
    return result


@effect_tool(identity=("target",), bound=("target",), concurrency=1, time_limit=2_000)
def single_set(call: EffectCall, target: str) -> ToolResult:
    return post_effect(call, {"target": target})
