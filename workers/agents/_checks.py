"""What every agent face checks of a model's arguments before the guard sees them: the
refusal in words that repeat no value and no name the model made up (an undeclared
argument's name is the model's text too), or None.

The guard itself refuses reserved and undeclared arguments, but names the undeclared ones;
a face in front of a model answers with these words instead.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from dedupe.normalize import visible

from ..guard import RESERVED_FIELDS, Guarded

__all__ = ["ERROR_STATUSES", "MAX_ARGUMENT_BYTES", "refusal"]

#: Outcomes a face marks as a tool error: nothing was done, or nothing more will be done by
#: calling again (done and pending are not errors: pending asks for the same call later).
ERROR_STATUSES = frozenset({"conflict", "unknown", "failed", "invalid", "unavailable"})

MAX_ARGUMENT_BYTES = 64 * 1024
# Scripts whose letters pass for each other (a Cyrillic es in "cus_7" is not a Latin c).
_SCRIPTS = ("LATIN", "CYRILLIC", "GREEK", "ARMENIAN", "CHEROKEE", "COPTIC")


def _scripts(text: str) -> set[str]:
    """The look-alike scripts the letters of ``text`` are written in."""
    seen: set[str] = set()
    for char in text:
        if char.isalpha():
            name = unicodedata.name(char, "")
            seen.update(s for s in _SCRIPTS if name.startswith(s))
    return seen


def _invisible(text: str) -> bool:
    # The identity's one rule (dedupe.normalize.visible): control, format, default-ignorable
    # (a variation selector, a Hangul filler), private-use, unassigned — here for bound text too.
    return not visible(text)


def refusal(
    guard: Guarded, args: Mapping[str, Any], *, max_bytes: int = MAX_ARGUMENT_BYTES
) -> str | None:
    """Why ``guard`` must not be called with ``args``: over ``max_bytes`` as JSON, a reserved
    or undeclared argument, a value the schema refuses, or an identity or bound text with
    invisible characters or letters of look-alike scripts mixed."""
    size = len(json.dumps(args, default=str).encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        return f"the arguments are over {max_bytes} bytes."
    declared = guard.tool.spec.fields
    if reserved := sorted((RESERVED_FIELDS - declared) & args.keys()):
        names = ", ".join(reserved)
        return (
            f"{names} cannot be set by a tool call: the runtime names this request. "
            f"Call {guard.name} again without {names}."
        )
    if undeclared := len(args.keys() - declared):
        return (
            f"{undeclared} undeclared argument{'s' if undeclared > 1 else ''}. The "
            f"arguments are: {', '.join(sorted(declared))}."
        )
    try:
        guard.args_schema.model_validate(dict(args))
    except ValidationError as exc:
        problems = "; ".join(
            f"{e['loc'][0] if e['loc'] else 'arguments'}: {e['msg']}"
            for e in exc.errors(include_url=False, include_input=False, include_context=False)
        )
        return f"invalid arguments ({problems})."
    spec = guard.tool.spec
    for name in sorted(set(spec.identity) | set(spec.bound)):
        value = args.get(name)
        if not isinstance(value, str):
            continue
        if _invisible(value):
            return f"{name} carries invisible or control characters."
        if len(_scripts(value)) > 1:
            return f"{name} mixes letters of look-alike scripts (Latin, Cyrillic, Greek …)."
    return None
