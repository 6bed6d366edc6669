"""One table says what each error answers (``dedupe.errors.CODES``): every error of the tree
has its row, the CLI's exit codes and the API's statuses are read from it, and README's
table is that table."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from dedupe import errors
from dedupe.errors import CODES, EffectqError
from workers.api.problems import problem_of
from workers.cli._app import _reason

README = Path(__file__).resolve().parents[2] / "README.md"
_BLOCK = re.compile(r"<!-- error codes[^\n]*-->\n(.*?)<!-- /error codes -->", re.S)
TREE = [
    c
    for c in vars(errors).values()
    if inspect.isclass(c) and issubclass(c, EffectqError) and c.__module__ == errors.__name__
]


def markdown() -> str:
    """README's table, as CODES writes it (in the tree's order)."""
    rows = ["| error | is a | CLI exit | HTTP status | API `error` |", "|---|---|---|---|---|"]
    for cls, code in CODES.items():
        parent = cls.__bases__[0]
        is_a = f"`{parent.__name__}`" if issubclass(parent, EffectqError) else ""
        rows.append(f"| `{cls.__name__}` | {is_a} | {code.exit} | {code.status} | `{code.kind}` |")
    return "\n".join(rows) + "\n"


def test_every_error_of_the_tree_has_a_row_of_its_own() -> None:
    assert len(TREE) > 20  # the tree was read
    assert [c.__name__ for c in TREE if c not in CODES] == []


@pytest.mark.parametrize("cls", TREE, ids=lambda c: c.__name__)
def test_the_cli_and_the_api_answer_an_error_as_its_row_says(cls: type[EffectqError]) -> None:
    exc, code = cls("refused"), CODES[cls]
    assert _reason(exc) == (code.exit, "refused")
    problem = problem_of(exc)
    assert (problem.status, problem.error) == (code.status, code.kind)
    assert problem.message == (code.says or "refused")


def test_an_error_defined_outside_the_tree_answers_as_its_nearest_ancestor() -> None:
    from workers.registry import ToolsModuleError

    assert errors.code_of(ToolsModuleError("no module")) == CODES[errors.MessageError]


def test_the_readme_table_is_the_codes_table() -> None:
    found = _BLOCK.search(README.read_text(encoding="utf-8"))
    assert found is not None, "README lost its error-codes table"
    assert found.group(1) == markdown(), "README's table, as it should read:\n" + markdown()
