"""A campaign's status: counts per recipient state, the never-sent diff, a page of
recipients."""

from __future__ import annotations

from typing import Any

from dedupe import CampaignNotFoundError, CampaignStore, Ledger, State
from dedupe.states import RECIPIENT_STATE, RecipientState

from ..runtime import current

__all__ = ["campaign_status"]


def campaign_status(
    campaign_id: str, *, cursor: int = 0, page_size: int = 100, ledger: Ledger | None = None
) -> dict[str, Any]:
    """Counts per recipient state (from counters, no scan), the plan's never-sent count,
    and one page of recipients (``next_cursor`` 0 when the page is the last), read from
    ``ledger`` (default: the current runtime's)."""
    ledger = ledger if ledger is not None else current().ledger()
    store = CampaignStore(ledger)
    plan = store.meta(campaign_id)
    if plan is None:
        raise CampaignNotFoundError(f"no campaign {campaign_id!r}")
    # Counts over the approved plan's recipients only (dropped ones are subtracted).
    states = store.state_counts(campaign_id, plan)
    sent = store.sent_count(campaign_id, plan.version)
    counts = dict.fromkeys((s.value for s in RecipientState), 0)
    for state, n in states.items():
        counts[RECIPIENT_STATE[State(state)]] += n
    settled = sum(n for s, n in counts.items() if s != RecipientState.PENDING)
    counts[RecipientState.PENDING] = max(plan.count - settled, 0)
    next_cursor, rows = store.rows(plan, cursor=cursor, count=page_size)
    records = ledger.get_many(key for key, _, _ in rows)
    recipients = []
    for key, who, was_sent in rows:
        record = records[key]
        state = RECIPIENT_STATE[record.state if record else None]
        entry: dict[str, Any] = {
            "recipient": who, "key": key, "state": state.value, "sent": was_sent
        }  # fmt: skip
        if state in (RecipientState.UNKNOWN, RecipientState.FAILED) and record is not None:
            entry["reason"] = record.reason
        recipients.append(entry)
    return {
        "campaign_id": plan.campaign_id,
        "tool": plan.tool,
        "plan_version": plan.version,
        "recipients_total": plan.count,
        "counts": counts,
        "approved_but_never_sent": plan.count - sent,
        "blocked_for_operator": counts[RecipientState.UNKNOWN],
        "recipients": recipients,
        "next_cursor": next_cursor,
        "message": None
        if sent == plan.count
        else "some approved recipients were never sent: submit the campaign again to send them",
    }
