"""Each vocabulary the faces share is defined once and read everywhere else (issue 38, item
2): an effect key (``dedupe.identity.EFFECT_KEY``), a tool's name (``dedupe.spec.TOOL_NAME``),
the states an operator pages through, a campaign recipient's state (``dedupe.states``) and
a campaign job's (``workers.campaigns.jobs.JobState``). The faces used to restate the tool-name
rule more loosely than a declaration does (upper case, a leading underscore, up to 100
characters): a name no tool can have now is refused where it comes in."""

from __future__ import annotations

import re
import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from typer.testing import CliRunner

from dedupe import SpecError, State, ToolSpec
from dedupe.spec import TOOL_NAME
from dedupe.states import AT_REST, HELD, INDEXED, RECIPIENT_STATE, SETTLED, RecipientState
from workers.api import models
from workers.api.app import openapi_document
from workers.cli import app as cli

ROOT = Path(__file__).resolve().parents[2]
UNREACHABLE = {
    "EFFECTQ_REDIS_URL": "redis://127.0.0.1:1/0",
    "EFFECTQ_BROKER_URL": "redis://127.0.0.1:1/1",
}
# Names the faces let through before and no declaration can have.
NOT_TOOL_NAMES = {
    "upper case": "Send_Email",
    "a leading underscore": "_send",
    "65 characters": "s" * 65,
    "100 characters": "s" * 100,
}


def _declarable(name: str) -> bool:
    try:
        ToolSpec(name=name, identity=("to",))
    except SpecError:
        return False
    return True


def _recheck_accepts(name: str) -> bool:
    try:
        models.Recheck.model_validate({"tool": name, "reason": "r"})
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("name", list(NOT_TOOL_NAMES.values()), ids=list(NOT_TOOL_NAMES))
def test_a_tool_name_no_declaration_allows_is_refused_by_the_cli_before_the_ledger(
    name: str,
) -> None:
    assert not _declarable(name)
    result = CliRunner().invoke(cli, ["recheck", "--tool", name, "--dry-run"], env=UNREACHABLE)
    # 2: refused as a value; it used to get as far as the (unreachable) ledger: exit 7.
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert "must be a tool's name" in result.stderr and name not in result.stderr


@pytest.mark.parametrize("name", list(NOT_TOOL_NAMES.values()), ids=list(NOT_TOOL_NAMES))
def test_a_tool_name_no_declaration_allows_is_refused_by_the_api(name: str) -> None:
    assert not _recheck_accepts(name)
    schema = openapi_document()
    queries = [
        p["schema"]
        for path in ("/v1/effects", "/v1/deadletters")
        for p in schema["paths"][path]["get"]["parameters"]
        if p["name"] == "tool"
    ]
    assert len(queries) == 2
    for query in queries:
        pattern = next(s["pattern"] for s in query["anyOf"] if "pattern" in s)
        assert not re.search(pattern, name)


NAMEISH = st.text(alphabet=string.ascii_letters + string.digits + "_.-\n", max_size=110)


@given(st.one_of(st.from_regex(TOOL_NAME, fullmatch=True), NAMEISH, st.text(max_size=70)))
def test_the_api_accepts_a_tool_name_exactly_when_a_declaration_would(name: str) -> None:
    assert _recheck_accepts(name) == _declarable(name)


def test_the_indexed_states_are_the_ones_that_never_expire() -> None:
    assert set(INDEXED) == HELD | {State.UNKNOWN} == set(State) - SETTLED
    assert set(INDEXED) | SETTLED == set(State) and {State.UNKNOWN} == AT_REST - SETTLED
    # The API's listing takes exactly these, in this order.
    [query] = [
        p["schema"]
        for p in openapi_document()["paths"]["/v1/effects"]["get"]["parameters"]
        if p["name"] == "state"
    ]
    ref = next(s["$ref"] for s in query["anyOf"] if "$ref" in s)
    enum = openapi_document()["components"]["schemas"][ref.rsplit("/", 1)[1]]["enum"]
    assert enum == [s.value for s in INDEXED]


def test_every_ledger_state_reads_as_one_recipient_state() -> None:
    assert set(RECIPIENT_STATE) == {*State, None}
    assert set(RECIPIENT_STATE.values()) == set(RecipientState)
    assert {s for s, r in RECIPIENT_STATE.items() if r is RecipientState.PENDING} == {*HELD, None}


# Restatements of the effect key (or its prefix) or the tool name, and tuples of state
# literals: each has its one home (the file named), and nothing else in the three packages
# spells it.
RESTATED = {
    r"\[0-9a-f\]\{64\}": "dedupe/identity.py",
    r"\[0-9a-f\]\{12,64\}": "dedupe/identity.py",
    r"\[a-z\]\[a-z0-9_\.-\]": "dedupe/spec.py",
    r"A-Za-z0-9_\.-\]\{0,99\}": None,
    r"\"UNKNOWN\",\s*\"CLAIMED\"|\"CLAIMED\",\s*\"RECONCILING\"": None,
    r"\"pending\",\s*\"done\",\s*\"failed\"": None,
    r"\"queued\",\s*\"planning\"": None,
}


@pytest.mark.parametrize("pattern", list(RESTATED))
def test_each_vocabulary_is_spelled_in_one_place(pattern: str) -> None:
    spelled = sorted(
        str(path.relative_to(ROOT))
        for package in ("dedupe", "reconciler", "workers")
        for path in (ROOT / package).rglob("*.py")
        if re.search(pattern, path.read_text(encoding="utf-8"), re.MULTILINE)
    )
    home = RESTATED[pattern]
    assert spelled == ([home] if home else [])
