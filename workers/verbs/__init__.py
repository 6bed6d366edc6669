"""The one door of effectq's faces — the ``effectq`` CLI, the HTTP API and the console: every
read and every action they offer, written once.

Each returns a record or the JSON document that ``effectq … --json`` prints and the API
answers (DESIGN §8), or raises from effectq's error tree; the CLI maps the error to an exit
code, the API to a status code. Reads take an ``Operator`` built by ``reader`` (just the
ledger: no tools, no Dramatiq, so a CLI read starts quickly); actions run on ``operator()``,
which needs the tools (``EFFECTQ_TOOLS``) loaded. Nothing here imports the web framework.
"""

from .actions import (
    adopt_namespace,
    await_receipt,
    open_campaign_file,
    operator,
    recheck,
    replay,
    resolve,
    revoke,
    submit_call,
    submit_campaign_file,
    submit_campaign_source,
    supersede,
    write_document,
)
from .queues import controls, dead_queue, pause, resume, scheduled
from .reads import (
    MAX_PAGE,
    audit_page,
    audit_trail,
    campaign_job,
    campaign_status,
    dead_letters,
    effects,
    effects_page,
    expired_claims,
    find_keys,
    inspect,
    list_effects,
    page_cursor,
    parse_since,
    pending_markers,
    reader,
    stream_cursor,
)

__all__ = [
    "MAX_PAGE",
    "adopt_namespace",
    "audit_page",
    "audit_trail",
    "await_receipt",
    "campaign_job",
    "campaign_status",
    "controls",
    "dead_letters",
    "dead_queue",
    "effects",
    "effects_page",
    "expired_claims",
    "find_keys",
    "inspect",
    "list_effects",
    "open_campaign_file",
    "operator",
    "page_cursor",
    "parse_since",
    "pause",
    "pending_markers",
    "reader",
    "recheck",
    "replay",
    "resolve",
    "resume",
    "revoke",
    "scheduled",
    "stream_cursor",
    "submit_call",
    "submit_campaign_file",
    "submit_campaign_source",
    "supersede",
    "write_document",
]
