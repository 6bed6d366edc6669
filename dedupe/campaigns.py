"""Campaign plans on Redis: the frozen recipient → effect-key rows of each plan version.

Keys (one key per command, so each is Cluster-safe; the campaign id enters only hashed):

    <ns>:campaign:<tag>              hash: the approved plan's meta (written last: approval)
    <ns>:campaign:<tag>:plan:<v>     hash: effect key -> normalized recipient, plan version v
    <ns>:campaign:<tag>:sent:<v>     set:  effect keys of plan v whose message was enqueued

Per-state counts live with the records: the ledger script keeps "<tag>:<STATE>" in each
bucket's campaigns hash, so a status never scans the campaign's records.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

from .ledger import Ledger

__all__ = ["CampaignPlan", "CampaignStore", "campaign_tag"]

_BATCH = 2000


def campaign_tag(campaign_id: str) -> str:
    """A fixed-length stand-in for the campaign id in keys and records."""
    return hashlib.sha256(campaign_id.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class CampaignPlan:
    campaign_id: str
    tool: str
    action: str
    version: int
    count: int
    args_fingerprint: str
    plan_fingerprint: str


class CampaignStore:
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.client = ledger.client

    def _key(self, campaign_id: str, *parts: str | int) -> str:
        return ":".join(
            [self.ledger.namespace, "campaign", campaign_tag(campaign_id), *map(str, parts)]
        )

    def meta(self, campaign_id: str) -> CampaignPlan | None:
        with self.ledger.guard():
            fields: dict[str, str] = self.client.hgetall(self._key(campaign_id))  # type: ignore[assignment]
        if not fields:
            return None
        return CampaignPlan(
            campaign_id=fields["campaign_id"],
            tool=fields["tool"],
            action=fields["action"],
            version=int(fields["version"]),
            count=int(fields["count"]),
            args_fingerprint=fields["args_fingerprint"],
            plan_fingerprint=fields["plan_fingerprint"],
        )

    def freeze(self, plan: CampaignPlan, rows: Mapping[str, str]) -> None:
        """Write plan ``plan.version``'s rows, then approve it by writing its meta. A crash
        in between leaves the previous approval standing; freezing again is idempotent."""
        plan_key = self._key(plan.campaign_id, "plan", plan.version)
        items = list(rows.items())
        with self.ledger.guard():
            for lo in range(0, len(items), _BATCH):
                self.client.hset(plan_key, mapping=dict(items[lo : lo + _BATCH]))
            meta = {k: str(v) for k, v in asdict(plan).items()}
            self.client.hset(self._key(plan.campaign_id), mapping=meta)  # type: ignore[arg-type]

    def plan_keys(self, campaign_id: str, version: int) -> set[str]:
        with self.ledger.guard():
            return {str(k) for k in self.client.hkeys(self._key(campaign_id, "plan", version))}

    def mark_sent(self, campaign_id: str, version: int, keys: Iterable[str]) -> None:
        keys = list(keys)
        if keys:
            with self.ledger.guard():
                self.client.sadd(self._key(campaign_id, "sent", version), *keys)

    def sent_count(self, campaign_id: str, version: int) -> int:
        with self.ledger.guard():
            return int(self.client.scard(self._key(campaign_id, "sent", version)))

    def rows(
        self, campaign_id: str, version: int, *, cursor: int = 0, count: int = 100
    ) -> tuple[int, list[tuple[str, str, bool]]]:
        """A page of (key, recipient, sent) rows of plan ``version``; cursor 0 ends."""
        with self.ledger.guard():
            plan_key = self._key(campaign_id, "plan", version)
            found: dict[str, str]
            cursor, found = self.client.hscan(plan_key, cursor=cursor, count=count)  # type: ignore[assignment]
            keys = list(found)
            sent_key = self._key(campaign_id, "sent", version)
            sent = self.client.smismember(sent_key, keys) if keys else []
        return int(cursor), [
            (str(k), str(found[k]), bool(s)) for k, s in zip(keys, sent, strict=True)
        ]

    def state_counts(self, campaign_id: str) -> dict[str, int]:
        """Records of the campaign per ledger state, from the ledger's counters."""
        return self.ledger.campaign_counts(campaign_tag(campaign_id))
