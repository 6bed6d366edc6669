"""Twilio's Messages resource as ``twilio`` (the official SDK) sends and parses it: POST
/2010-04-01/Accounts/{Sid}/Messages.json (form: To, From, Body, StatusCallback) → 201 with
the message; GET .../Messages.json (To, From, PageSize, Page, PageToken) → ``{messages,
next_page_uri, page, page_size, uri, ...}``, newest first; GET .../Messages/{Sid}.json.
Dates are RFC 2822; errors ``{code, message, more_info, status}``. Twilio stores no
idempotency key and no metadata: the StatusCallback URL is kept here only to call back.

Switches: ``lose_response``, ``rate_limit`` (429, code 20429), ``page_cap``, ``drop_pages``
(the listing ends early: ``next_page_uri`` null with pages left unserved),
``retention_s``.
"""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from .http import Fake, Reply, Request

_ids = itertools.count(1)


def _error(status: int, code: int, message: str) -> Reply:
    return Reply(status, {"code": code, "message": message, "more_info": "", "status": status})


class TwilioFake(Fake):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[dict[str, Any]] = []  # oldest first
        self.callbacks: list[str] = []
        self.executions: Counter[str] = Counter()  # by the key in the StatusCallback URL
        self.lose_response = False
        self.rate_limit = False
        self.page_cap: int | None = None
        self.drop_pages = False
        self.retention_s = 400 * 86400.0

    def handle(self, request: Request) -> Reply:
        parts = request.path.split("/")
        if len(parts) < 5 or parts[1] != "2010-04-01" or parts[2] != "Accounts":
            return _error(404, 20404, "The requested resource was not found")
        account, rest = parts[3], "/".join(parts[4:])
        if request.method == "POST" and rest == "Messages.json":
            return self._create(account, request.form())
        if self.rate_limit:
            return _error(429, 20429, "Too Many Requests")
        if request.method == "GET" and rest == "Messages.json":
            return self._list(account, request)
        if request.method == "GET" and rest.startswith("Messages/"):
            sid = rest.split("/")[1].removesuffix(".json")
            for m in self.messages:
                if m["sid"] == sid and self._kept(m):
                    return Reply(200, self._public(m))
            return _error(404, 20404, "The requested resource was not found")
        return _error(404, 20404, "The requested resource was not found")

    def _create(self, account: str, form: dict[str, str]) -> Reply:
        if not form.get("To", "").startswith("+") or not form.get("Body"):
            return _error(400, 21211, "The 'To' number is not a valid phone number.")
        now = self.now()
        message = {
            "sid": f"SM{next(_ids):032x}",
            "account_sid": account,
            "to": form["To"],
            "from": form.get("From"),
            "body": form["Body"],
            "status": "queued",
            "direction": "outbound-api",
            "date_created": format_datetime(datetime.fromtimestamp(int(now), UTC)),
            "date_updated": format_datetime(datetime.fromtimestamp(int(now), UTC)),
            "date_sent": None,
            "uri": "",
            "_at": now,
        }
        self.messages.append(message)
        callback = form.get("StatusCallback", "")
        self.callbacks.append(callback)
        key = parse_qs(urlsplit(callback).query).get("effectq", [""])[0]
        self.executions[key] += 1
        if self.lose_response:
            self.lose_response = False
            return Reply(0, drop=True)
        return Reply(201, self._public(message))

    def _kept(self, m: dict[str, Any]) -> bool:
        return self.now() - m["_at"] <= self.retention_s

    def _public(self, m: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in m.items() if not k.startswith("_")}

    def _list(self, account: str, request: Request) -> Reply:
        q = request.query
        hits = [
            self._public(m)
            for m in reversed(self.messages)
            if self._kept(m)
            and ("To" not in q or m["to"] == q["To"])
            and ("From" not in q or m["from"] == q["From"])
        ]
        size = int(q.get("PageSize", "50"))
        served = min(size, self.page_cap) if self.page_cap else size
        page = int(q.get("Page", "0"))
        start = page * served
        more = start + served < len(hits) and not self.drop_pages
        base = f"/2010-04-01/Accounts/{account}/Messages.json"
        keep = urlencode({k: q[k] for k in ("To", "From") if k in q})
        return Reply(200, {
            "messages": hits[start : start + served],
            "next_page_uri": f"{base}?{keep}&PageSize={size}&Page={page + 1}" if more else None,
            "page": page, "page_size": served, "uri": request.path,
            "first_page_uri": base, "previous_page_uri": None, "start": start,
            "end": start + served,
        })  # fmt: skip
