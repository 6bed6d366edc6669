"""The system-level checker: the provider's execution log against what was submitted.

Ground truth is the provider (``GET /v1/executions``: every real execution with its
idempotency key, token and body), not the ledger: a wrong rule in ``ledger.lua`` cannot make
the ledger and this checker agree. The producer side is a record of events per effect key,
in the order they happened (``time.monotonic``: one clock for every process of the machine,
which a skewed producer's patched ``time.time`` does not touch):

* ``submit`` / ``replay`` — a submission with the tool arguments it carried (a replay carries
  the stored request it sends again) and the status it got (None: the producer died before
  hearing it: maybe submitted);
* ``void`` — an operator's ``revoke`` / ``supersede`` that succeeded: the next submission
  opens the next generation.

Per key it asserts:

1. every execution's idempotency key is the key's at some generation (the key itself at 0,
   ``SHA-256(JCS({key, generation}))`` after: ``dedupe.idempotency_key``);
2. at most one execution per generation;
3. each execution carries the values of the latest submission of its generation (the
   latest after the last void before it), compared field by field on the bound values;
4. the effect ends DONE, FAILED or UNKNOWN (or REVOKED / SUPERSEDED, an operator's end) and
   ``effectq list --state S`` shows it; DONE means its generation executed exactly once with
   the receipt the ledger holds, FAILED that its generation never executed.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from dedupe import idempotency_key

# Where each example tool's bound values ride in the provider's request body
# (workers.examples): bound argument -> body field.
BODY_FIELDS: dict[str, dict[str, str]] = {
    "charge": {"customer": "customer", "amount": "amount", "currency": "currency"},
    "send_email": {"recipient": "to"},
    "set_value": {"value": "value"},
}
ENDS = {"DONE", "FAILED", "UNKNOWN", "REVOKED", "SUPERSEDED"}
# Statuses under which a submission's message exists or existed (conflict: refused).
ACCEPTED = {"enqueued", "pending", "done", "blocked", None}


@dataclass
class Event:
    key: str
    kind: str  # submit | replay | void
    mono: float
    tool: str = ""
    args: dict[str, Any] = field(default_factory=dict)
    status: str | None = None
    who: str = ""
    # One submission's intent line and its answer line share it (the answer supersedes).
    attempt: str = ""

    @classmethod
    def of(cls, row: dict[str, Any]) -> Event:
        return cls(
            key=row["key"], kind=row["kind"], mono=float(row["mono"]), tool=row.get("tool", ""),
            args=row.get("args") or {}, status=row.get("status"), who=row.get("who", ""),
            attempt=row.get("attempt", ""),
        )  # fmt: skip


@dataclass
class Final:
    """A key's record at the end: state, generation, receipt id (None: no record)."""

    state: str
    generation: int = 0
    receipt_id: str | None = None


@dataclass
class Verdict:
    violations: list[str]
    figures: dict[str, Any]


def _bound(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    return {body: args.get(arg) for arg, body in BODY_FIELDS[tool].items()}


def _received(tool: str, body: dict[str, Any]) -> dict[str, Any]:
    return {name: body.get(name) for name in BODY_FIELDS[tool].values()}


def answered(events: list[Event]) -> list[Event]:
    """The events without the intent lines whose answer was recorded: an intent stands
    (as maybe-submitted) only when its producer died before hearing the answer."""
    heard = {e.attempt for e in events if e.attempt and e.status is not None}
    return [e for e in events if not (e.status is None and e.attempt in heard)]


def generations(events: list[Event]) -> dict[int, list[Event]]:
    """Submissions by the generation they belong to: a void moves the count on once a
    submission follows it (a void with nothing after it opens nothing)."""
    by_gen: dict[int, list[Event]] = defaultdict(list)
    generation, voided = 0, False
    for event in sorted(events, key=lambda e: e.mono):
        if event.kind == "void":
            voided = True
        elif event.status in ACCEPTED:
            if voided and by_gen.get(generation):
                generation += 1
            voided = False
            by_gen[generation].append(event)
    return dict(by_gen)


def check(
    events: list[Event],
    executions: list[dict[str, Any]],
    finals: dict[str, Final],
    listed: dict[str, set[str]],
) -> Verdict:
    """``listed``: state -> keys ``effectq list --state S`` showed."""
    violations: list[str] = []
    events = answered(events)
    per_key: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        per_key[event.key].append(event)
    gens = {key: generations(evs) for key, evs in per_key.items()}
    # Every idempotency key a submitted key can have had, up to one past its voids.
    owner: dict[str, tuple[str, int]] = {}
    for key, evs in per_key.items():
        voids = sum(1 for e in evs if e.kind == "void")
        for g in range(voids + 2):
            owner[idempotency_key(key, g)] = (key, g)
    ran: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for entry in executions:
        found = owner.get(entry["idempotency_key"])
        if found is None:
            violations.append(
                f"execution #{entry['seq']} under {entry['idempotency_key'][:12]}: no submitted "
                "key at any generation derives it"
            )
            continue
        ran[found].append(entry)
    for (key, g), entries in sorted(ran.items()):
        if len(entries) > 1:
            violations.append(
                f"{key[:12]} g{g}: executed {len(entries)} times "
                f"(#{', #'.join(str(e['seq']) for e in entries)})"
            )
        submitted = gens.get(key, {}).get(g)
        if not submitted:
            violations.append(f"{key[:12]} g{g}: executed, but no submission opened generation {g}")
            continue
        latest = submitted[-1]
        want = _bound(latest.tool, latest.args)
        for entry in entries:
            got = _received(latest.tool, entry["body"])
            if got != want:
                violations.append(
                    f"{key[:12]} g{g}: execution #{entry['seq']} (token {entry['token']}) carried "
                    f"{got}, the latest submission of generation {g} was {want}"
                )
    invisible = stuck = 0
    for key, evs in sorted(per_key.items()):
        final = finals.get(key)
        maybe_only = all(e.status is None for e in evs if e.kind != "void")
        if final is None:
            if not maybe_only:
                invisible += 1
                statuses = sorted({str(e.status) for e in evs if e.kind != "void"})
                violations.append(f"{key[:12]}: submitted ({statuses}) but no ledger record")
            continue
        if final.state not in ENDS:
            stuck += 1
            violations.append(f"{key[:12]}: stuck in {final.state} (g{final.generation})")
        elif key not in listed.get(final.state, set()):
            violations.append(f"{key[:12]}: {final.state} but `effectq list` does not show it")
        mine = ran.get((key, final.generation), [])
        if final.state == "DONE":
            if len(mine) != 1:
                violations.append(f"{key[:12]}: DONE g{final.generation}, executed {len(mine)}x")
            elif mine[0]["id"] != final.receipt_id:
                violations.append(
                    f"{key[:12]}: DONE with receipt {final.receipt_id}, the provider executed "
                    f"{mine[0]['id']}"
                )
        elif final.state == "FAILED" and mine:
            violations.append(f"{key[:12]}: FAILED g{final.generation} but executed {len(mine)}x")
    figures = {
        "keys": len(per_key),
        "submissions": sum(1 for e in events if e.kind != "void"),
        "replays": sum(1 for e in events if e.kind == "replay"),
        "voids": sum(1 for e in events if e.kind == "void"),
        "generations_opened": sum(max(0, len(g) - 1) for g in gens.values()),
        "executions": len(executions),
        "executed_generations": len(ran),
        "invisible": invisible,
        "stuck": stuck,
    }
    return Verdict(violations, figures)
