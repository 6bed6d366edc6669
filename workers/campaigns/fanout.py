"""Pass 2 of a campaign: the approved plan's effects marked in the ledger and sent to the
broker, a batch at a time."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from dramatiq import Message
from dramatiq.message import generate_unique_id

from dedupe import CampaignPlan, CampaignStore, Effect, SubmitStatus, campaign_tag
from dedupe.failpoints import failpoint
from dedupe.ledger import Confirming

from .. import tracing
from ..broker.fanout import Sending, send_many
from ..producer import finish_confirm, start_confirm
from ..tool import EffectTool
from ..tool.envelope import SUBMITTED_MS, Envelope
from .plan import CampaignReport

__all__ = ["fan_out"]

_HAD_A_MESSAGE = frozenset({SubmitStatus.DONE, SubmitStatus.PENDING, SubmitStatus.BLOCKED})


def fan_out(
    tool: EffectTool,
    plan: CampaignPlan,
    batches: Iterable[list[Effect]],
    store: CampaignStore,
    report: CampaignReport,
    progress: Callable[[int], None] | None,
    ttl_s: float,
) -> None:
    """Pass 2, a batch at a time in stages that overlap: batch i+1 is built and marked in
    the ledger while the broker takes batch i, and batch i's confirms are read only once
    batch i+2 is built."""
    ledger = tool.runtime.ledger()
    cfg = tool.runtime.settings
    actor = tool.actor
    marker_ttl_s = tool.marker_ttl_s
    tag = campaign_tag(plan.campaign_id)
    skipped: Counter[str] = Counter()
    # Every message continues the fan-out's trace (workers.tracing; none when it is off).
    carried = tracing.traceparent()
    options: dict[str, Any] = {tracing.TRACEPARENT: carried} if carried is not None else {}

    confirming: tuple[Confirming | None, int] = (None, 0)  # the last batch's, and its size

    def sent(batch: list[Effect], messages: list[Message[Any]], had: list[str]) -> None:
        nonlocal confirming
        keys = [m.args[0]["key"] for m in messages]
        effects = {e.key: e for e in batch}
        # On the wire, read after the next batch is built (as confirm_pending otherwise);
        # one batch of confirms unread at a time.
        finish_confirm(*confirming)
        pairs = [(effects[k], m.message_id) for k, m in zip(keys, messages, strict=True)]
        confirming = (start_confirm(ledger, pairs, marker_ttl_s), len(pairs))
        # Sent: a message exists for it, now or from an earlier submission (done, held by a
        # worker, awaiting reconciliation). A conflict was never sent under this plan.
        store.mark_sent(plan.campaign_id, plan.version, [*keys, *had], ttl_s=ttl_s)
        report.sent += len(messages)
        if progress is not None:
            progress(len(batch))

    # The broker takes batch i while the next one is built and marked (send_many: on the
    # wire, its replies read later); at most one batch is in flight, and one confirm batch.
    sending: Sending | None = None
    previous: tuple[list[Effect], list[Message[Any]], list[str]] = ([], [], [])
    try:
        for batch in batches:
            ids = {e.key: generate_unique_id() for e in batch}
            # force: a pending marker may stand for a message a crash lost; a second
            # message for one effect is harmless, the claim decides. The markers are
            # reservations until the broker holds the batch. The messages are built while
            # the ledger decides (their ids are the markers').
            submitting = ledger.start_submit(
                [(e, ids[e.key]) for e in batch],
                pending_s=cfg.pending_reservation_s,
                force=True,
                bounded=True,  # each request was bounded in pass 1 (Planner._derive)
            )
            try:
                messages: dict[str, Message[Any]] = {
                    e.key: Message(queue_name=actor.queue_name, actor_name=actor.actor_name,
                                   args=(Envelope.of(e, campaign=tag).model_dump(),),
                                   kwargs={}, options=dict(options), message_id=ids[e.key])
                    for e in batch
                }  # fmt: skip
            except BaseException:
                submitting.abandon()
                raise
            finish_confirm(*confirming)
            confirming = (None, 0)
            answers = submitting.answers()
            for effect, answer in zip(batch, answers, strict=True):
                if answer.status is not SubmitStatus.ENQUEUE:
                    skipped[answer.status.value] += 1
                    continue
                # The ledger's time of this submission: the message's age is judged on it
                # (each message has an options dict of its own, built above).
                messages[effect.key].options[SUBMITTED_MS] = answer.submitted_ms
                if answer.generation:  # same message id, carrying the generation it is for
                    envelope = Envelope.of(effect, campaign=tag, generation=answer.generation)
                    messages[effect.key] = messages[effect.key].copy(args=(envelope.model_dump(),))
            failpoint("after_submit_mark")
            out = [messages[a.key] for a in answers if a.status is SubmitStatus.ENQUEUE]
            had = [a.key for a in answers if a.status in _HAD_A_MESSAGE]
            if sending is not None:
                sending.wait()
                sent(*previous)
            sending, previous = send_many(tool.actor.broker, out), (batch, out, had)
        if sending is not None:
            sending.wait()
            sent(*previous)
            sending = None
        finish_confirm(*confirming)
        confirming = (None, 0)
    finally:
        if sending is not None:  # a failure meanwhile: that batch's replies go unread
            sending.abandon()
        if confirming[0] is not None:  # unread: its reservations lapse, the messages run
            confirming[0].abandon()
    report.skipped = dict(skipped)
