"""Hostile input at the HTTP API: a malformed key on every route that takes one, money past
its bounds, huge integers, NaN — each answered with a 4xx Problem body that never echoes the
value, never a 500 (issue 15, items 3 and 11). Real stack, as the other API tests."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.conftest import ROLES, Api
from tests.support.stack import broker_messages
from workers.dev.local import LocalStack

CARD = "4111111111111111111"
# Path segments that are not effect keys; one is a recipient pasted by mistake.
BAD_KEYS = [
    "not-a-key", "A" * 64, "0" * 63, "0" * 65, "g" * 64, "0" * 63 + "%0A", "%00" + "0" * 61,
    "bob%40example.com", "0" * 63 + "%C3%A9", "..%2F" + "0" * 60, CARD,
]  # fmt: skip
KEY_ROUTES = [
    ("GET", "/v1/effects/{}", None),
    ("POST", "/v1/effects/{}/resolve", {"executed": False, "reason": "checked"}),
    ("POST", "/v1/effects/{}/revoke", {"reason": "refunded"}),
    ("POST", "/v1/effects/{}/supersede", {"reason": "replaced"}),
    ("POST", "/v1/effects/{}/replay", {"reason": "again"}),
]


def _no_echo(response: httpx.Response, *values: str) -> None:
    assert response.status_code < 500, response.text
    for value in values:
        assert value not in response.text, response.text


@pytest.mark.parametrize(("method", "path", "body"), KEY_ROUTES)
def test_a_malformed_key_on_every_key_route_is_a_4xx_that_never_echoes_it(
    client: httpx.Client, method: str, path: str, body: dict[str, Any] | None
) -> None:
    for key in BAD_KEYS:
        response = client.request(method, path.format(key), json=body)
        assert 400 <= response.status_code < 500, (key, response.status_code, response.text)
        assert response.json()["error"] in ("invalid", "not_found")
        _no_echo(response, "bob@example.com", CARD)


def test_a_malformed_key_in_the_console_is_a_4xx_page(api: Api, live: LocalStack) -> None:
    with httpx.Client(base_url=api.url, timeout=60) as browser:
        login = browser.post("/console/login", data={"token": ROLES["root"][0]})
        assert login.status_code == 303
        cookie = login.headers["set-cookie"].split(";")[0]
        for key in BAD_KEYS:
            page = browser.get(f"/console/effects/{key}", headers={"cookie": cookie})
            assert 400 <= page.status_code < 500, (key, page.status_code)
            _no_echo(page, "bob@example.com", CARD)


def _charge(amount: Any) -> dict[str, Any]:
    return {
        "tool": "charge",
        "scope": "order-hostile",
        "args": {"customer": "cus_7", "amount": amount, "currency": "usd"},
    }


@pytest.mark.parametrize(
    "amount",
    ["1e1000000", "-1e-1000000", "1" + "0" * 80, "9" * 65, "0." + "0" * 70 + "1", "NaN",
     "sNaN", "Infinity", "1e" + "9" * 200, 10**70, 1.5, "\u0661\u0660", "1_000"],
    ids=lambda v: str(v)[:16],
)  # fmt: skip
def test_money_past_its_bounds_is_a_422_naming_the_field_never_the_amount(
    client: httpx.Client, live: LocalStack, amount: Any
) -> None:
    response = client.post("/v1/tool-calls", json=_charge(amount))
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid" and "charge.amount" in response.json()["message"]
    _no_echo(response, str(amount)[:12] if len(str(amount)) > 4 else "\u0000")
    assert broker_messages(live)["live"] == 0


def test_exact_money_past_28_digits_is_submitted_and_a_changed_last_digit_conflicts(
    client: httpx.Client,
) -> None:
    first = client.post("/v1/tool-calls", json=_charge("12345678901.123456789012345678"))
    assert first.status_code == 202, first.text
    again = client.post("/v1/tool-calls", json=_charge("12345678901.1234567890123456780"))
    assert again.status_code == 202 and again.json()["status"] == "pending"
    changed = client.post("/v1/tool-calls", json=_charge("12345678901.123456789012345679"))
    assert changed.status_code == 409 and changed.json()["status"] == "conflict"


@pytest.mark.parametrize(
    ("call", "field"),
    [({"customer": "cus_1\u200b"}, "charge.customer: holds"),
     ({"scope": "order-\u2060hostile"}, "charge: scope holds"),
     ({"currency": "u\u017fd"}, "charge.currency: upper"),
     ({"customer": "cus_\u180e1"}, "charge.customer: holds")],
    ids=["zero-width-customer", "word-joiner-scope", "long-s-currency", "mongolian-separator"],
)  # fmt: skip
def test_an_invisible_character_in_an_identity_is_a_422_naming_the_field_never_the_value(
    client: httpx.Client, live: LocalStack, call: dict[str, str], field: str
) -> None:
    # cus_1 and cus_1 + U+200B would be two customers, charged twice (issue 37, item 5).
    body = _charge("10.00")
    body["scope"] = call.pop("scope", body["scope"])
    body["args"] = {**body["args"], **call}
    response = client.post("/v1/tool-calls", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid"
    assert response.json()["message"].startswith(field), response.text
    _no_echo(response, "cus_1\u200b", "\u2060", "u\u017fd", "\u180e")
    assert broker_messages(live)["live"] == 0


def test_a_campaign_id_with_an_invisible_character_is_a_422(
    client: httpx.Client, live: LocalStack
) -> None:
    spec = {
        "campaign_id": "hostile\u200b-2",
        "tool": "charge",
        "args": {"amount": "10.00", "currency": "usd"},
        "recipients": ["cus_1", "cus_2"],
    }
    response = client.post("/v1/campaigns", json=spec)
    assert response.status_code == 422, response.text
    assert response.json()["message"].startswith("campaign id holds"), response.text
    _no_echo(response, "hostile\u200b")
    assert broker_messages(live)["live"] == 0


@pytest.mark.parametrize(
    "raw",
    [b'{"tool": "set_value", "scope": "s", "args": {"target": "t", "value": ' + CARD.encode()
     + b"}}",
     b'{"tool": "set_value", "scope": "s", "args": {"target": "t", "value": [1, ' + CARD.encode()
     + b"]}}",
     b'{"tool": "set_value", "scope": "s", "args": {"target": ' + CARD.encode() + b', "value": 1}}',
     b'{"tool": "set_value", "scope": "s", "args": {"target": "t", "value": 1' + b"0" * 5000
     + b"}}",
     b'{"tool": "set_value", "scope": "s", "args": {"target": "t", "value": NaN}}',
     b'{"tool": "set_value", "scope": "s", "args": {"target": "t", "value": 1e1000000}}',
     b'{"tool": "set_value", "scope": "s", "args": {"target": "t", "value": -Infinity}}',
     b'{"tool": "send_email", "scope": "s", "args": {"recipient": "' + CARD.encode()
     + b'@@example.com"}}'],
    ids=["card-int", "card-in-list", "card-id", "5000-digits", "nan", "overflow", "-inf",
         "card-address"],
)  # fmt: skip
def test_huge_integers_and_nan_are_a_4xx_that_never_echoes_them(
    client: httpx.Client, live: LocalStack, raw: bytes
) -> None:
    response = client.post(
        "/v1/tool-calls", content=raw, headers={"content-type": "application/json"}
    )
    assert 400 <= response.status_code < 500, response.text
    _no_echo(response, CARD, "0" * 20)
    assert broker_messages(live)["live"] == 0


def test_a_campaign_with_money_past_its_bounds_is_a_4xx(
    client: httpx.Client, live: LocalStack
) -> None:
    spec = {
        "campaign_id": "hostile-1",
        "tool": "charge",
        "args": {"amount": "1e1000000", "currency": "usd"},
        "recipients": ["cus_1", "cus_2"],
    }
    response = client.post("/v1/campaigns", json=spec)
    assert 400 <= response.status_code < 500, response.text
    _no_echo(response, "1e1000000")
    assert broker_messages(live)["live"] == 0


@pytest.mark.parametrize("verb", ["inspect", "revoke", "supersede", "resolve", "replay"])
def test_every_operator_verb_refuses_a_malformed_key_by_name_before_the_ledger(
    live: LocalStack, verb: str
) -> None:
    # The routes check the path first; the verbs (CLI, console, API) check again, in the
    # operator, so that no path reads a record under a key that is not one.
    from dedupe import KeyFormatError
    from workers import verbs
    from workers.api.problems import problem_of

    calls = {
        "inspect": lambda k: verbs.operator().inspect(k),
        "revoke": lambda k: verbs.revoke(k, actor="sre-ana", reason="refunded"),
        "supersede": lambda k: verbs.supersede(k, actor="sre-ana", reason="replaced"),
        "resolve": lambda k: verbs.resolve(k, executed=False, actor="sre-ana", reason="gone"),
        "replay": lambda k: verbs.replay(k, actor="sre-ana", reason="again"),
    }
    with pytest.raises(KeyFormatError) as info:
        calls[verb]("bob@example.com")
    problem = problem_of(info.value)
    assert problem.status == 422 and "bob@" not in problem.message
