"""Twilio's dates have whole seconds: a text sent in the same second as its claim, after it,
reads as created before the claim. The scan's window starts at the whole second, so such a
text is found, never ruled out (the contract suite caught the FAILED this once gave)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from dedupe.spec import Found, LookupContext
from reconciler.providers.twilio_sms import TwilioSms
from tests.providers.fakes.http import serving
from tests.providers.fakes.twilio_fake import TwilioFake

KEY = "cd" * 32
ARGS = {"to": "+15005550006", "sender": "+15005550001", "body": "Your code is 4242"}


def test_a_text_sent_in_the_claims_second_is_found() -> None:
    fake = TwilioFake()
    with serving(fake) as url:
        adapter = TwilioSms(
            "AC" + "0" * 32, "auth-token", api_base=url, skew_s=0.5, settle_s=1.0,
            status_callback="https://hooks.example.com/twilio/status",
        )  # fmt: skip
        adapter.execute(SimpleNamespace(key=KEY, idempotency_key=KEY), **ARGS)
        created_s = fake.messages[0]["_at"]
        # The claim came 0.9 s into that second (0.4 s past the skew): the text's date,
        # cut to the second, is before the claim less the skew.
        claimed_ms = int(created_s) * 1000 + 900
        now_ms = int(time.time() * 1000) + 5_000
        found = adapter.lookup_effect(LookupContext(
            key=KEY, idempotency_key=KEY, token=2, tool="sms", generation=0,
            claimed_ms=claimed_ms, now_ms=now_ms, args=ARGS,
        ))  # fmt: skip
    assert isinstance(found, Found), found
