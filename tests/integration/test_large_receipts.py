"""Receipts, raw responses, requests and late receipts past 64 KB, up to the packed record's
bound (a three-byte length: 2**24 - 1 bytes), survive every write and read of the record, on
both binaries: a length field one byte too narrow would wrap at 65,535 and every later read
of the record would fail or answer another value."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from dedupe import ClaimOutcome, Effect, Ledger, State, ToolSpec, derive
from tests.support.ledgers import RETENTION_S, fresh_ledger
from workers.dev.redis_server import RedisServer

BOUND = 2**24 - 1  # the largest text a packed record holds (Ledger's own bound)
SPEC = ToolSpec(name="report", identity=("account",), bound=("account",), free=("body",))


@pytest.fixture(scope="module")
def server(redis_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(redis_binary, tmp_path_factory.mktemp("large")) as srv:
        yield srv


def _receipt(size: int, tag: str) -> dict[str, Any]:
    """A receipt whose compact JSON text (as the ledger stores it) is ``size`` bytes."""
    receipt = {"id": tag, "pad": ""}
    base = len(json.dumps(receipt, separators=(",", ":")))
    receipt["pad"] = "r" * (size - base)
    return receipt


def _raw(size: int, tag: str) -> str:
    """A raw response that is not the receipt's text (stored beside it), ``size`` bytes."""
    head = f"HTTP/1.1 201 {tag}\n"
    return head + "w" * (size - len(head))


def _effect(request_size: int) -> Effect:
    # Free content (in the stored request, not in the key or fingerprint) sizes the request.
    return derive(SPEC, "job-1", {"account": "acc_1", "body": "b" * request_size})


def _ledger(server: RedisServer) -> Ledger:
    return fresh_ledger(
        server.url, max_request_bytes=BOUND, max_receipt_bytes=BOUND, max_raw_bytes=BOUND
    )


@pytest.mark.parametrize(
    "size",
    [70_000, 65_536, BOUND],
    ids=["70KB", "64KiB", "bound"],
)
def test_large_texts_survive_commit_duplicate_revoke_and_late_receipts(
    server: RedisServer, size: int
) -> None:
    ledger = _ledger(server)
    small = size == BOUND  # one 16 MB text per record at the bound keeps the test quick
    effect = _effect(1_000 if small else 60_000)  # a free field is bounded at 64 KiB
    request = ledger.request_text(effect)

    first = ledger.claim(effect, lease_s=30, holder="w/1")
    assert first.acquired
    claimed = ledger.get(effect.key)
    assert claimed is not None
    assert json.dumps(claimed.request, separators=(",", ":"), sort_keys=True) == request
    receipt, raw = _receipt(size, "rcpt_1"), _raw(1_000 if small else size, "rcpt_1")
    assert ledger.commit(effect.key, first.token, receipt, raw=raw, retention_s=RETENTION_S).ok

    record = ledger.get(effect.key)
    assert record is not None and record.state is State.DONE
    assert (record.receipt, record.raw_response) == (receipt, raw)
    assert record.request is None  # a DONE record keeps no request
    # Every later reader of the DONE record: a duplicate claim, a repeated submission.
    duplicate = ledger.claim(effect, lease_s=30, holder="w/2")
    assert (duplicate.outcome, duplicate.receipt) == (ClaimOutcome.DUPLICATE, receipt)
    submission = ledger.submit(effect, message_id="m-2", pending_s=60)
    assert (submission.status.value, submission.receipt) == ("done", receipt)

    ledger.operate(effect.key, "revoke", note="refunded", retention_s=RETENTION_S)
    record = ledger.get(effect.key)
    assert record is not None and (record.state, record.receipt) == (State.REVOKED, receipt)

    # The next generation: the old holder's commit lands late, with a large receipt too.
    second = ledger.claim(effect, lease_s=30, holder="w/3", generation=1)
    assert second.acquired and second.generation == 1
    late = _receipt(70_000 if small else size, "rcpt_late")  # see the test below
    assert ledger.commit(effect.key, first.token, late, retention_s=RETENTION_S).fenced
    assert ledger.heartbeat(effect.key, second.token, lease_s=30).ok
    record = ledger.get(effect.key)
    assert record is not None and record.state is State.CLAIMED
    assert [lr["receipt"] for lr in record.late_receipts] == [late]
    assert json.dumps(record.request, separators=(",", ":"), sort_keys=True) == request

    final = _receipt(size, "rcpt_2")
    assert ledger.commit(effect.key, second.token, final, retention_s=RETENTION_S).ok
    record = ledger.get(effect.key)
    assert record is not None and (record.state, record.generation) == (State.DONE, 1)
    assert record.receipt == final and record.raw_response == json.dumps(
        final, separators=(",", ":"), sort_keys=True
    )
    assert [lr["receipt"] for lr in record.late_receipts] == [late]


def test_a_late_receipt_at_the_receipt_bound_keeps_the_record_readable(
    server: RedisServer,
) -> None:
    ledger = _ledger(server)
    effect = _effect(1_000)
    first = ledger.claim(effect, lease_s=30, holder="w/1")
    assert ledger.commit(effect.key, first.token, {"id": "rcpt_1"}, retention_s=RETENTION_S).ok
    late = _receipt(BOUND, "rcpt_late")
    assert ledger.commit(effect.key, first.token + 1, late, retention_s=RETENTION_S).fenced
    record = ledger.get(effect.key)
    # The late receipts' total length is three bytes: one that cannot fit even alone is
    # kept as its size — the evidence is that it came.
    assert record is not None
    assert [lr["receipt"] for lr in record.late_receipts] == [{"effectq_late_receipt_bytes": BOUND}]
    # Eight of 3 MB: the oldest go until the list fits; the record still reads.
    big = [_receipt(3 * 1024 * 1024, f"rcpt_{i}") for i in range(8)]
    for i, receipt in enumerate(big):
        assert ledger.commit(
            effect.key, first.token + 2 + i, receipt, retention_s=RETENTION_S
        ).fenced
    record = ledger.get(effect.key)
    assert record is not None and record.state is State.DONE
    kept = [lr["receipt"] for lr in record.late_receipts]
    assert 1 <= len(kept) <= 5 and kept == big[-len(kept) :]
