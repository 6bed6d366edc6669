"""The controls' pieces in this process: a tool's declared limits (refused at declaration in
one line), the pause state in the ledger with its audit entry, and ``effectq_paused`` /
``effectq_deferred_total`` born at 0 for every bounded label set. The worker side runs live
in tests/integration/test_pause_and_limits.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dedupe import Ledger, OperatorError, SpecError
from tests.support.ledgers import fresh_ledger
from workers import effect_tool, metrics
from workers.broker.gate import Limits, paused, set_paused
from workers.dev.redis_server import RedisServer
from workers.metrics import collector


@pytest.fixture
def ledger(shared_redis_server: RedisServer) -> Iterator[Ledger]:
    yield fresh_ledger(shared_redis_server.url)


@pytest.mark.parametrize(
    ("rate", "concurrency"),
    [("100/h", None), ("0/s", None), ("100", None), ("1e3/s", None), (" 5/s", None),
     (None, 0), (None, 33), (None, 2.0), (None, True), ("5/s\n", None)],
)  # fmt: skip
def test_a_bad_limit_is_refused_at_declaration_in_one_line(
    rate: str | None, concurrency: int | None
) -> None:
    with pytest.raises(SpecError) as refused:
        effect_tool(identity=("target",), name="never_declared", rate=rate,
                    concurrency=concurrency)  # fmt: skip
    message = str(refused.value)
    assert "\n" not in message and (rate is None or repr(rate) not in message)


def test_declared_limits_read_back_as_declared() -> None:
    assert Limits.declare("600/m", 4) == Limits(rate=600, window_s=60, concurrency=4)
    assert Limits.declare("100/s", None).as_dict() == {"rate": "100/s", "concurrency": None}  # type: ignore[union-attr]
    assert Limits.declare(None, None) is None


@pytest.mark.parametrize(
    ("rate", "spacing"),
    [("5/s", (1, 200)), ("100/s", (10, 100)), ("1234/s", (124, 101)), ("600/m", (1, 100)),
     ("1/m", (1, 60_000))],
)  # fmt: skip
def test_a_rate_is_spread_over_buckets_never_above_it(rate: str, spacing: tuple[int, int]) -> None:
    limits = Limits.declare(rate, None)
    assert limits is not None and limits.rate is not None
    per, bucket_ms = limits.spacing()
    assert (per, bucket_ms) == spacing and bucket_ms >= 100
    assert per * limits.window_s * 1000 / bucket_ms <= limits.rate


def test_pause_state_is_kept_in_the_ledger_and_each_change_audited(ledger: Ledger) -> None:
    first = set_paused(ledger, "tool", "charge", pause=True, actor="sre", reason="outage")
    again = set_paused(ledger, "tool", "charge", pause=True, actor="sre", reason="still")
    assert (first["changed"], again["changed"]) == (True, False)
    [(target, note)] = paused(ledger).items()
    assert target == ("tool", "charge") and (note["actor"], note["reason"]) == ("sre", "still")
    set_paused(ledger, "tool", "charge", pause=False, actor="sre", reason="back")
    assert paused(ledger) == {}
    assert [(e["action"], e["outcome"]) for e in ledger.audit_log()] == [
        ("resume", "ok: tool charge resumed"),
        ("pause", "ok: tool charge was paused already"),
        ("pause", "ok: tool charge paused"),
    ]
    with pytest.raises(OperatorError):
        set_paused(ledger, "queue", "bad queue", pause=True, actor="sre", reason="r")


def test_effectq_paused_is_born_at_0_for_every_declared_tool_and_queue(ledger: Ledger) -> None:
    import workers.examples  # noqa: F401  (declares charge, send_email, set_value)

    source = collector.LedgerCollector(lambda: ledger, queues=["effectq"])
    [family] = [f for f in source.collect() if f.name == "effectq_paused"]
    before = {(s.labels["kind"], s.labels["name"]): s.value for s in family.samples}
    assert before[("tool", "charge")] == 0 and before[("queue", "effectq")] == 0
    set_paused(ledger, "queue", "effectq", pause=True, actor="sre", reason="upgrade")
    [family] = [f for f in source.collect() if f.name == "effectq_paused"]
    after = {(s.labels["kind"], s.labels["name"]): s.value for s in family.samples}
    assert after == {**before, ("queue", "effectq"): 1}


def test_deferrals_are_counted_from_0_by_cause() -> None:
    metrics.for_tool("charge")
    for cause in metrics.DEFERRAL_CAUSES:
        sample = metrics.REGISTRY.get_sample_value(
            "effectq_deferred_total", {"tool": "charge", "cause": cause}
        )
        assert sample is not None


@pytest.mark.parametrize("verb", ["pause", "resume", "controls"])
def test_the_control_verbs_help_names_things_in_words(verb: str) -> None:
    from typer.testing import CliRunner

    from workers.cli import app

    result = CliRunner().invoke(app, [verb, "--help"])
    assert result.exit_code == 0, result.output
    for python_ism in ("<str>", "<bool>", "<int>", "list[", "--no-"):
        assert python_ism not in result.output, (verb, python_ism)
