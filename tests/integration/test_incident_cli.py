"""What an on-call types during an incident, against a real ledger: dead letters by reason
(the bounded reason of effectq_dead_letters_total, read back from what the worker recorded),
an effect by the 12 hex digits a log line prints, its history in ISO times, durations."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from typer.testing import CliRunner

from dedupe import ConflictError, MessageError, RejectedError, StaleMessageError
from tests.support.ledgers import charge
from workers import runtime
from workers.broker.dead_letters import UNDECODABLE
from workers.cli import app
from workers.dev.local import LocalStack


def cli(live: LocalStack, *argv: str) -> Any:
    result = CliRunner().invoke(app, list(argv), env=live.env())
    assert result.exit_code == 0, (result.exit_code, result.output, result.stderr)
    return json.loads(result.stdout)


def _dead(tool: str, exc: BaseException | None, kind: str, *, unknown: bool = False) -> None:
    """A dead letter as broker.middleware records one: its text, and its bounded kind."""
    if unknown:
        reason = f"unknown tool {tool!r}"
    elif exc is None:
        reason = "rejected"
    else:
        reason = f"{type(exc).__name__}: {exc}"
    runtime.current().record_dead_letter(
        message_id=f"m-{kind}", tool=tool, key=None, reason=reason, kind=kind
    )


def test_deadletters_by_reason_match_the_metrics_label(live: LocalStack) -> None:
    _dead("charge", ConflictError("charge: bound fields differ"), "conflict")
    _dead("charge", StaleMessageError("charge: past the provider's window"), "stale")
    _dead("charge", MessageError("charge: missing field amount"), "invalid_message")
    _dead("charge", RejectedError("charge: the provider refused it"), "rejected")
    _dead("charge", TimeoutError("no answer"), "retries_exhausted")
    _dead("charge", None, "other")
    _dead("refund", None, "unknown_tool", unknown=True)
    _dead(UNDECODABLE, ValueError("not JSON"), "undecodable")
    for kind in ("conflict", "stale", "invalid_message", "rejected", "retries_exhausted",
                 "other", "unknown_tool", "undecodable"):  # fmt: skip
        page = cli(live, "deadletters", "--reason", kind, "--since", "1h", "--json")
        assert [e["message_id"] for e in page["dead_letters"]] == [f"m-{kind}"], kind
    # Paging within one reason: a page of one, then the rest, no repeats.
    _dead("charge", ConflictError("charge: bound fields differ again"), "conflict")
    first = cli(live, "deadletters", "--reason", "conflict", "--limit", "1", "--json")
    rest = cli(live, "deadletters", "--reason", "conflict", "--cursor", first["next_cursor"],
               "--json")  # fmt: skip
    assert len(first["dead_letters"]) == 1 and len(rest["dead_letters"]) == 1
    assert first["dead_letters"][0]["id"] != rest["dead_letters"][0]["id"]
    assert rest["next_cursor"] is None


def test_inspect_takes_the_prefix_a_log_line_prints_and_shows_iso_times(
    live: LocalStack,
) -> None:
    effect = charge()
    runtime.ledger().claim(effect, lease_s=30, holder="w/1")
    whole = cli(live, "inspect", effect.key, "--json")
    by_prefix = cli(live, "inspect", effect.key[:12], "--json")
    assert by_prefix["key"] == effect.key and by_prefix["history"] == whole["history"]
    (entry,) = whole["history"]
    assert datetime.fromisoformat(entry["at"]).timestamp() * 1000 == entry["at_ms"]
    text = CliRunner().invoke(app, ["inspect", effect.key[:12]], env=live.env()).stdout
    assert f"history: {entry['at']} CLAIMED" in text, text
    missing = CliRunner().invoke(app, ["inspect", "0" * 12], env=live.env())
    assert missing.exit_code == 6 and "0" * 12 not in missing.stderr
