"""The ``effectq`` command line as a person and a script meet it: help that reads as words,
``--version`` and ``-h``, a quick start-up, and any bad input answered with one line on
stderr and a non-zero exit — never a traceback, never the refused value. None of these
needs a server: a malformed value is refused before anything is contacted (the ledger URL
points at a closed port, so a test that got further would fail with exit 7)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from workers.cli import RECONCILER_METRICS_PORT, app, reconciler_metrics_port
from workers.dev.redis_server import RedisServer
from workers.settings import Settings

UNREACHABLE = {
    "EFFECTQ_REDIS_URL": "redis://127.0.0.1:1/0",
    "EFFECTQ_BROKER_URL": "redis://127.0.0.1:1/1",
}
KEY = "a" * 64
WIDE = {"COLUMNS": "200", "TERM": "dumb"}


def run(argv: list[str], **env: str) -> Any:
    return CliRunner().invoke(app, argv, env={**UNREACHABLE, **WIDE, **env})


def assert_one_line_refusal(result: Any, secret: str | None = None, code: int = 2) -> str:
    assert result.exit_code == code, (result.exit_code, result.output, result.stderr)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("effectq: "), result.stderr
    assert "Traceback" not in result.output + result.stderr
    if secret is not None:
        assert secret not in result.output + result.stderr
    return lines[0]


# -- help ----------------------------------------------------------------------------------

VERBS = [
    [], ["sandbox"], ["worker"], ["submit"], ["reconciler"], ["api"], ["inspect"], ["list"],
    ["resolve"], ["revoke"], ["supersede"], ["replay"], ["demo"], ["campaign"],
    ["campaign", "submit"], ["campaign", "status"], ["deadletters"], ["audit"], ["recheck"],
    ["requeue"], ["purge"], ["scheduled"],
]  # fmt: skip


@pytest.mark.parametrize("verb", VERBS, ids=lambda v: " ".join(v) or "effectq")
def test_help_names_things_in_words(verb: list[str]) -> None:
    for flag in ("--help", "-h"):
        result = run([*verb, flag])
        assert result.exit_code == 0, result.output
        text = result.output
        for python_ism in ("<str>", "<bool>", "<int>", "<float>", "list[", "--no-no-"):
            assert python_ism not in text, (verb, python_ism, text)
        usage = next(line for line in text.splitlines() if "Usage:" in line)
        assert "{" not in usage, usage


def test_boolean_flags_read_as_words_and_metavars_name_the_thing() -> None:
    sandbox = run(["sandbox", "-h"]).output
    assert "--lookup" in sandbox and "--no-lookup" in sandbox
    assert "--provider-idempotency" in sandbox and "--no-provider-idempotency" in sandbox
    resolve = run(["resolve", "-h"]).output
    assert "Usage: effectq resolve [OPTIONS] KEY" in resolve
    assert "--override-evidence" in resolve and "--no-override-evidence" not in resolve
    assert "--executed" in resolve and "--not-executed" in resolve
    assert "JSON" in run(["resolve", "-h"]).output
    assert "SECONDS" in run(["reconciler", "-h"]).output
    assert "NAME=VALUE" in run(["submit", "-h"]).output


def test_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    result = run(["--version"])
    assert result.exit_code == 0 and result.stdout == f"effectq {version('effectq')}\n"


def test_sandbox_switches_reach_the_provider_config(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def serve(config: Any, **kwargs: Any) -> None:
        seen["config"] = config

    monkeypatch.setattr("workers.dev.sandbox.serve", serve)
    assert run(["sandbox"]).exit_code == 0
    assert seen["config"].lookup_enabled and seen["config"].provider_idempotency
    assert run(["sandbox", "--no-lookup", "--no-provider-idempotency"]).exit_code == 0
    assert not seen["config"].lookup_enabled and not seen["config"].provider_idempotency


# -- start-up ------------------------------------------------------------------------------


def _modules_after(argv: list[str]) -> set[str]:
    """The top-level modules a verb imported before it answered (run as a real process)."""
    code = (
        "import sys\n"
        "from workers.cli import app\n"
        "try:\n"
        "    app(sys.argv[1:])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('MODULES', *sorted({m.split('.')[0] for m in sys.modules}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *argv],
        env={**os.environ, **UNREACHABLE},
        capture_output=True,
        text=True,
        timeout=60,
    )
    [line] = [line for line in done.stdout.splitlines() if line.startswith("MODULES ")]
    return set(line.split()[1:])


def test_help_imports_none_of_effectq_runtime() -> None:
    loaded = _modules_after(["--help"])
    assert "typer" in loaded
    # (``dedupe.lazy``, the three packages' lazy-export helper, is all of dedupe it loads.)
    assert not loaded & {
        "redis", "dramatiq", "httpx", "pydantic", "dedupe.ledger", "dedupe.identity", "reconciler"
    }  # fmt: skip


def test_inspect_imports_the_ledger_but_not_the_worker_path() -> None:
    loaded = _modules_after(["inspect", KEY])
    assert "redis" in loaded and "dedupe" in loaded
    assert not loaded & {"dramatiq", "httpx", "fastapi", "starlette", "prometheus_client"}


# -- bad input -----------------------------------------------------------------------------

KEYED = {
    "audit": [],
    "revoke": ["--actor", "ops", "--reason", "r"],
    "supersede": ["--actor", "ops", "--reason", "r"],
    "replay": ["--actor", "ops", "--reason", "r"],
    "resolve": ["--actor", "ops", "--reason", "r", "--not-executed"],
}

MALFORMED_KEYS = {
    "short": "abc",
    "uppercase": "A" * 64,
    "one more digit": "a" * 65,
    "one digit less": "a" * 63,
    "not hex": "g" * 64,
    "fullwidth look-alikes": "\uff41" * 64,
    "cyrillic a": "\u0430" * 64,
    "arabic-indic digits": "\u0661" * 64,
    "trailing newline": "a" * 64 + "\n",
    "huge": "a" * 1_000_000,
    "empty": "",
    "a glob": "*",
    "a secret": "4111111111111111",
}


@pytest.mark.parametrize("verb", sorted(KEYED))
@pytest.mark.parametrize("key", list(MALFORMED_KEYS.values()), ids=list(MALFORMED_KEYS))
def test_a_malformed_key_is_refused_in_one_line_without_a_traceback(verb: str, key: str) -> None:
    line = assert_one_line_refusal(run([verb, key, *KEYED[verb]]), secret=key or None)
    assert "64 lowercase hex digits" in line


NOT_A_PREFIX = {
    name: key
    for name, key in MALFORMED_KEYS.items()
    if not (12 <= len(key) <= 64 and set(key) <= set("0123456789abcdef"))
}


@pytest.mark.parametrize("key", list(NOT_A_PREFIX.values()), ids=list(NOT_A_PREFIX))
def test_inspect_refuses_what_is_neither_a_key_nor_the_prefix_logs_print(key: str) -> None:
    line = assert_one_line_refusal(run(["inspect", key]), secret=key or None)
    assert "first 12 or more lowercase hex digits" in line


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.text(min_size=1, max_size=200).filter(lambda s: not s.startswith("-")))
def test_any_key_but_64_lowercase_hex_is_refused(key: str) -> None:
    result = run(["revoke", key, "--actor", "ops", "--reason", "r"])
    if len(key) == 64 and set(key) <= set("0123456789abcdef"):
        assert result.exit_code == 7  # got as far as the (unreachable) ledger
    else:
        assert_one_line_refusal(result)


BAD_NUMBERS = {
    "reconciler --interval text": ["reconciler", "--interval", "secret-interval"],
    "reconciler --interval nan": ["reconciler", "--interval", "nan"],
    "reconciler --interval inf": ["reconciler", "--interval", "inf"],
    "reconciler --interval negative": ["reconciler", "--interval", "-1"],
    "list --limit huge": ["list", "--limit", "9" * 5000],
    "list --limit float": ["list", "--limit", "1e999"],
    "list --limit zero": ["list", "--limit", "0"],
    "submit --wait nan": ["submit", "send_email", "--scope", "s", "--wait", "nan"],
    "submit --wait huge": ["submit", "send_email", "--scope", "s", "--wait", "1e999"],
    "worker --processes text": ["worker", "--processes", "secret-processes"],
    "worker --processes zero": ["worker", "--processes", "0"],
    "sandbox --fail-rate nan": ["sandbox", "--fail-rate", "nan"],
    "sandbox --port huge": ["sandbox", "--port", "99999999"],
    "demo --calls huge": ["demo", "--calls", "9" * 30],
    "demo --duplicate-rate nan": ["demo", "--duplicate-rate", "nan"],
    "campaign status --page-size negative": ["campaign", "status", "c", "--page-size", "-5"],
    "metrics port text": ["reconciler", "--metrics-port", "secret-port"],
}


@pytest.mark.parametrize("argv", list(BAD_NUMBERS.values()), ids=list(BAD_NUMBERS))
def test_a_bad_number_is_refused_in_one_line(argv: list[str]) -> None:
    assert_one_line_refusal(run(argv), secret="secret")


BAD_JSON = {
    "not JSON": "{secret",
    "not an object": '["secret"]',
    "NaN": '{"id": NaN}',
    "Infinity": '{"id": Infinity}',
    "deeply nested": '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "a 5000-digit number": '{"a": ' + "7" * 5000 + "}",
}


@pytest.mark.parametrize("text", list(BAD_JSON.values()), ids=list(BAD_JSON))
def test_bad_json_for_receipt_and_arg_is_refused_in_one_line(text: str) -> None:
    resolve = ["resolve", KEY, "--actor", "ops", "--reason", "r", "--executed", "--receipt", text]
    assert_one_line_refusal(run(resolve), secret="secret")
    if text.startswith("{"):  # --arg NAME:=JSON takes any JSON value, objects included
        submit = ["submit", "send_email", "--scope", "s", "--arg", f"recipient:={text}"]
        assert_one_line_refusal(run(submit), secret="secret")


@pytest.mark.parametrize(
    "tool", ["secret tool", "secret\u200btool", "s" + "ecret" * 50_000, "\uff53ecret", "-secret"]
)
def test_a_tool_name_that_cannot_be_one_is_refused_without_echoing_it(tool: str) -> None:
    result = run(["submit", "--scope", "s", "--", tool])
    assert_one_line_refusal(result, secret="ecret")


def test_a_malformed_setting_is_refused_without_its_value() -> None:
    result = run(["inspect", KEY], EFFECTQ_METRICS_PORT="secret-port-value")
    line = assert_one_line_refusal(result, secret="secret-port-value")
    assert "metrics_port" in line


def test_an_unreachable_ledger_is_one_line_and_exit_7() -> None:
    assert_one_line_refusal(run(["inspect", KEY]), code=7)
    assert_one_line_refusal(run(["list"]), code=7)


def test_an_unreachable_broker_is_one_line_and_exit_7(shared_redis_server: RedisServer) -> None:
    # Its own process: the broker a process builds is a process-wide global (another test's
    # stack may have built one in this process already).
    argv = ["submit", "send_email", "--scope", "s", "--arg", "recipient=secret@x.example"]
    # A database of its own: other tests' namespaces on db 0 would have the ledger's
    # version check refuse this namespace first (exit 2), before the broker is tried.
    ledger = f"redis://127.0.0.1:{shared_redis_server.port}/4"
    redis.Redis.from_url(ledger).flushdb()
    done = subprocess.run(
        [sys.executable, "-m", "workers", *argv],
        env={**os.environ, **UNREACHABLE, **WIDE, "EFFECTQ_REDIS_URL": ledger},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 7, (done.returncode, done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("effectq: "), done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert "secret" not in done.stdout + done.stderr
    assert "unavailable" in lines[0]


def test_an_unknown_option_or_command_is_one_line() -> None:
    assert_one_line_refusal(run(["inspect", KEY, "--secret-option"]))
    assert_one_line_refusal(run(["secret-verb"]), secret="secret-verb")
    assert_one_line_refusal(run(["--bogus"]))
    assert_one_line_refusal(run(["inspect"]))


@pytest.mark.parametrize(
    "text",
    ['{"campaign_id": "c", "tool": "send_email", "recipients": "secret@x.example"}', "{", "NaN"],
)
def test_a_bad_campaign_file_is_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(text)
    assert_one_line_refusal(run(["campaign", "submit", str(path)]), secret="secret")
    assert_one_line_refusal(run(["campaign", "submit", str(tmp_path / "missing.json")]))


# -- metrics ports -------------------------------------------------------------------------


def test_a_reconciler_and_a_worker_pool_default_to_different_metrics_ports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("EFFECTQ_METRICS_PORT", raising=False)
    assert Settings().metrics_port == 9191  # the worker pool's supervisor
    assert reconciler_metrics_port(Settings(), None) == RECONCILER_METRICS_PORT == 9192
    assert reconciler_metrics_port(Settings(), 0) == 0
    monkeypatch.setenv("EFFECTQ_METRICS_PORT", "9300")  # named explicitly: taken as it is
    assert reconciler_metrics_port(Settings(), None) == 9300
    assert reconciler_metrics_port(Settings(), 9400) == 9400


# -- the incident tools: deadletters, audit, recheck, list paging ----------------------------

RECHECK = ["recheck", "--tool", "charge", "--actor", "sre", "--reason", "outage"]
BAD_TIMES = {
    "not a time": "secret-yesterday",
    "nan": "nan",
    "infinity": "inf",
    "negative seconds": "-5",
    "over a year ago": "99999999999",
    "a 5000-digit number": "7" * 5000,
    "a huge ISO-looking text": "2027-01-01T00:00:00" + "0" * 100_000,
    "year 1": "0001-01-01",
    "month 13": "2027-13-01",
    "empty": "",
}
TIMED = {
    "deadletters --since": ["deadletters", "--since"],
    "audit --since": ["audit", "--since"],
    "list --since": ["list", "--since"],
    "recheck --since": [*RECHECK, "--since"],
    "recheck --until": [*RECHECK, "--until"],
}


@pytest.mark.parametrize("argv", list(TIMED.values()), ids=list(TIMED))
@pytest.mark.parametrize("text", list(BAD_TIMES.values()), ids=list(BAD_TIMES))
def test_a_bad_time_is_refused_in_one_line_before_the_ledger(argv: list[str], text: str) -> None:
    line = assert_one_line_refusal(run([*argv, text]), secret="secret")
    assert "--since" in line or "--until" in line


INCIDENT_INPUT = {
    "deadletters --limit huge": ["deadletters", "--limit", "9" * 5000],
    "deadletters --limit over a page": ["deadletters", "--limit", "1001"],
    "deadletters --limit zero": ["deadletters", "--limit", "0"],
    "deadletters --tool bad": ["deadletters", "--tool", "secret tool"],
    "deadletters --cursor bad": ["deadletters", "--cursor", "secret-cursor"],
    "audit --limit negative": ["audit", "--limit", "-1"],
    "audit --cursor bad": ["audit", "--cursor", "$secret"],
    "audit --actor huge": ["audit", "--actor", "secret" * 100],
    "list --limit over a page with --cursor": ["list", "--cursor", "u1." + "a" * 64,
                                               "--limit", "5000"],
    "list --key bad": ["list", "--key", "secret"],
    "list --key short": ["list", "--key", "a" * 11],
    "list --since a settled state": ["list", "--state", "DONE", "--since", "60"],
    "list --key and --cursor": ["list", "--key", "a" * 12, "--cursor", "u1." + "a" * 64],
    "recheck --tool bad": ["recheck", "--tool", "secret tool", "--actor", "a", "--reason", "r"],
    "recheck without --tool": ["recheck", "--actor", "a", "--reason", "r"],
    "recheck an empty range": [*RECHECK, "--since", "2027-01-02", "--until", "2027-01-01"],
    "recheck without --actor": ["recheck", "--tool", "charge", "--reason", "r"],
    "deadletters --reason bad": ["deadletters", "--reason", "secret-reason"],
    "audit KEY and --key apart": ["audit", KEY, "--key", "b" * 64],
    "a duration over a year": ["deadletters", "--since", "53w"],
    "requeue nothing named": ["requeue", "--actor", "a", "--reason", "r"],
    "requeue ids and --all": ["requeue", "0" * 36, "--all", "--actor", "a", "--reason", "r"],
    "requeue a bad id": ["requeue", "secret-id", "--actor", "a", "--reason", "r"],
    "purge without --actor": ["purge", "--all", "--reason", "r"],
}  # fmt: skip


@pytest.mark.parametrize("argv", list(INCIDENT_INPUT.values()), ids=list(INCIDENT_INPUT))
def test_bad_input_to_the_incident_tools_is_one_line_and_exit_2(argv: list[str]) -> None:
    assert_one_line_refusal(run(argv), secret="secret")


def test_the_incident_tools_reach_the_ledger_with_good_input() -> None:
    for argv in (["deadletters", "--since", "600"], ["audit", KEY, "--since",
                 "2027-01-01T00:00:00+02:00"], ["list", "--since", "60", "--json"],
                 # What the runbooks paste: durations, --reason, --key, a dry run without
                 # --actor, the 12 digits a log line prints.
                 ["deadletters", "--since", "1h", "--reason", "retries_exhausted"],
                 ["list", "--since", "15m"], ["audit", "--key", KEY, "--since", "1h30m"],
                 ["recheck", "--tool", "charge", "--since", "2026-01-01T10:00Z", "--until",
                  "2d", "--dry-run"],
                 ["inspect", "a" * 12]):  # fmt: skip
        assert_one_line_refusal(run(argv), code=7)  # got as far as the (unreachable) ledger
