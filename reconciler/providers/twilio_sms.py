"""Twilio SMS through the official ``twilio`` SDK (``effectq[twilio]``): the honest adapter
for a provider with no idempotency key and no metadata.

Where the key rides: nowhere Twilio stores it on the message. It rides in the
``StatusCallback`` URL (``?effectq=<idempotency key>``), which Twilio calls back with the
MessageSid: a callback handler that records the pair hands it to ``sid_for`` (evidence the
lookup reads first), and the late receipt of a fenced worker carries the Sid too.

Without a Sid, the lookup scans the Messages list filtered by ``To`` and ``From`` (the
message's identity), keeps the messages created inside the claim's window (from the claim's
server time, less the clock skew, to now) and compares the body. One match: Found. None,
from a scan that read every page, ``settle_s`` after the claim and inside ``retention_s``:
NotFound. Two or more (the same text to the same number twice in the window — a retry by
hand, another system): Unavailable, and UNKNOWN after the budget. That is this adapter's
documented cost: a recipient who gets the same text often is reconciled by an operator.

Error map (``execute``): 400 (invalid number, unverified sender: Twilio's 21xxx codes),
401, 403, 404 → RejectedError; 429 (20429) → NotExecutedError; 5xx, timeouts → uncertain.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from dedupe.errors import NotExecutedError, RejectedError
from dedupe.spec import Found, LookupContext, LookupResult, Unavailable

from .base import (
    EVIDENCE,
    CallLike,
    Executed,
    Method,
    Page,
    RateLimited,
    Scan,
    combine,
    evidence,
    judge,
    scan,
    setting,
)

__all__ = ["TwilioSms"]

DAY = 86400.0


class TwilioSms:
    provider = "twilio"

    def __init__(
        self,
        account_sid: str | Callable[[], str],
        auth_token: str | Callable[[], str],
        *,
        status_callback: str,
        api_base: str | Callable[[], str] | None = None,
        sid_for: Callable[[str], str | None] | None = None,
        settle_s: float = 10.0,
        retention_s: float = 400 * DAY,
        page_size: int = 100,
        max_pages: int = 20,
        skew_s: float = 5.0,
    ) -> None:
        self._sid = account_sid
        self._token = auth_token
        self._api_base = api_base
        self.status_callback = status_callback
        self.sid_for = sid_for
        self.scan_method = Method("Twilio message list", settle_s, retention_s, skew_s)
        self.page_size = page_size
        self.max_pages = max_pages
        self._client: Any = None

    def client(self) -> Any:
        if self._client is None:
            from twilio.rest import Client

            sid = setting(self._sid)
            token = setting(self._token)
            self._client = Client(sid, token)
            base = setting(self._api_base)
            if base:
                self._client.api.base_url = base
        return self._client

    def callback_url(self, idempotency_key: str) -> str:
        sep = "&" if "?" in self.status_callback else "?"
        return f"{self.status_callback}{sep}{urlencode({'effectq': idempotency_key})}"

    def execute(self, call: CallLike, *, to: str, sender: str, body: str) -> Executed:
        from twilio.base.exceptions import TwilioRestException

        try:
            message = self.client().messages.create(
                to=to,
                from_=sender,
                body=body,
                status_callback=self.callback_url(call.idempotency_key),
            )
        except TwilioRestException as exc:
            if exc.status == 429:
                raise NotExecutedError("twilio: rate limited (429)", key=call.key) from exc
            if exc.status in (400, 401, 403, 404):
                raise RejectedError(f"twilio: refused ({exc.status} {exc.code})",
                                    key=call.key) from exc  # fmt: skip
            raise
        return Executed(_receipt(_payload(message)), None)

    def lookup(self, idempotency_key: str, token: int | None = None) -> LookupResult:
        return Unavailable("the Twilio adapter scans by recipient and time (lookup_effect)")

    def lookup_effect(self, effect: LookupContext) -> LookupResult:
        from twilio.base.exceptions import TwilioException

        try:
            return combine(self._methods(effect))
        except TwilioException as exc:
            return Unavailable(f"twilio: {type(exc).__name__} {_status(exc) or ''}".strip())

    def _methods(self, effect: LookupContext) -> Iterator[LookupResult]:
        sids = evidence(effect)
        if self.sid_for and (sid := self.sid_for(effect.idempotency_key)):
            sids.append(sid)
        if sids:
            yield self._by_sid(effect, sids)
        yield self._by_scan(effect)

    def _by_sid(self, effect: LookupContext, sids: list[str]) -> LookupResult:
        from twilio.base.exceptions import TwilioRestException

        for sid in reversed(sids):
            try:
                message = _payload(self.client().messages(sid).fetch())
            except TwilioRestException as exc:
                if exc.status == 404:
                    continue
                raise
            if _same(message, effect):
                return Found(_receipt(message), json.dumps(message, sort_keys=True))
        return Unavailable("no recorded MessageSid is this message")

    def _by_scan(self, effect: LookupContext) -> LookupResult:
        from twilio.base.exceptions import TwilioException

        to, sender = effect.args.get("to"), effect.args.get("sender")
        if not isinstance(to, str) or not isinstance(sender, str):
            return Unavailable("the effect carries no 'to' and 'sender' to scan by")
        # Twilio's dates have whole seconds: a message sent in the claim's second reads
        # as created at its start.
        start_s = math.floor(effect.claimed_ms / 1000 - self.scan_method.skew_s)
        messages = self.client().messages

        def fetch(cursor: Any) -> Page[dict[str, Any]]:
            try:
                page = (
                    cursor.next_page()
                    if cursor is not None
                    else messages.page(to=to, from_=sender, page_size=self.page_size)
                )
            except TwilioException as exc:
                if _status(exc) == 429:
                    raise RateLimited("Twilio 429") from exc
                raise
            items = [_payload(m) for m in page]
            return Page(items, page if page.next_page_url else None)

        # Every page is read (``scan`` stops at a first match): any other text to this
        # recipient in the window could be this effect's, so it is a candidate too.
        candidates: list[dict[str, Any]] = []

        def collect(message: dict[str, Any]) -> bool:
            created = message.get("date_created_s")
            if created is not None and created >= start_s:
                candidates.append(message)
            return False

        read = scan(fetch, collect, max_pages=self.max_pages)
        result = Scan(candidates, read.complete, read.reason)

        def ambiguous(found: list[dict[str, Any]]) -> str | None:
            if not read.complete:
                return f"{len(found)} candidates, but {read.reason}"
            same = [m for m in found if _same(m, effect)]
            if len(found) == 1 and same:
                return None
            return (
                f"{len(found)} messages to this recipient in the window, "
                f"{len(same)} with this text (no key to tell them apart)"
            )

        return judge(
            self.scan_method,
            effect,
            result,
            lambda m: Found(_receipt(m), json.dumps(m, sort_keys=True)),
            ambiguous=ambiguous,
        )


def _status(exc: BaseException) -> int | None:
    """The HTTP status of a Twilio error: a TwilioRestException's ``status``, or the
    response a failed page fetch carries (``TwilioException("Unable to fetch page", r)``)."""
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return status
    for arg in exc.args:
        code = getattr(arg, "status_code", None)
        if isinstance(code, int):
            return code
    return None


def _payload(message: Any) -> dict[str, Any]:
    created: datetime | None = message.date_created
    return {
        "sid": message.sid,
        "to": message.to,
        "from": message.from_,
        "body": message.body,
        "status": message.status,
        "date_created": created.isoformat() if created else None,
        "date_created_s": created.astimezone(UTC).timestamp() if created else None,
    }


def _same(message: dict[str, Any], effect: LookupContext) -> bool:
    args = effect.args
    return (
        message.get("to") == args.get("to")
        and message.get("from") == args.get("sender")
        and message.get("body") == args.get("body")
    )


def _receipt(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "provider": "twilio",
        EVIDENCE: message.get("sid"),
        "status": message.get("status"),
        "date_created": message.get("date_created"),
    }
