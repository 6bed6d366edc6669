"""Postmark's documented surface as ``postmarker`` sends and parses it: POST /email (JSON,
``X-Postmark-Server-Token``; ``Metadata``) → ``{To, SubmittedAt, MessageID, ErrorCode: 0,
Message}``; GET /messages/outbound (``count`` ≤ 500, ``offset``, ``count + offset`` ≤ 10,000,
``metadata_<field>``) → ``{TotalCount, Messages}``; GET /messages/outbound/{id}/details.
Errors are ``{ErrorCode, Message}`` with HTTP 422 (401 for a bad token, 429, 500).

Switches: ``search_lag_s``, ``lose_response``, ``fail_500_after_send`` (sent, answered
500), ``rate_limit``, ``page_cap`` (TotalCount reports more than the pages serve: a
partial listing), ``offset_cap`` (10,000 by default), ``retention_s`` (45 days).
"""

from __future__ import annotations

import itertools
import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from .http import Fake, Reply, Request

_ids = itertools.count(1)


def _error(status: int, code: int, message: str) -> Reply:
    return Reply(status, {"ErrorCode": code, "Message": message})


class PostmarkFake(Fake):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[dict[str, Any]] = []  # oldest first
        self.executions: Counter[str] = Counter()
        self.search_lag_s = 0.0
        self.lose_response = False
        self.fail_500_after_send = False
        self.rate_limit = False
        self.page_cap: int | None = None
        self.offset_cap = 10_000
        self.retention_s = 45 * 86400.0

    def handle(self, request: Request) -> Reply:
        if not request.headers.get("x-postmark-server-token"):
            return _error(401, 10, "No Account or Server API tokens were supplied")
        if request.method == "POST" and request.path == "/email":
            return self._send(request.json())
        if self.rate_limit:
            return _error(429, 429, "Rate limit exceeded")
        if request.method == "GET" and request.path == "/messages/outbound":
            return self._search(request.query)
        if request.method == "GET" and request.path.endswith("/details"):
            wanted = request.path.split("/")[-2]
            for m in self.messages:
                if m["MessageID"] == wanted and self._visible(m):
                    return Reply(200, self._public(m))
            return _error(422, 701, "This message was not found.")
        return _error(404, 0, "not in this fake")

    def _send(self, data: dict[str, Any]) -> Reply:
        if not data.get("To") or not data.get("From"):
            return _error(422, 300, "Invalid email request")
        metadata = data.get("Metadata") or {}
        now = self.now()
        message = {
            "MessageID": str(uuid.uuid4()),
            "To": [{"Email": a.strip(), "Name": ""} for a in data["To"].split(",")],
            "From": data["From"],
            "Subject": data.get("Subject", ""),
            "Metadata": metadata,
            "Status": "Sent",
            "ReceivedAt": datetime.fromtimestamp(now, UTC).isoformat(),
            "_at": now,
            "_n": next(_ids),
        }
        self.messages.append(message)
        self.executions[metadata.get("effectq_key", "")] += 1
        if self.lose_response:
            self.lose_response = False
            return Reply(0, drop=True)
        if self.fail_500_after_send:
            self.fail_500_after_send = False
            return _error(500, 0, "Internal server error")
        return Reply(200, {
            "To": data["To"], "SubmittedAt": message["ReceivedAt"],
            "MessageID": message["MessageID"], "ErrorCode": 0, "Message": "OK",
        })  # fmt: skip

    def _visible(self, m: dict[str, Any]) -> bool:
        age = self.now() - m["_at"]
        return self.search_lag_s <= age <= self.retention_s

    def _public(self, m: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in m.items() if not k.startswith("_")}

    def _search(self, query: dict[str, str]) -> Reply:
        count, offset = int(query.get("count", "0")), int(query.get("offset", "0"))
        if not 0 < count <= 500 or count + offset > self.offset_cap:
            return _error(422, 600, "Count + offset must not exceed 10000, count 500")
        filters = {k[9:]: v for k, v in query.items() if k.startswith("metadata_")}
        hits = [
            self._public(m)
            for m in reversed(self.messages)
            if self._visible(m) and all(m["Metadata"].get(k) == v for k, v in filters.items())
        ]
        served = count if self.page_cap is None else min(count, self.page_cap)
        return Reply(200, {"TotalCount": len(hits), "Messages": hits[offset : offset + served]})
