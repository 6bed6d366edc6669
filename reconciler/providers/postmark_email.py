"""Postmark email through ``postmarker`` (``effectq[postmark]``), the Python client
Postmark lists among its libraries.

Why Postmark: its outbound message search takes a filter on a value attached at send time
(``metadata_<field>=<value>`` on ``GET /messages/outbound``, documented with the Messages
API), so "did the call with this key happen?" is one filtered, paginated query. Mailgun's
events API filters on ``v:`` variables too, but asks a page be ~30 min old before it is
trusted; SendGrid's activity feed needs a paid add-on and allows 6 requests a minute.

Where the key rides: ``Metadata.effectq_key`` (the effect's idempotency key: 64 of the 80
characters a metadata value may have; a field name may have 20). Postmark takes no
idempotency key, so a repeat of the same send is a second email: the ledger's claim is the
only guard, and a lost response is settled by the lookup, never by sending again.

Lookup methods: the MessageID recorded so far (late receipts) → ``/messages/outbound/{id}/
details``; else the metadata search, trusted only ``settle_s`` after the call (Postmark
publishes no indexing delay, and a queued message has answered "doesn't exist" for hours:
300 s is this adapter's choice, set it to what you observe), read to its end: at most 500 a
page and offset + count ≤ 10,000 (past that the listing is capped: Unavailable); messages are
kept 45 days (the SDK's docstring), after which a search proves nothing.

Error map (``execute``): HTTP 422 with an ErrorCode (the API refused it) and 401 →
RejectedError; 429 → NotExecutedError; 5xx, timeouts, a dropped connection → uncertain.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from dedupe.errors import NotExecutedError, RejectedError
from dedupe.spec import Found, LookupContext, LookupResult, Unavailable

from .base import (
    EVIDENCE,
    CallLike,
    Executed,
    Method,
    Page,
    RateLimited,
    combine,
    evidence,
    judge,
    scan,
    setting,
)

__all__ = ["PostmarkEmail"]

DAY = 86400.0
METADATA_KEY = "effectq_key"
#: Postmark's search: at most 500 a page, and no page past offset + count = 10,000.
PAGE_MAX = 500
OFFSET_CAP = 10_000


class PostmarkEmail:
    provider = "postmark"

    def __init__(
        self,
        server_token: str | Callable[[], str],
        *,
        api_base: str | Callable[[], str] | None = None,
        settle_s: float = 300.0,
        retention_s: float = 45 * DAY,
        page_size: int = PAGE_MAX,
        max_pages: int = 20,
        timeout_s: float = 10.0,
        skew_s: float = 5.0,
    ) -> None:
        self._token = server_token
        self._api_base = api_base
        self.search = Method("Postmark message search", settle_s, retention_s, skew_s)
        self.page_size = min(page_size, PAGE_MAX)
        self.max_pages = max_pages
        self.timeout_s = timeout_s
        self._client: Any = None

    def client(self) -> Any:
        if self._client is None:
            from postmarker.core import PostmarkClient

            token = setting(self._token)
            base = setting(self._api_base)
            options: dict[str, Any] = {"timeout": self.timeout_s}
            if base:
                options["root_api_url"] = base
            self._client = PostmarkClient(server_token=token, **options)
        return self._client

    def execute(
        self, call: CallLike, *, sender: str, to: str, subject: str, text: str, **fields: Any
    ) -> Executed:
        """Send one email; ``fields`` are further Postmark send fields (``HtmlBody``,
        ``Tag``, ``MessageStream``...)."""
        import requests
        from postmarker.exceptions import ClientError

        metadata = {**fields.pop("Metadata", {}), METADATA_KEY: call.idempotency_key}
        try:
            sent = self.client().emails.send(
                From=sender,
                To=to,
                Subject=subject,
                TextBody=text,
                Metadata=metadata,
                **fields,
            )
        except (ClientError, requests.HTTPError) as exc:
            status = _status(exc)
            if status == 429:
                raise NotExecutedError("postmark: rate limited (429)", key=call.key) from exc
            if status in (401, 422):
                code = getattr(exc, "error_code", "")
                raise RejectedError(f"postmark: refused ({status} {code})", key=call.key) from exc
            raise
        receipt = {
            "provider": "postmark",
            EVIDENCE: sent.get("MessageID"),
            "submitted_at": sent.get("SubmittedAt"),
        }
        return Executed(receipt, json.dumps(sent, sort_keys=True))

    def lookup(self, idempotency_key: str, token: int | None = None) -> LookupResult:
        return Unavailable("the Postmark adapter reads the effect (lookup_effect)")

    def lookup_effect(self, effect: LookupContext) -> LookupResult:
        import requests
        from postmarker.exceptions import PostmarkerException

        try:
            return _checked(effect, combine(self._methods(effect)))
        except (PostmarkerException, requests.RequestException) as exc:
            return Unavailable(f"postmark: {type(exc).__name__} {_status(exc) or ''}".strip())

    def _methods(self, effect: LookupContext) -> Iterator[LookupResult]:
        if evidence(effect):
            yield self._by_id(effect)
        yield self._by_search(effect)

    def _by_id(self, effect: LookupContext) -> LookupResult:
        from postmarker.exceptions import ClientError

        for message_id in reversed(evidence(effect)):
            try:
                details = self.client().call("GET", f"/messages/outbound/{message_id}/details")
            except ClientError:
                continue  # "doesn't exist" also answers for a queued message: no proof
            if (details.get("Metadata") or {}).get(METADATA_KEY) == effect.idempotency_key:
                return _found(details)
        return Unavailable("no recorded MessageID is a message under this key")

    def _by_search(self, effect: LookupContext) -> LookupResult:
        import requests
        from postmarker.exceptions import ClientError

        def fetch(cursor: Any) -> Page[dict[str, Any]]:
            offset = cursor or 0
            try:
                listed = self.client().call(
                    "GET", "/messages/outbound", count=self.page_size, offset=offset,
                    **{f"metadata_{METADATA_KEY}": effect.idempotency_key},
                )  # fmt: skip
            except (ClientError, requests.HTTPError) as exc:
                if _status(exc) == 429:
                    raise RateLimited("Postmark 429") from exc
                raise
            total = int(listed.get("TotalCount", 0))
            items = list(listed.get("Messages") or [])
            end = offset + self.page_size
            if end >= total:
                return Page(items, None, total=total)
            # The search serves nothing past offset + count = 10,000.
            return Page(items, end, capped=end + self.page_size > OFFSET_CAP, total=total)

        result = scan(
            fetch,
            lambda m: (m.get("Metadata") or {}).get(METADATA_KEY) == effect.idempotency_key,
            max_pages=self.max_pages,
        )
        return judge(self.search, effect, result, _found)


def _status(exc: BaseException) -> int | None:
    """The HTTP status behind a postmarker or requests error (ClientError chains it)."""
    for err in (exc, exc.__cause__):
        response = getattr(err, "response", None)
        if response is not None:
            return int(response.status_code)
    return None


def _found(message: Mapping[str, Any]) -> Found:
    receipt = {
        "provider": "postmark",
        EVIDENCE: message.get("MessageID"),
        "submitted_at": message.get("ReceivedAt"),
        "status": message.get("Status"),
    }
    return Found(receipt, json.dumps(message, sort_keys=True))


def _recipients(value: Any) -> set[str]:
    if isinstance(value, str):
        return {a.strip().lower() for a in value.split(",") if a.strip()}
    if isinstance(value, list):
        return {str(r.get("Email", "")).lower() for r in value if isinstance(r, Mapping)}
    return set()


def _checked(effect: LookupContext, result: LookupResult) -> LookupResult:
    """A message under our key to other recipients or with another subject: neither DONE
    with it nor "not executed"."""
    if not isinstance(result, Found) or result.raw is None:
        return result
    message = json.loads(result.raw)
    if "to" in effect.args and _recipients(message.get("To")) != _recipients(effect.args["to"]):
        return Unavailable("found under this key with other recipients")
    if "subject" in effect.args and message.get("Subject") != effect.args["subject"]:
        return Unavailable("found under this key with another subject")
    return result
