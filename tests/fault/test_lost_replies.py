"""Replies lost on the wire after the ledger's Redis ran the call.

A proxy in front of a real redis-server passes the call and drops its answer, so the client
times out while the transition has happened. The ledger decides what is sent again
(``_REPEATABLE`` in dedupe/ledger.py), not the Redis client's own retry: a claim, a takeover
or an operator action is sent once and its caller hears "unavailable" (the outcome is
unknown); a commit is sent once more and its repeat answers ok. The server's command counts
say how many times each call ran.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import redis

from dedupe import ClaimOutcome, Ledger, LedgerUnavailableError, State, SubmitStatus
from tests.support.ledgers import RETENTION_S, charge, poll, script_calls
from tests.support.proxy import ReplyLosingProxy, reply_losing_proxy
from workers.dev.redis_server import RedisServer

TIMEOUT_S = 0.3
Through = Callable[[ReplyLosingProxy], Ledger]


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[ReplyLosingProxy]:
    with reply_losing_proxy(redis_server.port) as proxy:
        yield proxy


@pytest.fixture(params=["from_url", "own_client"])
def through(request: pytest.FixtureRequest) -> Through:
    """The ledger through the proxy: built from a URL, or handed a client its caller built
    (redis-py's constructor gives a client that resends on a timeout by default)."""

    def build(proxy: ReplyLosingProxy) -> Ledger:
        if request.param == "from_url":
            ledger = Ledger.from_url(proxy.url, namespace="lost", socket_timeout=TIMEOUT_S)
        else:
            client = redis.Redis(port=proxy.port, socket_timeout=TIMEOUT_S, decode_responses=True)
            ledger = Ledger(client, namespace="lost")
        # Connected (the connection this thread's calls go on), script or library loaded.
        assert ledger.claim(charge(), lease_s=60, holder="warm-up").acquired
        return ledger

    return build


def direct(server: RedisServer) -> Ledger:
    return Ledger.from_url(server.url, namespace="lost")


def lost_claim(ledger: Ledger, server: RedisServer) -> Callable[[], object]:
    effect = charge("order-lost-claim")

    def call() -> object:
        return ledger.claim(effect, lease_s=60, holder="w/1")

    return call


def lost_takeover(ledger: Ledger, server: RedisServer) -> Callable[[], object]:
    effect = charge("order-lost-takeover")
    owner = direct(server)
    assert owner.claim(effect, lease_s=0.05, holder="dead/1").acquired
    poll(lambda: owner.expired(), lambda keys: effect.key in keys)

    def call() -> object:
        return ledger.takeover(effect.key, lease_s=60, holder="reconciler/1")

    return call


def lost_revoke(ledger: Ledger, server: RedisServer) -> Callable[[], object]:
    effect = charge("order-lost-revoke")
    owner = direct(server)
    claim = owner.claim(effect, lease_s=60, holder="w/1")
    assert owner.commit(effect.key, claim.token, {"id": "ch_1"}, retention_s=RETENTION_S).ok

    def call() -> object:
        return ledger.operate(effect.key, "revoke", note="op: refund", retention_s=RETENTION_S)

    return call


@pytest.mark.parametrize("make", [lost_claim, lost_takeover, lost_revoke], ids=lambda f: f.__name__)
def test_a_fenced_call_whose_reply_is_lost_runs_once_and_reports_unavailable(
    redis_server: RedisServer,
    proxy: ReplyLosingProxy,
    through: Through,
    make: Callable[..., Callable[[], object]],
) -> None:
    ledger = through(proxy)
    call = make(ledger, redis_server)
    before = script_calls(redis_server.client())
    proxy.lose_replies(on_new_connections=True)
    started = time.monotonic()
    with pytest.raises(LedgerUnavailableError):
        call()
    elapsed = time.monotonic() - started
    # Sent once: a repeat would answer in_flight against its own claim, "lease live" against
    # its own takeover, or "refused" to the operator whose revoke took effect.
    assert script_calls(redis_server.client()) - before == 1
    assert elapsed < 3 * TIMEOUT_S, f"the caller waited {elapsed:.2f}s: something resent it"


def test_a_claim_whose_reply_was_lost_is_in_flight_to_its_next_attempt(
    redis_server: RedisServer, proxy: ReplyLosingProxy, through: Through
) -> None:
    ledger = through(proxy)
    effect = charge("order-lost-then-retried")
    proxy.lose_replies(on_new_connections=True)
    with pytest.raises(LedgerUnavailableError):
        ledger.claim(effect, lease_s=60, holder="w/1")
    proxy.hear_replies()
    record = direct(redis_server).get(effect.key)
    assert record is not None and record.state is State.CLAIMED and record.holder == "w/1"
    # Fail closed: the message's next attempt waits for the lease and the reconciler.
    assert ledger.claim(effect, lease_s=60, holder="w/1").outcome is ClaimOutcome.IN_FLIGHT


def test_a_commit_whose_reply_is_lost_is_sent_once_more_and_answers_ok(
    redis_server: RedisServer, proxy: ReplyLosingProxy, through: Through
) -> None:
    ledger = through(proxy)
    effect = charge("order-lost-commit")
    claim = ledger.claim(effect, lease_s=60, holder="w/1")
    before = script_calls(redis_server.client())
    proxy.lose_replies(on_new_connections=False)  # this connection's reply; the resend is heard
    write = ledger.commit(effect.key, claim.token, {"id": "ch_9"}, retention_s=RETENTION_S)
    assert write.ok and not write.fenced
    assert script_calls(redis_server.client()) - before == 2
    record = direct(redis_server).get(effect.key)
    assert record is not None and record.state is State.DONE and record.receipt == {"id": "ch_9"}
    assert [t.state for t in record.history].count("DONE") == 1


def test_a_submit_whose_reply_was_lost_is_enqueued_by_the_next_submission(
    redis_server: RedisServer, proxy: ReplyLosingProxy, through: Through
) -> None:
    """The lost submit left a reservation that no message stands for: its producer heard
    "unavailable" and submits again under a new message id. "pending" then would be a promise
    nobody keeps (the chaos run's lost effect); the submission is enqueued, and only a marker
    the broker's acceptance confirmed answers pending."""
    ledger = through(proxy)
    effect = charge("order-lost-submit")
    proxy.lose_replies(on_new_connections=True)
    with pytest.raises(LedgerUnavailableError):
        ledger.submit(effect, message_id="m-1", pending_s=60)
    proxy.hear_replies()
    assert direct(redis_server).has_pending(effect.key)  # the reservation is there
    again = ledger.submit(effect, message_id="m-2", pending_s=60)
    assert again.status is SubmitStatus.ENQUEUE
    ledger.confirm_pending([(effect, "m-2")], 3600)  # the broker took m-2
    assert ledger.submit(effect, message_id="m-3", pending_s=60).status is SubmitStatus.PENDING
