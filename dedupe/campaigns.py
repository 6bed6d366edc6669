"""Campaign plans on Redis: the frozen recipient → effect-key rows of each plan version.

Keys (one key per command, so each is Cluster-safe; the campaign id enters only hashed,
after the same NFC + trim that ``derive`` applies to a scope, so every spelling of one id
is one campaign):

    <ns>:campaign:<tag>                     hash: the approved plan's meta (approval: an
                                            atomic compare-and-set, written last)
    <ns>:campaign:<tag>:plan:<rows>         hash: effect key -> recipient of one plan, under
                                            the random rows id its submission drew (two
                                            submissions racing never write into one plan);
                                            the meta's ``rows_id`` names the approved one
    <ns>:campaign:<tag>:removed:<rows>      hash: effect key -> recipient of every earlier
                                            plan's recipient that this plan no longer holds
    <ns>:campaign:<tag>:plan:<v>:<fp>       the same two, as plans approved before rows ids
    <ns>:campaign:<tag>:removed:<v>:<fp>    were written (no ``rows_id``: version v, plan
                                            fingerprint fp); still read, never written anew
    <ns>:campaign:<tag>:sent:<v>            set:  effect keys of plan v that have a message
                                            (sent now, or done/pending from an earlier send)
    <ns>:campaign:<tag>:job:<id>            hash: a submission the API runs in the
                                            background: its phase, progress and outcome

A submission streams: its rows are staged chunk by chunk under its own rows id (HSET's
reply says whether a key is new to the plan, so spellings collapse without the producer
holding the list), the plan fingerprint is folded in as rows arrive (``PlanDigest``), and
only the complete plan is approved.

A submission's staging receipt, ``<ns>:campaign:<tag>:staged:{<plan key>}`` (hash: the last
staged batch's number and which of its rows were new), sits in its plan's slot, so staging
a batch again after a lost reply answers what the first staging did.

On a Redis Cluster every call of the store rides out a failover, as the ledger's submits
do: a call that met a dead master, CLUSTERDOWN or a moved slot goes again on a re-read slot
map, backing off, for up to ``FAILOVER_S``. Each call is safe to repeat: plain writes of
fixed values, reads, the staging script (its receipt) and the approval (a repeat that finds
this very plan approved is this approval).

Every one of them expires with the records it describes: its TTL (the tool's retention
plus its provider window: a message older than the window never executes) is refreshed
by each submission of the campaign.

Per-state counts live with the records: the ledger script keeps "<tag>:<STATE>" in each
bucket's campaigns hash, so a status never scans the campaign's records; the removed
recipients' records are subtracted from them. Those counters are a few hash fields per
campaign and bucket, and hash fields cannot expire on Redis 6.2: they stay after the
records they counted expire. So the campaign's first approval (no meta: a new id, or one
whose plan expired) records them as a baseline in the meta, subtracted from every status.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import TypeVar, cast

import redis

from .errors import LedgerUnavailableError
from .identity import normalize_scope
from .ledger import Ledger
from .records import State

__all__ = [
    "CampaignPlan", "CampaignStore", "PlanDigest", "campaign_tag", "normalize_campaign_id",
]  # fmt: skip

_BATCH = 2000
T = TypeVar("T")
#: How long a campaign store call keeps going again through a cluster failover (node
#: timeout, election, promotion: seconds on a healthy cluster), as the ledger's submits.
FAILOVER_S = 30.0
# What a failover answers: the master is gone, the cluster is electing, the slot moved.
_FAILOVER = (
    redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterError,
    redis.exceptions.AskError, redis.exceptions.TryAgainError, redis.exceptions.ReadOnlyError,
    redis.exceptions.RedisClusterException,
)  # fmt: skip
_FAILOVER_REPLIES = ("CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "READONLY", "LOADING")
# Staging, repeatable: KEYS[1] the plan, KEYS[2] its staging receipt (same slot); ARGV[1] the
# batch number, ARGV[2] TTL ms, ARGV[3..] field, value pairs. Returns one '1' (new to the
# plan) or '0' per row; the batch staged already (a repeat after a lost reply) answers as
# it did the first time, not '0' for the rows it wrote itself.
_STAGE = """
local last = redis.call('HMGET', KEYS[2], 'batch', 'new')
if last[1] == ARGV[1] then return last[2] end
local new = {}
for i = 3, #ARGV, 2 do
  new[#new + 1] = tostring(redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]))
end
local bits = table.concat(new)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[2], 'batch', ARGV[1], 'new', bits)
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return bits
"""
# Approval: write the meta only if it is still the one the submitter checked its plan
# against (absent, or the same version and fingerprints), or already this very plan.
# KEYS[1] meta; ARGV[1] expected "version|plan fp|args fp" ('' = none), ARGV[2] this plan's,
# ARGV[3] TTL ms (0: none), ARGV[4..] field, value pairs; a "base:" field (the counters'
# baseline) is written only where none is, so only the campaign's first approval sets it.
# Returns 'ok', 'same' (this very plan is approved already, maybe under another submission's
# rows: the meta is left as it is) or what the meta now holds.
_APPROVE = """
local v = redis.call('HMGET', KEYS[1], 'version', 'plan_fingerprint', 'args_fingerprint')
local seen = ''
if v[1] then seen = v[1] .. '|' .. (v[2] or '') .. '|' .. (v[3] or '') end
if seen == ARGV[2] and seen ~= ARGV[1] then
  if tonumber(ARGV[3]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
  return 'same'
end
if seen ~= ARGV[1] then return seen end
for i = 4, #ARGV, 2 do
  -- HMGET, not HSETNX/HEXISTS: the documented ACL grants only the commands effectq uses.
  local base = string.sub(ARGV[i], 1, 5) == 'base:'
  if not base or not redis.call('HMGET', KEYS[1], ARGV[i])[1] then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
if tonumber(ARGV[3]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return 'ok'
"""


def normalize_campaign_id(campaign_id: str) -> str:
    """The campaign id as ``derive`` treats a scope: NFC, surrounding space trimmed, every
    character visible (else an IdentityError: one id is never two campaigns)."""
    return normalize_scope(campaign_id, "campaign id")


def campaign_tag(campaign_id: str) -> str:
    """A fixed-length stand-in for the campaign id in keys and records."""
    return hashlib.sha256(normalize_campaign_id(campaign_id).encode("utf-8")).hexdigest()[:16]


class PlanDigest:
    """The plan fingerprint of a set of effect keys, folded in one key at a time in any
    order: AdHash (Bellare and Micciancio) — the sum of each key's 2048-byte SHAKE-128
    expansion modulo 2^16384, a modulus large enough that Wagner's generalized-birthday
    attack on additive set hashes costs more than 2^128 — then SHA-256 over that sum and the
    count. Each key must be added once (the plan's HSET says which are new)."""

    _BYTES = 2048

    def __init__(self) -> None:
        self.count = 0
        self._sum = 0

    def add(self, key: str) -> None:
        self._sum += int.from_bytes(hashlib.shake_128(key.encode()).digest(self._BYTES))
        self.count += 1

    def hexdigest(self) -> str:
        total = (self._sum % (1 << (8 * self._BYTES))).to_bytes(self._BYTES)
        return hashlib.sha256(b"effectq plan 2|%d|" % self.count + total).hexdigest()


@dataclass(frozen=True)
class CampaignPlan:
    campaign_id: str
    tool: str
    action: str
    version: int
    count: int
    args_fingerprint: str
    plan_fingerprint: str
    # The random id naming this plan's rows; "" for a plan approved before rows ids, whose
    # rows are named by version and fingerprint.
    rows_id: str = ""

    @property
    def token(self) -> str:
        """What an approval compares: version and both fingerprints."""
        return f"{self.version}|{self.plan_fingerprint}|{self.args_fingerprint}"


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _failover(exc: LedgerUnavailableError) -> bool:
    cause = exc.__context__
    return isinstance(cause, _FAILOVER) or str(cause).startswith(_FAILOVER_REPLIES)


class CampaignStore:
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.client = ledger.client
        self._approve = self.client.register_script(_APPROVE)
        self._stage = self.client.register_script(_STAGE)
        self._staged = 0  # batches this store staged: each batch's number in its receipt

    def _run(self, call: Callable[[], T]) -> T:
        """``call`` (Redis calls that are safe to repeat), its errors as LedgerErrors; on a
        cluster, again through a failover for up to ``FAILOVER_S`` (module docstring)."""
        if not self.ledger.cluster:
            with self.ledger.guard():
                return call()
        deadline = time.monotonic() + FAILOVER_S
        pause = 0.05
        while True:
            try:
                with self.ledger.guard(reread=True):  # the next try finds the new master
                    return call()
            except LedgerUnavailableError as exc:
                if not _failover(exc) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def _key(self, campaign_id: str, *parts: str | int) -> str:
        return self.ledger.keyspace.campaign(campaign_tag(campaign_id), *parts)

    def _plan_key(self, plan: CampaignPlan, kind: str = "plan") -> str:
        if plan.rows_id:
            return self._key(plan.campaign_id, kind, plan.rows_id)
        return self._key(plan.campaign_id, kind, plan.version, plan.plan_fingerprint[:16])

    def meta(self, campaign_id: str) -> CampaignPlan | None:
        fields = self._hash(self._key(campaign_id))
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
            rows_id=fields.get("rows_id", ""),
        )

    # -- a streaming submission: stage, compare, approve -------------------------------------

    def stage(self, plan: CampaignPlan, rows: Mapping[str, str], ttl_s: float) -> list[bool]:
        """Add ``rows`` to the (not yet approved) plan ``plan``: one pipelined round trip.
        For each row, whether its key is new to the plan (False: another spelling of a
        recipient staged before)."""
        key = self._plan_key(plan)
        receipt = self.ledger.keyspace.staged(campaign_tag(plan.campaign_id), key)
        self._staged += 1
        args: list[str | int] = [self._staged, _ms(ttl_s)]
        args += [x for row in rows.items() for x in row]
        bits = self._run(lambda: self._stage(keys=[key, receipt], args=args))
        return [b == "1" for b in str(bits)]

    def diff(
        self, plan: CampaignPlan, approved: CampaignPlan, *, ttl_s: float | None = None
    ) -> tuple[int, int]:
        """(kept, removed): how many of ``approved``'s rows ``plan`` (staged) holds, and how
        many it does not; with ``ttl_s``, the rows it does not hold — and those ``approved``
        had dropped from earlier plans — are written as ``plan``'s removed rows. Streams
        both hashes a page at a time."""
        kept = removed = 0
        new = self._plan_key(plan)
        for source in ("plan", "removed"):
            for page in self._pages(self._plan_key(approved, source)):
                held = self._run(lambda: self.client.hmget(new, list(page)))  # noqa: B023
                gone = {k: v for (k, v), h in zip(page.items(), held, strict=True) if h is None}
                if source == "plan":
                    removed += len(gone)
                    kept += len(page) - len(gone)
                if gone and ttl_s is not None:
                    self._write(self._plan_key(plan, "removed"), gone, ttl_s)
        return kept, removed

    def discard(self, plan: CampaignPlan, *, rows: bool = True) -> None:
        """Delete a staged plan that was not approved (or only its removed rows)."""
        names = [self._plan_key(plan, "removed")]
        if rows:
            plan_key = self._plan_key(plan)
            names += [
                plan_key,
                self.ledger.keyspace.staged(campaign_tag(plan.campaign_id), plan_key),
            ]

        def delete() -> None:
            pipe = self.client.pipeline(transaction=False)
            for name in names:  # one key per command: Cluster-safe
                pipe.delete(name)
            pipe.execute()

        self._run(delete)

    def approve(
        self, plan: CampaignPlan, *, approved: CampaignPlan | None, ttl_s: float | None
    ) -> str:
        """Approve ``plan`` if the meta still is ``approved`` (None: absent): 'ok', 'same'
        (an identical plan is approved already: the caller adopts it) or 'other'."""
        meta = [part for k, v in asdict(plan).items() for part in (k, str(v))]
        expected = approved.token if approved is not None else ""
        if approved is None:
            # A campaign id used again after its plan expired finds the counters its earlier
            # records left: this approval's baseline, subtracted from every status.
            counts = self.ledger.campaign_counts(campaign_tag(plan.campaign_id))
            meta += [part for k, n in counts.items() if n for part in (f"base:{k}", str(n))]
        ttl = _ms(ttl_s) if ttl_s is not None else 0
        answer = str(
            self._run(
                lambda: self._approve(
                    keys=[self._key(plan.campaign_id)], args=[expected, plan.token, ttl, *meta]
                )
            )
        )
        if answer == "same" and plan.rows_id:
            # This very plan under this submission's rows: a repeat of this approval after
            # a lost reply (the first one wrote it), not another submission's.
            current = self.meta(plan.campaign_id)
            if current is not None and current.rows_id == plan.rows_id:
                return "ok"
        return answer if answer in ("ok", "same") else "other"

    def freeze(
        self,
        plan: CampaignPlan,
        rows: Mapping[str, str],
        *,
        approved: CampaignPlan | None = None,
        removed: Mapping[str, str] | None = None,
        ttl_s: float | None = None,
    ) -> bool:
        """Write plan ``plan``'s rows (and the earlier recipients it no longer holds), then
        approve it: the meta is written only if it still is ``approved`` (None: absent), or
        already this plan. False when another submission approved a plan meanwhile. A crash
        in between leaves the previous approval standing; freezing again is idempotent."""
        for key, mapping in ((self._plan_key(plan), rows),
                             (self._plan_key(plan, "removed"), removed or {})):  # fmt: skip
            self._write(key, mapping, ttl_s)
        return self.approve(plan, approved=approved, ttl_s=ttl_s) != "other"

    def _write(self, key: str, mapping: Mapping[str, str], ttl_s: float | None) -> None:
        items = list(mapping.items())
        if not items:
            return

        def write() -> None:
            pipe = self.client.pipeline(transaction=False)
            for lo in range(0, len(items), _BATCH):
                pipe.hset(key, mapping=dict(items[lo : lo + _BATCH]))
            if ttl_s is not None:
                pipe.pexpire(key, _ms(ttl_s))
            pipe.execute()

        self._run(write)

    def _pages(self, key: str) -> Iterator[dict[str, str]]:
        cursor = 0
        while True:
            cursor, found = self._run(lambda: self._scan(key, cursor, _BATCH))  # noqa: B023
            if found:
                yield {str(k): str(v) for k, v in found.items()}
            if not cursor:
                return

    # -- background submissions (the API's campaign jobs) -------------------------------------

    def write_job(
        self, campaign_id: str, job_id: str, fields: Mapping[str, str | int], ttl_s: float
    ) -> None:
        """Record a job's phase and progress; it expires ``ttl_s`` after its last update."""
        key = self._key(campaign_id, "job", job_id)

        def write() -> None:
            pipe = self.client.pipeline(transaction=False)
            pipe.hset(key, mapping={k: v for k, v in fields.items()})
            pipe.pexpire(key, _ms(ttl_s))
            pipe.execute()

        self._run(write)

    def job(self, campaign_id: str, job_id: str) -> dict[str, str] | None:
        found = self._hash(self._key(campaign_id, "job", job_id))
        return found or None

    def touch(self, plan: CampaignPlan, ttl_s: float) -> None:
        """Keep the approved plan's keys as long as the records a submission may create."""

        def refresh() -> None:
            pipe = self.client.pipeline(transaction=False)
            for key in (self._key(plan.campaign_id), self._plan_key(plan),
                        self._plan_key(plan, "removed"),
                        self._key(plan.campaign_id, "sent", plan.version)):  # fmt: skip
                pipe.pexpire(key, _ms(ttl_s))
            pipe.execute()

        self._run(refresh)

    def removed_rows(self, plan: CampaignPlan) -> dict[str, str]:
        """Effect key -> recipient of the earlier plans' recipients ``plan`` dropped."""
        return self._hash(self._plan_key(plan, "removed"))

    def _hash(self, key: str) -> dict[str, str]:
        found = cast("dict[str, str]", self._run(lambda: self.client.hgetall(key)))
        return {str(k): str(v) for k, v in found.items()}

    def _scan(self, key: str, cursor: int, count: int) -> tuple[int, dict[str, str]]:
        after, found = cast(
            "tuple[int, dict[str, str]]", self.client.hscan(key, cursor=cursor, count=count)
        )
        return int(after), found

    def plan_keys(self, plan: CampaignPlan) -> set[str]:
        names = cast("list[str]", self._run(lambda: self.client.hkeys(self._plan_key(plan))))
        return {str(k) for k in names}

    def mark_sent(
        self, campaign_id: str, version: int, keys: Iterable[str], *, ttl_s: float | None = None
    ) -> None:
        keys = list(keys)
        if keys:
            sent = self._key(campaign_id, "sent", version)

            def write() -> None:
                pipe = self.client.pipeline(transaction=False)
                pipe.sadd(sent, *keys)
                if ttl_s is not None:
                    pipe.pexpire(sent, _ms(ttl_s))
                pipe.execute()

            self._run(write)

    def sent_count(self, campaign_id: str, version: int) -> int:
        key = self._key(campaign_id, "sent", version)
        return int(self._run(lambda: self.client.scard(key)))

    def rows(
        self, plan: CampaignPlan, *, cursor: int = 0, count: int = 100
    ) -> tuple[int, list[tuple[str, str, bool]]]:
        """A page of (key, recipient, sent) rows of ``plan``; cursor 0 ends."""
        sent_key = self._key(plan.campaign_id, "sent", plan.version)

        def page() -> tuple[int, dict[str, str], list[bool]]:
            after, found = self._scan(self._plan_key(plan), cursor, count)
            sent = self.client.smismember(sent_key, list(found)) if found else []
            return after, found, [bool(s) for s in cast("list[int]", sent)]

        after, found, sent = self._run(page)
        keys = list(found)
        return after, [(str(k), str(found[k]), bool(s)) for k, s in zip(keys, sent, strict=True)]

    def _baseline(self, campaign_id: str) -> dict[str, int]:
        states = [s.value for s in State]
        found = self._run(
            lambda: self.client.hmget(self._key(campaign_id), [f"base:{s}" for s in states])
        )
        return {s: int(n) for s, n in zip(states, found, strict=True) if n}

    def state_counts(self, campaign_id: str, plan: CampaignPlan | None = None) -> dict[str, int]:
        """Records of the campaign's approved plan (``plan``, read when None) per ledger
        state: the ledger's counters (every record the campaign ever sent) less their
        baseline at the campaign's first approval and the records of the recipients the
        plan dropped."""
        counts = self.ledger.campaign_counts(campaign_tag(campaign_id))
        plan = plan or self.meta(campaign_id)
        if plan is None:
            return counts
        gone: Counter[str] = Counter(self._baseline(campaign_id))
        for page in self._pages(self._plan_key(plan, "removed")):
            records = self.ledger.get_many(page)
            gone.update(r.state.value for r in records.values() if r is not None)
        return {state: max(n - gone[state], 0) for state, n in counts.items()}
