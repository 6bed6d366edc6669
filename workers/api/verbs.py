"""The verbs both faces of effectq run — the ``effectq`` CLI and the HTTP API — written once.

Each returns the JSON document that ``effectq … --json`` prints and the API answers
(DESIGN §8), or raises from effectq's error tree; the CLI maps the error to an exit code,
the API to a status code. Nothing here imports the web framework, so the CLI stays quick.
The tools (``EFFECTQ_TOOLS``) must be imported before any verb runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dedupe import MessageError, OperatorError, Write

if TYPE_CHECKING:
    from dedupe import EffectRecord
    from reconciler import Operator

    from ..campaign import CampaignFile, CampaignReport
    from ..producer import Handle

__all__ = [
    "await_receipt",
    "operator",
    "replay",
    "resolve",
    "revoke",
    "submit_call",
    "submit_campaign_file",
    "supersede",
    "write_document",
]

# producer.submit takes these as its own parameters: a tool argument by one of these names
# could not be passed through (and would be a TypeError deep in a request).
_RESERVED = frozenset({"tool", "scope", "action"})


def operator() -> Operator:
    from reconciler import Operator

    from .. import runtime
    from ..tool import TOOLS

    return Operator(runtime.ledger(), {name: t.spec for name, t in TOOLS.items()})


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
    spec: CampaignFile, progress: Callable[[int], None] | None = None
) -> CampaignReport:
    """Freeze and fan out a campaign given as ``effectq campaign submit`` reads its file."""
    from ..campaign import submit_campaign

    return submit_campaign(
        spec.campaign_id, spec.tool, spec.recipients, spec.args, action=spec.action,
        plan_version=spec.plan_version, progress=progress,
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


def replay(key: str, *, actor: str, reason: str) -> dict[str, Any]:
    """Submit the stored request of a FAILED / REVOKED / SUPERSEDED effect again."""
    from ..producer import submit

    def enqueue(record: EffectRecord) -> str:
        from ..tool import get_tool

        request = record.request or {}
        scope, args = request.get("scope"), request.get("args")
        if not isinstance(scope, str) or not isinstance(args, dict):
            raise OperatorError("replay refused: the stored request is incomplete", key=key)
        tool = get_tool(record.tool)
        # The stored request must still name this effect: a tool whose declaration changed
        # since would replay under another key, a fresh effect nobody approved.
        if tool.derive(scope, args, request.get("action")).key != key:
            raise OperatorError(
                "replay refused: the stored request no longer derives this key (the tool's "
                "declaration changed); submit the call anew",
                key=key,
            )
        return submit(tool, scope=scope, action=request.get("action"), **args).status.value

    status = operator().replay(key, actor=actor, reason=reason, enqueue=enqueue)
    return {"key": key, "status": status}
