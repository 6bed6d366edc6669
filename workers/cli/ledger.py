"""The ledger itself: ``effectq ledger adopt`` (the upgrade of a ledger written before
ledger versions existed)."""

from __future__ import annotations

from typing import Annotated

import typer

from ._app import app, emit, line
from .params import Actor, Json, Reason, _settings

ledger_app = typer.Typer(help="The ledger itself: its version record and namespaces.")
app.add_typer(ledger_app, name="ledger")


@ledger_app.command("adopt")
def adopt(
    namespace: Annotated[
        str, typer.Option(metavar="NS", help="the namespace this deployment runs under")
    ],
    actor: Actor,
    reason: Reason,
    as_json: Json = False,
) -> None:
    """Register NS in the ledger's version record: a ledger written before versions existed
    refuses a namespace that owns none of its records until an operator adopts it (audited).
    Adopt the namespace whose records these are — never a new one over another's records."""
    from .. import verbs

    cfg = _settings().model_copy(update={"namespace": namespace})
    document = verbs.adopt_namespace(cfg, actor=actor, reason=reason)
    if as_json:
        emit(document)
        return
    line(f"namespace {document['namespace']} adopted ({document['buckets']} buckets)")
