"""Pause and resume with the broker on RabbitMQ: a held-back message goes through
``effectq.DQ`` like any retry, and the same live test holds (tests/integration)."""

from __future__ import annotations

from tests.integration import test_pause_and_limits as redis_suite

own_runtime = redis_suite.own_runtime
test_a_paused_tool_waits_on_any_broker_counted_in_its_metric = (
    redis_suite.test_a_paused_tool_waits_on_any_broker_counted_in_its_metric
)
