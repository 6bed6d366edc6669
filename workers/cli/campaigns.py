"""``effectq campaign``: submit a file (streamed), read a campaign's status."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer
import typer.core

from ._app import _HELP, _validation_reason, app, emit, err, fail, line, table, words
from .params import (
    Json,
    _install,
    _reader,
    _settings,
)

campaign_app = typer.Typer(
    rich_markup_mode=None,
    help="Campaign batches: frozen plans, fan-out, status.",
    no_args_is_help=True,
    context_settings=_HELP,
)
app.add_typer(campaign_app, name="campaign")


@campaign_app.command("submit")
def campaign_submit(
    path: Annotated[str, typer.Argument(metavar="FILE", help="the campaign, JSON")],
    as_json: Json = False,
) -> None:
    """Freeze and fan out FILE: {campaign_id, tool, action?, args, recipients, plan_version?}.

    FILE is streamed (any size up to 1,000,000 recipients, in flat memory): read once to
    check it, once to plan, and the plan is frozen before the first message is sent."""
    from pydantic import ValidationError

    from dedupe import MessageError

    from ..verbs import open_campaign_file, submit_campaign_source

    try:
        source = open_campaign_file(path)
    except OSError as exc:
        fail(2, f"cannot read the campaign file: {exc.strerror}")
    except ValidationError as exc:
        fail(2, _validation_reason(exc, "campaign file"))
    except MessageError as exc:
        fail(2, exc.message)
    from .. import tracing

    cfg = _settings()
    tracing.configure(cfg)
    _install(cfg)
    with _campaign_bars(source.count, quiet=as_json) as (planning, advance):
        report = submit_campaign_source(source, progress=advance, planning=planning)
    if as_json:
        emit(report.as_dict())
        return
    line(
        f"campaign {report.campaign_id} v{report.plan_version}: {report.recipients} recipients, "
        f"{report.sent} sent, skipped {report.skipped or 'none'}, {report.collapsed} duplicates "
        f"collapsed, {report.rejected_total} rejected, +{report.added} -{report.removed}"
    )
    for item in report.rejected[:20]:
        line(f"  rejected #{item['index']}: {item['reason']}")


Advance = Callable[[int], None]


class _campaign_bars:
    """Two progress bars on stderr, where stderr is a terminal: the plan (recipients read)
    and the fan-out (recipients sent); each campaign file's count is the total of both."""

    def __init__(self, total: int, *, quiet: bool) -> None:
        self.total, self.bar = total, None
        if not quiet and err().is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            self.bar = Progress(
                "{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=err(), transient=True,
            )  # fmt: skip

    def __enter__(self) -> tuple[Advance, Advance]:
        if self.bar is None:
            return (lambda n: None), (lambda n: None)
        self.bar.start()
        bar = self.bar
        plan = bar.add_task("plan   ", total=self.total)
        send = bar.add_task("fan-out", total=self.total)
        return (lambda n: bar.advance(plan, n)), (lambda n: bar.advance(send, n))

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


@campaign_app.command("status")
def campaign_status(
    campaign_id: Annotated[str, typer.Argument(metavar="ID")],
    cursor: Annotated[int, typer.Option(metavar="N", min=0, help="from a previous page")] = 0,
    page_size: Annotated[int, typer.Option(metavar="N", min=1, max=1000)] = 100,
    as_json: Json = False,
) -> None:
    """Counts per recipient state, the never-sent diff, and a page of recipients."""
    from ..verbs import campaign_status as status

    document = status(_reader(), campaign_id, cursor=cursor, page_size=page_size)
    if as_json:
        emit(document)
        return
    line(
        f"campaign {campaign_id} v{document['plan_version']}: {words(document['counts'])}; "
        f"approved but never sent: {document['approved_but_never_sent']}"
    )
    table(
        ("recipient", "state", "key"),
        ((row["recipient"], row["state"], row["key"]) for row in document["recipients"]),
    )
    if document["next_cursor"]:
        line(f"more: --cursor {document['next_cursor']}")
