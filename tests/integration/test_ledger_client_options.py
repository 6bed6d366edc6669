"""A client that cannot carry the ledger is refused when the ledger is made, not after a
claim it was granted: the script's replies are UTF-8 text, read as such.

A URL's query options reach redis-py's client (``?encoding=latin-1``), as do
``from_url``'s keyword arguments and a client handed to ``Ledger``. Without decoded
replies the first claim was acquired on the server and then failed to parse on the client
(a ValueError, retried against its own claim: in_flight until the reconciler); with
another codec a non-ASCII receipt or request came back altered."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis

from dedupe import ClaimOutcome, Ledger, LedgerConfigError, LedgerError
from tests.support.ledgers import RETENTION_S, charge
from workers.dev.redis_server import RedisServer


def _namespace() -> str:
    return f"opt{uuid.uuid4().hex[:10]}"


@pytest.mark.parametrize(
    "query",
    [
        "encoding=latin-1",
        "encoding=utf-16",
        "encoding=cp1252",
        "encoding_errors=replace",
        "encoding_errors=ignore",
    ],
)
def test_a_ledger_url_whose_client_would_not_read_utf8_replies_is_refused(
    shared_redis_server: RedisServer, query: str
) -> None:
    url = f"{shared_redis_server.url}?{query}"
    with pytest.raises(LedgerConfigError) as refused:
        Ledger.from_url(url, namespace=_namespace(), allow_volatile=True)
    value = query.split("=", 1)[1]
    assert value not in refused.value.message  # what it refuses is named, not echoed
    assert "UTF-8" in refused.value.message


@pytest.mark.parametrize(
    "options",
    [{"decode_responses": False}, {"encoding": "latin-1"}, {"encoding_errors": "replace"}],
)
def test_from_url_options_that_would_not_read_utf8_replies_are_refused(
    shared_redis_server: RedisServer, options: dict[str, Any]
) -> None:
    with pytest.raises(LedgerConfigError):
        Ledger.from_url(
            shared_redis_server.url, namespace=_namespace(), allow_volatile=True, **options
        )


def test_a_client_without_decoded_replies_is_refused_before_any_call(
    shared_redis_server: RedisServer,
) -> None:
    client = redis.Redis(port=shared_redis_server.port)
    namespace = _namespace()
    with pytest.raises(LedgerConfigError) as refused:
        Ledger(client, namespace=namespace, allow_volatile=True)
    assert isinstance(refused.value, LedgerError)
    assert not list(shared_redis_server.client().scan_iter(match=f"{{{namespace}:*"))


@pytest.mark.parametrize(
    "query",
    [
        "",
        "?decode_responses=True",
        # redis-py passes a URL's value as a string, and any non-empty one decodes
        "?decode_responses=False",
        "?encoding=UTF8",
        "?encoding=utf_8&encoding_errors=strict",
    ],
)
def test_spellings_of_utf8_are_accepted_and_round_trip_non_ascii_text(
    shared_redis_server: RedisServer, query: str
) -> None:
    ledger = Ledger.from_url(
        f"{shared_redis_server.url}{query}", namespace=_namespace(), allow_volatile=True
    )
    effect = charge(customer="cus_Zoë")
    claim = ledger.claim(effect, lease_s=30, holder="opt/1")
    assert claim.acquired
    claimed = ledger.get(effect.key)  # the request is kept until the record settles DONE
    assert claimed is not None and claimed.request is not None
    assert claimed.request["args"]["customer"] == "cus_Zoë"
    receipt = {"id": "ch_1", "note": "Straße · 東京 · 🙂"}
    assert ledger.commit(effect.key, claim.token, receipt, retention_s=RETENTION_S).ok
    again = ledger.claim(effect, lease_s=30, holder="opt/2")
    assert again.outcome is ClaimOutcome.DUPLICATE and again.receipt == receipt
    record = ledger.get(effect.key)
    assert record is not None and record.receipt == receipt


@pytest.mark.parametrize(
    "options",
    [
        {"buckets": 0},
        {"buckets": 16385},
        {"namespace": ""},
        {"namespace": "a:b"},
        {"namespace": "{x}"},
        {"wait_replicas": -1},
        {"wait_replicas": 1, "wait_timeout_ms": 0},  # WAIT 1 0 blocks until a replica answers
        {"max_request_bytes": 0},
        {"max_receipt_bytes": -5},
        {"max_raw_bytes": 2**24},
    ],
)
def test_ledger_options_that_cannot_work_are_refused_when_it_is_made(
    shared_redis_server: RedisServer, options: dict[str, Any]
) -> None:
    client = redis.Redis(port=shared_redis_server.port, decode_responses=True)
    with pytest.raises(LedgerConfigError) as refused:
        Ledger(client, allow_volatile=True, **options)
    assert isinstance(refused.value, ValueError)  # as a bad argument was before
