"""Each thread's ledger calls go on a connection of its own (dedupe/script.py): replies
never cross between threads or between a process and its forked child, and a connection
the server closed is reopened before the next call, not failed on it."""

from __future__ import annotations

import os
import threading

import pytest

from dedupe import ClaimOutcome, Ledger, State
from tests.support.ledgers import RETENTION_S, charge, poll
from workers.dev.redis_server import RedisServer


def test_threads_calling_at_once_each_hear_their_own_replies(redis_server: RedisServer) -> None:
    ledger = Ledger.from_url(redis_server.url, namespace="threads")
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(150):
                effect = charge(f"t{n}-{i}", amount=f"{n}.{i:02d}")
                claim = ledger.claim(effect, lease_s=30, holder=f"w/{n}")
                assert claim.acquired and claim.key == effect.key
                receipt = {"id": f"{n}-{i}"}
                assert ledger.commit(effect.key, claim.token, receipt, retention_s=RETENTION_S).ok
                again = ledger.claim(effect, lease_s=30, holder=f"w/{n}")
                assert again.outcome is ClaimOutcome.DUPLICATE and again.receipt == receipt
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors[0]
    clients = redis_server.client().client_list()
    assert len(clients) <= 6 + 4  # one per calling thread, the pool's few, this one


def test_a_forked_child_calls_on_a_connection_of_its_own(redis_server: RedisServer) -> None:
    ledger = Ledger.from_url(redis_server.url, namespace="fork")
    before = charge("before-fork")
    assert ledger.claim(before, lease_s=30, holder="parent").acquired  # the parent's connection
    child_effect = charge("in-child")
    pid = os.fork()
    if pid == 0:  # the child: claim and commit, then leave without running pytest's teardown
        code = 1
        try:
            claim = ledger.claim(child_effect, lease_s=30, holder="child")
            done = ledger.commit(child_effect.key, claim.token, {"id": "child"}, retention_s=60)
            code = 0 if claim.acquired and done.ok else 1
        finally:
            os._exit(code)
    # The parent calls at the same time, on its own connection.
    for i in range(50):
        assert ledger.claim(charge(f"parent-{i}"), lease_s=30, holder="parent").acquired
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    record = ledger.get(child_effect.key)
    assert record is not None and record.state is State.DONE and record.receipt == {"id": "child"}


def test_a_call_after_the_server_restarted_reconnects_instead_of_failing(
    redis_server: RedisServer,
) -> None:
    ledger = Ledger.from_url(redis_server.url, namespace="restart")
    assert ledger.claim(charge("before-restart"), lease_s=30, holder="w/1").acquired
    redis_server.kill()
    redis_server.start()  # AOF: the claim is still there; this thread's connection is not
    poll(lambda: redis_server.client().ping(), bool)
    effect = charge("after-restart")
    assert ledger.claim(effect, lease_s=30, holder="w/1").acquired
    assert ledger.claim(charge("before-restart"), lease_s=30, holder="w/2").outcome is (
        ClaimOutcome.IN_FLIGHT
    )


class Interrupted(BaseException):
    """What Dramatiq raises into a worker thread (TimeLimitExceeded, Shutdown)."""


def test_a_call_interrupted_between_send_and_reply_never_answers_the_next_one(
    redis_server: RedisServer,
) -> None:
    ledger = Ledger.from_url(redis_server.url, namespace="interrupt")
    first, second = charge("interrupted"), charge("next-call")
    assert ledger.claim(charge("warm-up"), lease_s=30, holder="w/1").acquired
    conn = ledger._script._held.conn  # this thread's connection
    read = conn.read_response

    def interrupted(*args: object, **kwargs: object) -> object:
        conn.read_response = read  # once: the exception lands after the send
        raise Interrupted

    conn.read_response = interrupted
    with pytest.raises(Interrupted):
        ledger.claim(first, lease_s=30, holder="w/1")
    assert conn._sock is None  # closed: a reply still on its way is never read
    # The first claim ran and its reply is on the wire; the next call hears its own.
    claim = ledger.claim(second, lease_s=30, holder="w/1")
    assert claim.key == second.key and claim.acquired and claim.token == 1
    again = ledger.claim(first, lease_s=30, holder="w/1")
    assert again.outcome is ClaimOutcome.IN_FLIGHT
