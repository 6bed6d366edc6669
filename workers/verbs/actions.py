"""The faces' actions on effects: submit a call or a campaign, and the operator's writes
(resolve, revoke, supersede, recheck, replay), on ``operator()`` — the current runtime's ledger
with the tools declared here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dedupe import MessageError, OperatorError, Write

if TYPE_CHECKING:
    from dedupe import EffectRecord
    from reconciler import Operator

    from ..campaigns import CampaignFile, CampaignReport, CampaignSource
    from ..producer import Handle
    from ..runtime import Runtime
    from ..settings import Settings

# producer.submit takes these as its own parameters: a tool argument by one of these names
# could not be passed through (and would be a TypeError deep in a request).
_RESERVED = frozenset({"tool", "scope", "action"})


def adopt_namespace(cfg: Settings, *, actor: str, reason: str) -> dict[str, Any]:
    """``effectq ledger adopt``: register ``cfg.namespace`` in the ledger's version record
    on an operator's word (the upgrade of a ledger written before versions existed, whose
    records no namespace check can attribute), audited with actor and reason."""
    from dedupe import Ledger
    from reconciler.operator import check_words

    check_words(actor, reason)
    ledger = Ledger.from_url(
        cfg.redis_url, namespace=cfg.namespace, allow_volatile=cfg.allow_volatile_ledger
    )
    return ledger.adopt_namespace(actor=actor, reason=reason)


def operator(rt: Runtime | None = None) -> Operator:
    """The operator of ``rt`` (default: the current runtime) for the tools declared here."""
    from reconciler.operator import Operator

    from .. import registry
    from ..runtime import current

    return Operator((rt or current()).ledger(), registry.specs())


def submit_call(
    tool: str, *, scope: str, action: str | None = None, args: Mapping[str, Any] | None = None
) -> Handle:
    """Submit one call (deduplicated before the broker); ``Handle.as_dict()`` is the
    ``submit --json`` document."""
    from ..producer import submit

    args = dict(args or {})
    reserved = sorted(_RESERVED & args.keys())
    if reserved:
        raise MessageError(f"argument names {reserved} are reserved (tool, scope, action)")
    return submit(tool, scope=scope, action=action, **args)


def await_receipt(handle: Handle, timeout: float) -> Handle:
    """``submit --wait``: block until the receipt while the call is in progress (enqueued
    or pending); raises WaitTimeout, whose details carry the state, if not DONE in time."""
    from ..producer import Status

    if handle.status in (Status.ENQUEUED, Status.PENDING):
        handle.wait(timeout)
    return handle


def submit_campaign_file(
    spec: CampaignFile,
    progress: Callable[[int], None] | None = None,
    planning: Callable[[int], None] | None = None,
) -> CampaignReport:
    """Freeze and fan out a campaign given as ``POST /v1/campaigns`` takes it."""
    from ..campaigns.submit import submit_campaign

    return submit_campaign(
        spec.campaign_id, spec.tool, spec.recipients, spec.args, action=spec.action,
        plan_version=spec.plan_version, progress=progress, planning=planning,
    )  # fmt: skip


def open_campaign_file(path: str) -> CampaignSource:
    """``effectq campaign submit FILE``: the file checked (JSON, its header, 1 to 1,000,000
    recipients) and counted, not loaded. Raises OSError, pydantic's ValidationError,
    MessageError."""
    from ..campaigns.file import CampaignSource

    return CampaignSource.open(path)


def submit_campaign_source(
    source: CampaignSource,
    progress: Callable[[int], None] | None = None,
    planning: Callable[[int], None] | None = None,
) -> CampaignReport:
    """Freeze and fan out a campaign file, streamed (``effectq campaign submit FILE``)."""
    from ..campaigns.submit import submit_campaign

    spec = source.header
    return submit_campaign(
        spec.campaign_id, spec.tool, source.recipients(), spec.args, action=spec.action,
        plan_version=spec.plan_version, progress=progress, planning=planning,
    )  # fmt: skip


def write_document(key: str, write: Write) -> dict[str, Any]:
    """``resolve`` / ``revoke`` / ``supersede --json``."""
    return {"key": key, "state": write.state, "token": write.token}


def resolve(
    key: str,
    *,
    executed: bool,
    actor: str,
    reason: str,
    receipt: Mapping[str, Any] | None = None,
    override_evidence: bool = False,
) -> dict[str, Any]:
    write = operator().resolve(
        key, executed=executed, actor=actor, reason=reason, receipt=receipt,
        override_evidence=override_evidence,
    )  # fmt: skip
    return write_document(key, write)


def revoke(key: str, *, actor: str, reason: str) -> dict[str, Any]:
    return write_document(key, operator().revoke(key, actor=actor, reason=reason))


def supersede(key: str, *, actor: str, reason: str) -> dict[str, Any]:
    return write_document(key, operator().supersede(key, actor=actor, reason=reason))


def recheck(
    tool: str,
    *,
    since_ms: int | None,
    until_ms: int | None,
    actor: str,
    reason: str,
    dry_run: bool = False,
) -> dict[str, Any]:
    """``recheck --json``: UNKNOWN effects of ``tool`` (became UNKNOWN in the range) back to
    the reconciler, which asks the provider again; ``dry_run`` counts and changes nothing."""
    if since_ms is not None and until_ms is not None and since_ms > until_ms:
        raise MessageError("since is after until: the range is empty")
    return operator().recheck(
        tool, since_ms=since_ms, until_ms=until_ms, actor=actor, reason=reason,
        dry_run=dry_run,
    )  # fmt: skip


# What a refused replay tells the operator to pass: the faces spell these alike (the CLI's
# --scope / --action / --arg, the API body's and the console form's scope, action, args).
_PASS_THE_CALL = "pass the original call: --scope, --action and --arg (API: scope, action, args)"


def replay(
    key: str,
    *,
    actor: str,
    reason: str,
    scope: str | None = None,
    action: str | None = None,
    args: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Submit a FAILED / REVOKED / SUPERSEDED effect again: the call given (scope, action,
    args, as ``submit`` takes them), else the record's stored request. A record settled DONE
    keeps no request, so replay from REVOKED / SUPERSEDED needs the call given; either way
    it must derive this key under the tool's current declaration and carry the recorded
    bound values (its fingerprint): a different request is a conflict, never sent."""
    from ..producer import submit
    from ..tool import get_tool

    given = scope is not None or action is not None or args is not None

    def enqueue(record: EffectRecord) -> str:
        if given:
            if scope is None:
                raise OperatorError(
                    f"replay refused: the call given has no scope; {_PASS_THE_CALL}"
                )
            call_scope, call_action, call_args = scope, action, dict(args or {})
        elif record.request is None:
            # Dropped when the effect settled DONE (issue 39): the operator holds the call.
            raise OperatorError(
                f"replay refused: the record keeps no request once DONE; {_PASS_THE_CALL}",
                key=key,
            )
        else:
            request = record.request
            stored_scope, stored_args = request.get("scope"), request.get("args")
            if not isinstance(stored_scope, str) or not isinstance(stored_args, dict):
                raise OperatorError("replay refused: the stored request is incomplete", key=key)
            call_scope, call_action, call_args = stored_scope, request.get("action"), stored_args
        reserved = sorted(_RESERVED & call_args.keys())
        if reserved:
            raise MessageError(f"argument names {reserved} are reserved (tool, scope, action)")
        tool = get_tool(record.tool)
        effect = tool.derive(call_scope, call_args, call_action)
        # The call must still name this effect: a tool whose declaration changed since, or
        # another scope or identity value, would replay under another key, a fresh effect
        # nobody approved.
        what = "the call given" if given else "the stored request"
        if effect.key != key:
            if given:
                raise OperatorError(
                    "replay refused: the call given derives another key than this effect's "
                    "(its scope, action or identity fields differ)",
                    key=key,
                )
            raise OperatorError(
                "replay refused: the stored request no longer derives this key (the tool's "
                "declaration changed); submit the call anew",
                key=key,
            )
        if effect.fingerprint != record.fingerprint:
            raise OperatorError(
                f"replay refused: conflict: {what} has other bound values than this "
                "effect's (its fingerprint differs)",
                key=key,
            )
        return submit(tool, scope=call_scope, action=call_action, **call_args).status.value

    status = operator().replay(key, actor=actor, reason=reason, enqueue=enqueue)
    return {"key": key, "status": status}
