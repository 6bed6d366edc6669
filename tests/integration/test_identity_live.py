"""Normalization serves identity only, end to end (issue 15, items 3 and 4): real worker
processes, the real ledger on redis-server, the sandbox provider over HTTP, which records
the body it was sent — so what the tool body received is read at the provider."""

from __future__ import annotations

from workers import Status, submit
from workers.dev.local import LocalStack

LONG = "12345678901.123456789012345678"  # 29 significant digits


def test_mail_reaches_the_provider_addressed_as_submitted_and_money_unrounded(
    live: LocalStack,
) -> None:
    live.start_workers(processes=1, threads=2)
    mail = submit("send_email", scope="evt-strasse", recipient=" Stra\u00dfe@example.de ")
    charge = submit("charge", scope="order-long", customer=" Cus_7 ", amount=LONG, currency="usd")
    assert (mail.status, charge.status) == (Status.ENQUEUED, Status.ENQUEUED)
    assert mail.wait(60)["body"]["to"] == "Stra\u00dfe@example.de"
    body = charge.wait(60)["body"]
    assert (body["customer"], body["amount"], body["currency"]) == ("Cus_7", LONG, "usd")
    # Spellings of one mailbox are one effect (a duplicate, not a second mail) ...
    again = submit("send_email", scope="evt-strasse", recipient="STRASSE@EXAMPLE.DE")
    assert again.status is Status.DONE and again.key == mail.key
    # ... and an amount differing in its last digit is a conflict, never the stored receipt.
    changed = submit("charge", scope="order-long", customer="Cus_7", amount=LONG[:-1] + "9",
                     currency="usd")  # fmt: skip
    assert changed.status is Status.CONFLICT
    assert live.stats()["total"] == 2
