"""Dead letters under an on-call's hands, live: real worker pools dead-letter charges (a pool
deployed without the tool), then `effectq requeue` puts one back with a fresh retry budget and
a fixed pool runs it once, `effectq purge` drops another, `requeue --all --tool` the rest;
every action is on the audit stream and on each effect's own trail."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dedupe import State
from tests.support.stack import wait_for, wait_states
from workers import runtime, submit
from workers.broker.dead_queue import DeadLetterQueue
from workers.cli import app
from workers.dev.local import LocalStack

NO_CHARGE = """
from workers import effect_tool


@effect_tool(identity=("target",), name="noop_tool")
def noop_tool(target: str) -> dict[str, str]:
    return {"id": target}
"""


@pytest.fixture
def own_runtime() -> Iterator[None]:
    """The acting verbs install a runtime of their own in this process: put the session's
    back afterwards."""
    previous = runtime.current()
    yield
    runtime.install(previous)


def cli(live: LocalStack, *argv: str) -> Any:
    result = CliRunner().invoke(app, [*argv, "--json"], env=live.env())
    assert result.exit_code == 0, (argv, result.exit_code, result.stdout, result.stderr)
    return json.loads(result.stdout)


def test_requeue_and_purge_dead_letters_audited(
    live: LocalStack, tmp_path: Path, own_runtime: None
) -> None:
    keys = [submit("charge", scope=f"dlq-{i}", customer=f"c{i}", amount="5.00",
                   currency="eur").key for i in range(3)]  # fmt: skip
    # A pool deployed with the wrong tools module: every charge is an unknown tool to it.
    (tmp_path / "no_charge.py").write_text(NO_CHARGE)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    wrong = live.start_workers(1, 2, EFFECTQ_TOOLS="no_charge", PYTHONPATH=path)
    dead = DeadLetterQueue(runtime.current().broker.client, "effectq")  # type: ignore[attr-defined]
    wait_for(lambda: len(dead.letters(tool="charge")) == 3, timeout=60, what="3 dead letters")
    live.stop_processes()
    assert wrong.poll() is not None
    by_key = {letter.key: letter.message_id for letter in dead.letters()}
    assert set(by_key) == set(keys)

    assert cli(live, "requeue", "--all", "--tool", "charge", "--dry-run")["matched"] == 3
    assert len(dead.letters()) == 3  # a dry run changes nothing
    one = cli(live, "requeue", by_key[keys[0]], "--actor", "sre", "--reason", "pool fixed")
    assert one["requeued"] == [by_key[keys[0]]] and one["refused"] == []
    two = cli(live, "purge", by_key[keys[1]], "--actor", "sre", "--reason", "customer cancelled")
    assert two["purged"] == [by_key[keys[1]]]
    again = cli(live, "purge", by_key[keys[1]], "--actor", "sre", "--reason", "twice")
    assert again["purged"] == [] and again["not_found"] == [by_key[keys[1]]]
    assert [letter.key for letter in dead.letters()] == [keys[2]]

    live.start_workers(1, 2)  # the right tools
    records = wait_states(runtime.ledger(), [keys[0]], timeout=60)
    assert records[keys[0]].state is State.DONE
    rest = cli(live, "requeue", "--all", "--tool", "charge", "--actor", "sre", "--reason", "r")
    assert rest["requeued"] == [by_key[keys[2]]]
    assert wait_states(runtime.ledger(), [keys[2]], timeout=60)[keys[2]].state is State.DONE
    executions = live.stats()["executions"]
    assert executions.get(keys[0]) == executions.get(keys[2]) == 1
    assert runtime.ledger().get(keys[1]) is None  # purged: never ran
    assert dead.letters() == []

    audit = cli(live, "audit", "--actor", "sre")["audit"]
    actions = [(e["action"], e["key"], e["outcome"].split(" (")[0]) for e in audit]
    assert actions == [
        ("deadletter_requeue", "", "ok: 1 of 1"),
        ("deadletter_requeue", keys[2], "ok: back on effectq"),
        ("deadletter_purge", "", "ok: 0 of 0"),
        ("deadletter_purge", "", "ok: 1 of 1"),
        ("deadletter_purge", keys[1], "ok: dropped from effectq"),
        ("deadletter_requeue", "", "ok: 1 of 1"),
        ("deadletter_requeue", keys[0], "ok: back on effectq"),
    ]
    trail = cli(live, "audit", keys[0])["audit"]
    assert [(e["action"], e["reason"]) for e in trail] == [("deadletter_requeue", "pool fixed")]
