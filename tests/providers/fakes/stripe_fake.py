"""Stripe's documented surface for PaymentIntents, as ``stripe`` (the official SDK) sends
and parses it: form-encoded POST /v1/payment_intents with ``Idempotency-Key``, GET
/v1/payment_intents/{id}, GET /v1/payment_intents/search (``query``, ``limit``, ``page``;
``next_page`` and ``has_more``), GET /v1/events (``type``, ``created[gte]``, ``limit``,
``starting_after``; each event's ``request.idempotency_key``).

Switches (attributes): ``search_lag_s`` (an intent is searchable that long after creation),
``replay_500`` (the next create executes, then answers 500 — and that 500 is the saved
response its key replays), ``lose_response`` (the next create executes and the connection
closes unanswered), ``rate_limit`` (search and events answer 429), ``page_cap`` (at most
this many items per page whatever ``limit`` asks), ``events_retention_s`` (older events
are gone). A changed payload under a used key answers 400 ``idempotency_error``.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

from .http import Fake, Reply, Request

_ids = itertools.count(1)


def _error(status: int, type_: str, message: str, code: str | None = None) -> Reply:
    body: dict[str, Any] = {"error": {"type": type_, "message": message}}
    if code:
        body["error"]["code"] = code
    return Reply(status, body, {"Request-Id": f"req_{next(_ids)}"})


class StripeFake(Fake):
    def __init__(self) -> None:
        super().__init__()
        self.intents: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []  # oldest first
        self.saved: dict[str, tuple[dict[str, str], Reply]] = {}
        self.executions: Counter[str] = Counter()  # ground truth, per metadata key
        self.search_lag_s = 0.0
        self.replay_500 = False
        self.lose_response = False
        self.rate_limit = False
        self.page_cap: int | None = None
        self.events_retention_s = 30 * 86400.0

    def handle(self, request: Request) -> Reply:
        if request.method == "POST" and request.path == "/v1/payment_intents":
            return self._create(request)
        if request.method == "GET" and request.path == "/v1/payment_intents/search":
            return self._search(request)
        if request.method == "GET" and request.path.startswith("/v1/payment_intents/"):
            intent = self.intents.get(request.path.rsplit("/", 1)[1])
            if intent is None:
                return _error(404, "invalid_request_error", "No such payment_intent",
                              "resource_missing")  # fmt: skip
            return Reply(200, self._public(intent))
        if request.method == "GET" and request.path == "/v1/events":
            return self._events(request)
        return _error(404, "invalid_request_error", "Unrecognized request URL")

    def _create(self, request: Request) -> Reply:
        form = request.form()
        key = request.headers.get("idempotency-key")
        if key and key in self.saved:
            params, reply = self.saved[key]
            if params != form:
                return _error(400, "idempotency_error",
                              "Keys for idempotent requests can only be used with the same "
                              "parameters they were first used with.")  # fmt: skip
            return reply
        try:
            amount = int(form["amount"])
        except (KeyError, ValueError):
            return _error(400, "invalid_request_error", "Missing required param: amount.",
                          "parameter_missing")  # fmt: skip
        metadata = {k[9:-1]: v for k, v in form.items() if k.startswith("metadata[")}
        intent = {
            "id": f"pi_{next(_ids):08d}",
            "object": "payment_intent",
            "amount": amount,
            "currency": form.get("currency", "usd"),
            "status": "succeeded" if form.get("confirm") == "true" else "requires_confirmation",
            "metadata": metadata,
            "created": int(self.now()),
            "_created_f": self.now(),
        }
        self.intents[intent["id"]] = intent
        self.executions[metadata.get("effectq_key", "")] += 1
        request_id = f"req_{next(_ids)}"
        self.events.append({
            "id": f"evt_{next(_ids):08d}",
            "object": "event",
            "type": "payment_intent.created",
            "created": intent["created"],
            "data": {"object": self._public(intent)},
            "request": {"id": request_id, "idempotency_key": key},
        })  # fmt: skip
        reply = Reply(200, self._public(intent), {"Request-Id": request_id})
        if self.replay_500:
            self.replay_500 = False
            reply = _error(500, "api_error", "An unknown error occurred")
        if key:
            self.saved[key] = (form, reply)
        if self.lose_response:
            self.lose_response = False
            return Reply(0, drop=True)
        return reply

    def _public(self, intent: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in intent.items() if not k.startswith("_")}

    def _page_size(self, request: Request) -> int:
        limit = int(request.query.get("limit", "10"))
        return min(limit, self.page_cap) if self.page_cap else limit

    def _search(self, request: Request) -> Reply:
        if self.rate_limit:
            return _error(429, "invalid_request_error", "Too many requests", "rate_limit")
        query = request.query.get("query", "")
        prefix = "metadata['effectq_key']:'"
        if not (query.startswith(prefix) and query.endswith("'")):
            return _error(400, "invalid_request_error", "unsupported query in this fake")
        wanted = query[len(prefix) : -1]
        now = self.now()
        hits = [
            self._public(i)
            for i in sorted(self.intents.values(), key=lambda i: -i["_created_f"])
            if i["metadata"].get("effectq_key") == wanted
            and now - i["_created_f"] >= self.search_lag_s
        ]
        start = int(request.query.get("page") or 0)
        size = self._page_size(request)
        more = start + size < len(hits)
        return Reply(200, {
            "object": "search_result",
            "url": "/v1/payment_intents/search",
            "data": hits[start : start + size],
            "has_more": more,
            "next_page": str(start + size) if more else None,
        })  # fmt: skip

    def _events(self, request: Request) -> Reply:
        if self.rate_limit:
            return _error(429, "invalid_request_error", "Too many requests", "rate_limit")
        now = self.now()
        since = int(request.query.get("created[gte]", "0"))
        kind = request.query.get("type")
        listed = [
            e
            for e in reversed(self.events)  # newest first, as Stripe lists
            if e["created"] >= since
            and now - e["created"] <= self.events_retention_s
            and (kind is None or e["type"] == kind)
        ]
        after = request.query.get("starting_after")
        if after:
            ids = [e["id"] for e in listed]
            listed = listed[ids.index(after) + 1 :] if after in ids else []
        size = self._page_size(request)
        return Reply(200, {
            "object": "list",
            "url": "/v1/events",
            "data": listed[:size],
            "has_more": len(listed) > size,
        })  # fmt: skip
