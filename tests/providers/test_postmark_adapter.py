"""Postmark takes no idempotency key: a 500 after the send is uncertain (never "not
executed", which would send a second email), and the metadata search finds the message."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from dedupe import NotExecutedError, RejectedError
from dedupe.spec import Found, LookupContext
from reconciler.providers.postmark_email import PostmarkEmail
from tests.providers.fakes.http import serving
from tests.providers.fakes.postmark_fake import PostmarkFake

KEY = "ef" * 32
ARGS = {"sender": "shop@example.com", "to": "buyer@example.com", "subject": "Receipt",
        "text": "Thanks"}  # fmt: skip


def test_a_500_after_the_send_is_uncertain_and_the_search_finds_the_message() -> None:
    fake = PostmarkFake()
    with serving(fake) as url:
        adapter = PostmarkEmail("server-token", api_base=url + "/", settle_s=1.0, skew_s=0.5)
        fake.fail_500_after_send = True
        with pytest.raises(Exception) as raised:
            adapter.execute(SimpleNamespace(key=KEY, idempotency_key=KEY), **ARGS)
        assert not isinstance(raised.value, NotExecutedError)
        now_ms = int(time.time() * 1000)
        found = adapter.lookup_effect(LookupContext(
            key=KEY, idempotency_key=KEY, token=2, tool="mail", generation=0,
            claimed_ms=now_ms - 100, now_ms=now_ms, args=ARGS,
        ))  # fmt: skip
    assert isinstance(found, Found), found
    assert found.receipt["provider_object_id"] == fake.messages[0]["MessageID"]
    assert fake.executions[KEY] == 1


def test_a_refused_send_is_rejected() -> None:
    fake = PostmarkFake()
    with serving(fake) as url:
        adapter = PostmarkEmail("server-token", api_base=url + "/")
        with pytest.raises(RejectedError):
            adapter.execute(SimpleNamespace(key=KEY, idempotency_key=KEY), **{**ARGS, "to": ""})
    assert fake.executions[KEY] == 0
