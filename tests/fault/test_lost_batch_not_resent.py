"""A batch of the threads' ledger calls (``dedupe.combiner``) whose replies are lost is a
connection error to every call in it, never written again by the combiner — even though a
new connection would be heard: which call may go again is the ledger's decision
(``_REPEATABLE``), and a claim is not one of them. Counted on the server: the claims it ran.

The proxy loses the replies of the connections open when the threads start and forwards
everything on any connection opened after, so a batch re-sent on a new connection would
run (the lost-batch test in test_combined_calls loses new connections' replies too, where
a re-send fails at its handshake and is never seen)."""

from __future__ import annotations

import threading
import uuid

from dedupe import ClaimOutcome, Ledger, LedgerUnavailableError
from tests.support.ledgers import charge, script_calls
from tests.support.proxy import reply_losing_proxy
from workers.dev.redis_server import RedisServer

THREADS = 12
TIMEOUT_S = 0.3
JOIN_S = 30.0


def test_a_lost_batch_is_not_sent_again_on_a_new_connection(redis_server: RedisServer) -> None:
    direct = redis_server.client()
    with reply_losing_proxy(redis_server.port) as proxy:
        namespace = f"resend{uuid.uuid4().hex[:8]}"
        ledger = Ledger.from_url(proxy.url, namespace=namespace, socket_timeout=TIMEOUT_S)
        effects = [charge(f"order-resend-{i}") for i in range(THREADS)]
        errors: list[BaseException] = []
        answers: list[ClaimOutcome] = []
        alone = threading.Lock()
        ready, go = threading.Barrier(THREADS + 1), threading.Barrier(THREADS + 1)

        def run(i: int) -> None:
            with alone:  # each thread's own connection open, written alone
                ledger.get(effects[i].key)
            ready.wait(JOIN_S)
            go.wait(JOIN_S)
            try:
                answers.append(ledger.claim(effects[i], lease_s=60, holder=f"w/{i}").outcome)
            except BaseException as exc:  # collected for the assertions
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(THREADS)]
        for t in threads:
            t.start()
        ready.wait(JOIN_S)
        before = script_calls(direct)
        proxy.lose_replies(on_new_connections=False)
        go.wait(JOIN_S)
        for t in threads:
            t.join(JOIN_S)
            assert not t.is_alive(), "a ledger call never returned"
        ran = script_calls(direct) - before

        # Every claim reached the server once, and was heard of by nobody.
        assert ran == THREADS, f"the server ran {ran} scripts for {THREADS} claims"
        assert answers == [], f"a claim was answered though its reply was lost: {answers}"
        assert len(errors) == THREADS
        assert all(isinstance(e, LedgerUnavailableError) for e in errors), errors
        # The server was reachable on a new connection all along.
        record = ledger.get(effects[0].key)
        assert record is not None and record.holder == "w/0"
