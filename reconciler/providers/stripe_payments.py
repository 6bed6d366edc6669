"""Stripe PaymentIntents through the official ``stripe`` SDK (``effectq[stripe]``).

Where the key rides: the ``Idempotency-Key`` header (``provider_key``: ``effectq-`` + the
effect's idempotency key, 72 of Stripe's 255 characters; Stripe keeps it at least 24 h and
replays the saved response, a saved 500 included) and ``metadata.effectq_key`` (the effect's
idempotency key, so another generation's object never matches).

Lookup methods, asked in turn; the first to find the intent wins, and one that covered the
whole window on its own earns NotFound:

1. the object ids recorded so far (late receipts) → retrieve: read-after-write, no lag;
2. Search on ``metadata['effectq_key']``: "under normal operating conditions, data is
   searchable in less than a minute" and "up to an hour behind during outages" (the SDK's
   own docstring), so its "not found" counts only once the claim is older than
   ``search_settle_s``;
3. Events ``payment_intent.created`` since the claim, matched on
   ``request.idempotency_key``: no search index behind it, but Stripe keeps events for 30
   days and the list is paginated (every page read, or Unavailable).

Error map (``execute``): 402 card error, 400/401/403/404 invalid request → RejectedError
(Stripe saves no result for a request that failed validation); 429 → NotExecutedError;
400 ``idempotency_error`` (same key, other parameters) → ConflictError; 409 (the key in use
by a concurrent request), 5xx, a connection error → the SDK's error, uncertain.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from dedupe.errors import ConflictError, NotExecutedError, RejectedError
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
    provider_key,
    scan,
    setting,
)

if TYPE_CHECKING:
    import stripe

__all__ = ["StripePaymentIntents"]

DAY = 86400.0
METADATA_KEY = "effectq_key"
#: Stripe's documented limit on an Idempotency-Key.
MAX_KEY = 255


class StripePaymentIntents:
    """Creates PaymentIntents and finds them again. ``api_key`` and ``api_base`` may be
    callables, read when the client is first made (tools are declared at import)."""

    provider = "stripe"

    def __init__(
        self,
        api_key: str | Callable[[], str],
        *,
        api_base: str | Callable[[], str] | None = None,
        search_settle_s: float = 60.0,
        events_settle_s: float = 5.0,
        events_retention_s: float = 30 * DAY,
        page_limit: int = 100,
        max_pages: int = 20,
        skew_s: float = 5.0,
    ) -> None:
        self._api_key = api_key
        self._api_base = api_base
        self.search = Method("Stripe Search", search_settle_s, 10 * 365 * DAY, skew_s)
        self.events = Method("Stripe Events", events_settle_s, events_retention_s, skew_s)
        self.page_limit = page_limit
        self.max_pages = max_pages
        self._client: stripe.StripeClient | None = None

    def client(self) -> stripe.StripeClient:
        if self._client is None:
            import stripe

            key = setting(self._api_key)
            base = setting(self._api_base)
            # No SDK retries: a retried POST after a lost response is effectq's decision
            # (the reconciler asks), not the transport's.
            self._client = stripe.StripeClient(
                key,
                base_addresses={"api": base} if base else None,
                max_network_retries=0,
            )
        return self._client

    def provider_key(self, idempotency_key: str) -> str:
        return provider_key(idempotency_key, max_len=MAX_KEY)

    # -- execute ----------------------------------------------------------------------

    def execute(self, call: CallLike, *, amount: int, currency: str, **params: Any) -> Executed:
        """Create (and, with ``confirm=True`` in ``params``, confirm) a PaymentIntent."""
        import stripe

        body: dict[str, Any] = {
            **params,
            "amount": amount,
            "currency": currency,
            "metadata": {**params.get("metadata", {}), METADATA_KEY: call.idempotency_key},
        }
        try:
            intent = self.client().v1.payment_intents.create(
                body,  # type: ignore[arg-type]
                {"idempotency_key": self.provider_key(call.idempotency_key)},
            )
        except stripe.IdempotencyError as exc:
            raise ConflictError(
                "stripe: the idempotency key was used with other parameters", key=call.key
            ) from exc
        except stripe.RateLimitError as exc:
            raise NotExecutedError("stripe: rate limited (429)", key=call.key) from exc
        except (
            stripe.CardError,
            stripe.InvalidRequestError,
            stripe.AuthenticationError,
            stripe.PermissionError,
        ) as exc:
            raise RejectedError(
                f"stripe: {type(exc).__name__} {exc.http_status} {exc.code or ''}".strip(),
                key=call.key,
            ) from exc
        receipt = _receipt(intent.to_dict())
        response = intent.last_response
        return Executed(receipt, response.body if response is not None else None)

    # -- lookup -----------------------------------------------------------------------

    def lookup(self, idempotency_key: str, token: int | None = None) -> LookupResult:
        """Key-only: no claim time to measure a window on, so never NotFound."""
        return Unavailable("the Stripe adapter reads the effect (lookup_effect)")

    def lookup_effect(self, effect: LookupContext) -> LookupResult:
        import stripe

        try:
            return _checked(effect, combine(self._methods(effect)))
        except stripe.StripeError as exc:
            return Unavailable(f"stripe: {type(exc).__name__} {exc.http_status}")

    def _methods(self, effect: LookupContext) -> Iterator[LookupResult]:
        if evidence(effect):
            yield self._by_id(effect)
        # Both are asked inside their settle windows too: they may find the intent; only
        # their "not found" waits for the window (``judge``).
        yield self._by_search(effect)
        yield self._by_events(effect)

    def _by_id(self, effect: LookupContext) -> LookupResult:
        import stripe

        for object_id in reversed(evidence(effect)):
            try:
                intent = self.client().v1.payment_intents.retrieve(object_id).to_dict()
            except stripe.InvalidRequestError:
                continue
            if intent.get("metadata", {}).get(METADATA_KEY) == effect.idempotency_key:
                return _found(intent)
        # Ids are evidence of a call, never of its absence.
        return Unavailable("no recorded object id is an intent under this key")

    def _by_search(self, effect: LookupContext) -> LookupResult:
        import stripe

        query = f"metadata['{METADATA_KEY}']:'{effect.idempotency_key}'"

        def fetch(cursor: Any) -> Page[dict[str, Any]]:
            params: dict[str, Any] = {"query": query, "limit": self.page_limit}
            if cursor:
                params["page"] = cursor
            try:
                found = self.client().v1.payment_intents.search(params)  # type: ignore[arg-type]
            except stripe.RateLimitError as exc:
                raise RateLimited("Stripe Search 429") from exc
            items = [i.to_dict() for i in found.data]
            return Page(items, found.next_page if found.has_more else None)

        result = scan(
            fetch,
            lambda i: i.get("metadata", {}).get(METADATA_KEY) == effect.idempotency_key,
            max_pages=self.max_pages,
        )
        return judge(self.search, effect, result, _found)

    def _by_events(self, effect: LookupContext) -> LookupResult:
        import stripe

        wanted = self.provider_key(effect.idempotency_key)
        since = int((effect.claimed_ms / 1000) - self.events.skew_s)

        def fetch(cursor: Any) -> Page[dict[str, Any]]:
            params: dict[str, Any] = {
                "type": "payment_intent.created",
                "created": {"gte": since},
                "limit": self.page_limit,
            }
            if cursor:
                params["starting_after"] = cursor
            try:
                listed = self.client().v1.events.list(params)  # type: ignore[arg-type]
            except stripe.RateLimitError as exc:
                raise RateLimited("Stripe Events 429") from exc
            items = [e.to_dict() for e in listed.data]
            more = listed.has_more and items
            return Page(items, items[-1]["id"] if more else None)

        result = scan(
            fetch,
            lambda e: (e.get("request") or {}).get("idempotency_key") == wanted,
            max_pages=self.max_pages,
        )
        return judge(self.events, effect, result, lambda e: _found(e["data"]["object"]))


def _found(intent: Mapping[str, Any]) -> Found:
    return Found(_receipt(intent), json.dumps(intent, sort_keys=True))


def _checked(effect: LookupContext, result: LookupResult) -> LookupResult:
    """Our key on another payload is neither DONE with that receipt nor "not executed"."""
    if not isinstance(result, Found) or result.raw is None:
        return result
    if differs := _differs(json.loads(result.raw), effect.args):
        return Unavailable(f"found under this key with another {differs}")
    return result


def _receipt(intent: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "provider": "stripe",
        EVIDENCE: intent.get("id"),
        "status": intent.get("status"),
        "amount": intent.get("amount"),
        "currency": intent.get("currency"),
        "created": intent.get("created"),
    }


def _differs(intent: Mapping[str, Any], args: Mapping[str, Any]) -> str | None:
    """The first effect-bearing value the found intent does not carry (amount, currency)."""
    for name in ("amount", "currency"):
        if name in args and str(intent.get(name)).lower() != str(args[name]).lower():
            return name
    return None
