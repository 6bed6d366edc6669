"""One rule for every string that names an effect (DESIGN §1, issue 37 item 5): an identity
field (whatever its normalizer), the scope, a campaign id and a campaign's recipients refuse
control, format, default-ignorable (zero-width, joiners, BOM, soft hyphen, variation
selectors, fillers…), unassigned and private-use code points — one InvisibleCharacterError
naming the field, never the value — so that ``cus_1`` and ``cus_1`` + U+200B can never be
two customers charged twice. Free content keeps them (an emoji's joiner is text).

And no normalizer merges spellings the provider receives as different: ``upper`` merges a
letter with its capital only (``u\u017fd`` is not ``USD``, ``\ufb00`` is not ``FF``)."""

from __future__ import annotations

import string
import unicodedata
from typing import Any

import pytest
import regex  # type: ignore[import-untyped]
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dedupe import IdentityError, ToolSpec, campaign_tag, derive
from dedupe.campaigns import normalize_campaign_id
from dedupe.errors import InvisibleCharacterError, SpecError
from dedupe.identity import Deriver
from dedupe.normalize import DEFAULT_IGNORABLE, NORMALIZERS, visible

PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# One of each kind the rule names, and the look-alikes of an empty string that are letters
# or marks by category (so a category check alone lets them through).
INVISIBLE = {
    "ZERO WIDTH SPACE": "\u200b",
    "ZERO WIDTH NON-JOINER": "\u200c",
    "ZERO WIDTH JOINER": "\u200d",
    "LEFT-TO-RIGHT MARK": "\u200e",
    "RIGHT-TO-LEFT OVERRIDE": "\u202e",
    "WORD JOINER": "\u2060",
    "INVISIBLE PLUS": "\u2064",
    "reserved 2065": "\u2065",
    "LEFT-TO-RIGHT ISOLATE": "\u2066",
    "BOM": "\ufeff",
    "SOFT HYPHEN": "\u00ad",
    "COMBINING GRAPHEME JOINER": "\u034f",
    "ARABIC LETTER MARK": "\u061c",
    "HANGUL CHOSEONG FILLER": "\u115f",
    "HANGUL FILLER": "\u3164",
    "HALFWIDTH HANGUL FILLER": "\uffa0",
    "KHMER VOWEL INHERENT AQ": "\u17b4",
    "MONGOLIAN FREE VARIATION SELECTOR ONE": "\u180b",
    "MONGOLIAN VOWEL SEPARATOR": "\u180e",
    "VARIATION SELECTOR-16": "\ufe0f",
    "VARIATION SELECTOR-17": "\U000e0100",
    "SHORTHAND FORMAT LETTER OVERLAP": "\U0001bca0",
    "MUSICAL SYMBOL BEGIN BEAM": "\U0001d173",
    "LANGUAGE TAG": "\U000e0001",
    "TAG LATIN SMALL LETTER A": "\U000e0061",
    "NUL": "\x00",
    "BELL": "\x07",
    "DELETE": "\x7f",
    "NEXT LINE (C1)": "\x85",
    "LINE SEPARATOR": "\u2028",
    "PARAGRAPH SEPARATOR": "\u2029",
    "ARABIC NUMBER SIGN (Cf)": "\u0600",
    "INTERLINEAR ANNOTATION ANCHOR": "\ufff9",
    "private use": "\ue000",
    "unassigned": "\u0378",
    "noncharacter": "\uffff",
    "lone surrogate": "\ud800",
}


def _spec(normalizer: str | None, **extra: Any) -> ToolSpec:
    norms = {} if normalizer is None else {"f": normalizer}
    return ToolSpec(name="t", identity=("f",), normalizers=norms, **extra)


SPECS = {name: _spec(name) for name in NORMALIZERS} | {"none": _spec(None)}
# A value each normalizer accepts, with a place to put a character in.
PLAIN = {"email": ("ana", "@example.com"), "money": ("1", "0.50")}


def _around(name: str, char: str) -> str:
    head, tail = PLAIN.get(name, ("cus_", "1"))
    return head + char + tail


def _refused(exc: pytest.ExceptionInfo[IdentityError], value: str, field: str = "t.f") -> None:
    message = exc.value.message
    assert message.startswith(f"{field}: "), message
    assert "\n" not in message and value not in message, message
    assert not any(c in message for c in INVISIBLE.values() if c != " ")
    assert all(value not in str(v) for v in exc.value.details.values())


# -- identity fields -----------------------------------------------------------------------


@pytest.mark.parametrize("char", INVISIBLE.values(), ids=INVISIBLE.keys())
@pytest.mark.parametrize("name", sorted(SPECS))
def test_an_invisible_character_in_an_identity_field_is_refused_not_a_second_target(
    name: str, char: str
) -> None:
    value = _around(name, char)
    with pytest.raises(IdentityError) as exc:
        derive(SPECS[name], "order-1", {"f": value})
    # Money refuses anything but ASCII digits, and a lone surrogate is not text at all: both
    # in their own words.
    if name != "money" and char != "\ud800":
        assert isinstance(exc.value, InvisibleCharacterError), exc.value
    _refused(exc, value)


@pytest.mark.parametrize("char", ["\u200b", "\ufe0f", "\u3164", "\x00"])
def test_an_invisible_character_deep_in_a_structured_identity_value_is_refused(char: str) -> None:
    spec = ToolSpec(name="t", identity=("f",))
    for value in ({"id": f"a{char}"}, [1, f"a{char}"], {f"k{char}": 1}):
        with pytest.raises(InvisibleCharacterError) as exc:
            derive(spec, "order-1", {"f": value})
        _refused(exc, f"a{char}")


def test_a_users_normalizer_that_keeps_the_character_is_refused_after_it() -> None:
    spec = ToolSpec(name="t", identity=("f",), normalizers={"f": lambda v: v})
    with pytest.raises(InvisibleCharacterError) as exc:
        derive(spec, "order-1", {"f": "cus_1\u200b"})
    _refused(exc, "cus_1\u200b")


def test_a_users_normalizer_that_maps_the_character_away_merges_consistently() -> None:
    spec = ToolSpec(name="t", identity=("f",), normalizers={"f": lambda v: v.replace("\u200b", "")})
    assert derive(spec, "o", {"f": "cus_1\u200b"}).key == derive(spec, "o", {"f": "cus_1"}).key


@pytest.mark.parametrize("char", ["\u200b", "\u00ad", "\x00", "\ue000"])
def test_the_id_email_upper_and_casefold_normalizers_refuse_in_a_bound_field_too(
    char: str,
) -> None:
    for name in ("id", "email", "upper", "casefold"):
        spec = ToolSpec(name="t", identity=("k",), bound=("f",), normalizers={"f": name})
        with pytest.raises(InvisibleCharacterError) as exc:
            derive(spec, "o", {"k": "x", "f": _around(name, char)})
        _refused(exc, _around(name, char))


def test_surrounding_whitespace_is_still_trimmed_where_the_normalizer_trims() -> None:
    spec = SPECS["id"]
    assert derive(spec, "o", {"f": " cus_1\t"}).key == derive(spec, "o", {"f": "cus_1"}).key


# -- free content is not identity ------------------------------------------------------------


def test_free_content_keeps_joiners_zero_widths_and_control_characters() -> None:
    spec = ToolSpec(
        name="t",
        identity=("to",),
        free=("subject", "body", "note"),
        normalizers={"to": "email", "subject": "strip", "note": "text"},
    )
    body = "hi \U0001f469\u200d\U0001f4bb\ufe0f\u200b soft\u00adhyphen\n\ttab \u202eevil"
    effect = derive(spec, "o", {"to": "a@x.example", "subject": f" {body} ", "body": body,
                                "note": body})  # fmt: skip
    assert effect.args["body"] == body and effect.args["note"] == body
    assert effect.args["subject"] == body.strip()
    plain = derive(spec, "o", {"to": "a@x.example", "body": "other"})
    assert (effect.key, effect.fingerprint) == (plain.key, plain.fingerprint)


def test_a_bound_text_field_keeps_them_and_a_change_is_a_conflict_not_a_merge() -> None:
    spec = ToolSpec(name="t", identity=("k",), bound=("memo",), normalizers={"memo": "text"})
    one = derive(spec, "o", {"k": "x", "memo": "a\u200bb"})
    two = derive(spec, "o", {"k": "x", "memo": "ab"})
    assert one.key == two.key and one.fingerprint != two.fingerprint


# -- scope, campaign id, recipients, tool and action -----------------------------------------


@pytest.mark.parametrize("char", INVISIBLE.values(), ids=INVISIBLE.keys())
def test_an_invisible_character_in_the_scope_is_refused(char: str) -> None:
    scope = f"order{char}-1"
    with pytest.raises(InvisibleCharacterError) as exc:
        derive(SPECS["id"], scope, {"f": "cus_1"})
    _refused(exc, scope, field="t")
    assert "scope" in exc.value.message


@pytest.mark.parametrize("char", INVISIBLE.values(), ids=INVISIBLE.keys())
def test_an_invisible_character_in_a_campaign_id_is_refused(char: str) -> None:
    campaign = f"spring{char}-2027"
    for fn in (normalize_campaign_id, campaign_tag):
        with pytest.raises(InvisibleCharacterError) as exc:
            fn(campaign)
        message = exc.value.message
        assert message.startswith("campaign id ") and campaign not in message, message
    assert normalize_campaign_id(" spring-2027 ") == "spring-2027"


def test_a_blank_campaign_id_is_refused_as_a_blank_scope_is() -> None:
    with pytest.raises(IdentityError, match="campaign id"):
        normalize_campaign_id("  \t ")


@pytest.mark.parametrize("char", ["\u200b", "\ufe0f", "\u3164", "\U000e0100", "\x1f"])
@pytest.mark.parametrize("name", ["id", "email", "strip", "none"])
def test_a_campaign_recipient_with_an_invisible_character_is_refused_by_the_deriver(
    name: str, char: str
) -> None:
    spec = SPECS[name]
    deriver = Deriver(spec, "spring-2027", {}, "f")
    value = _around(name, char)
    with pytest.raises(InvisibleCharacterError) as exc:
        deriver(value)
    _refused(exc, value)
    clean = _around(name, "")
    assert deriver(clean) == derive(spec, "spring-2027", {"f": clean})


@pytest.mark.parametrize("name", ["charge\n", "charge\u200b"])
def test_a_tool_name_or_action_with_a_trailing_newline_or_invisible_is_refused(name: str) -> None:
    with pytest.raises(SpecError):
        ToolSpec(name=name, identity=("f",))
    with pytest.raises(SpecError):
        ToolSpec(name="t", identity=("f",), actions=(name,))


# -- the property: never two keys for one visible spelling -----------------------------------

REFUSED_CHARS = st.one_of(
    st.sampled_from(sorted(INVISIBLE.values())),
    st.sampled_from([chr(c) for a, b in DEFAULT_IGNORABLE for c in range(a, b + 1)]),
    st.characters(categories=["Cc", "Cf", "Co", "Zl", "Zp"]),
)
IDENTITY_TEXT = st.one_of(
    st.text(string.ascii_letters + string.digits + "_-.:", min_size=1, max_size=16),
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=12),
)


def _outcome(name: str, scope: str, value: Any) -> str | None:
    try:
        return derive(SPECS[name], scope, {"f": value}).key
    except IdentityError:
        return None


@PROPS
@given(
    name=st.sampled_from(sorted(SPECS)),
    text=IDENTITY_TEXT,
    char=REFUSED_CHARS,
    where=st.integers(min_value=0),
)
@example(name="id", text="cus_1", char="\u200b", where=5)
@example(name="none", text="cus_1", char="\u2060", where=3)
@example(name="upper", text="usd", char="\ufe0f", where=1)
def test_an_inserted_invisible_character_is_refused_or_changes_nothing(
    name: str, text: str, char: str, where: int
) -> None:
    i = where % (len(text) + 1)
    spliced = text[:i] + char + text[i:]
    plain, inserted = _outcome(name, "order-1", text), _outcome(name, "order-1", spliced)
    assert inserted is None or inserted == plain
    scope_plain, scope_inserted = _outcome("id", text, "cus_1"), _outcome("id", spliced, "cus_1")
    assert scope_inserted is None or scope_inserted == scope_plain


@PROPS
@given(text=IDENTITY_TEXT, char=REFUSED_CHARS, where=st.integers(min_value=0))
def test_an_inserted_invisible_character_never_gives_a_second_campaign_or_recipient_key(
    text: str, char: str, where: int
) -> None:
    i = where % (len(text) + 1)
    spliced = text[:i] + char + text[i:]
    try:
        tag = campaign_tag(spliced)
    except IdentityError:
        pass
    else:
        assert tag == campaign_tag(text)
    deriver = Deriver(SPECS["strip"], "spring-2027", {}, "f")
    try:
        key = deriver(spliced).key
    except IdentityError:
        return
    assert key == deriver(text).key


def test_the_default_ignorable_table_is_the_ucds() -> None:
    # An independent reading of DerivedCoreProperties.txt (the regex module's tables).
    ucd = regex.compile(r"\p{Default_Ignorable_Code_Point}")
    ours = {c for a, b in DEFAULT_IGNORABLE for c in range(a, b + 1)}
    theirs = {c for c in range(0x110000) if ucd.match(chr(c))}
    assert ours == theirs
    assert not any(visible(chr(c)) for c in ours)


def test_only_the_named_kinds_are_refused_across_the_whole_code_space() -> None:
    refused_kinds = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}
    ignorable = {c for a, b in DEFAULT_IGNORABLE for c in range(a, b + 1)}
    for c in range(0x110000):
        kind = unicodedata.category(chr(c))
        assert visible(chr(c)) == (kind not in refused_kinds and c not in ignorable), hex(c)


# -- upper, casefold, id: no merge the provider would not make -------------------------------


def _lowered(text: str) -> str:
    # One character at a time: str.lower() spells a final capital sigma as ς.
    return "".join(c.lower() for c in unicodedata.normalize("NFC", text).strip())


@pytest.mark.parametrize(
    ("one", "other"),
    [("u\u017fd", "USD"), ("\ufb00", "FF"), ("stra\u00dfe", "STRASSE"), ("\u0131", "I"),
     ("\u01c5", "\u01c4"), ("\u00b5", "\u039c"), ("\ufb01x", "FIX"), ("\u0149", "\u02bcN"),
     ("\u03c2", "\u03a3"), ("\u01f0", "J\u030c")],
)  # fmt: skip
def test_upper_never_merges_spellings_that_differ_beyond_ascii_case(one: str, other: str) -> None:
    # Python's upper() maps each left one to the right one (one letter to two, a long s to
    # an s, a sign to a letter); a provider that takes codes case-blind does neither.
    assert unicodedata.normalize("NFC", one.upper()) == unicodedata.normalize("NFC", other.upper())
    mine = _outcome("upper", "o", one)
    assert mine is None or mine != _outcome("upper", "o", other)


def test_upper_still_merges_a_letter_with_its_capital_and_keeps_uncased_text() -> None:
    assert _outcome("upper", "o", " usd ") == _outcome("upper", "o", "USD") is not None
    assert _outcome("upper", "o", "eur-2") == _outcome("upper", "o", "EUR-2") is not None
    assert _outcome("upper", "o", "été") == _outcome("upper", "o", "ÉTÉ") is not None
    assert _outcome("upper", "o", "\u03c3") == _outcome("upper", "o", "\u03a3") is not None
    assert derive(SPECS["upper"], "o", {"f": "円x"}).normalized["f"] == "円X"
    with pytest.raises(IdentityError) as exc:
        derive(SPECS["upper"], "o", {"f": "u\u017fd"})
    assert exc.value.message.startswith("t.f: ") and "u\u017fd" not in exc.value.message


CODE_CHARS = st.one_of(
    st.sampled_from(string.ascii_letters + string.digits + "-"),
    st.characters(codec="utf-8"),
)


@PROPS
@given(one=st.text(CODE_CHARS, max_size=8), data=st.data())
@example(one="u\u017fd", data=None)
@example(one="\ufb00", data=None)
def test_upper_merges_two_accepted_spellings_only_when_they_differ_in_case(
    one: str, data: st.DataObject | None
) -> None:
    flips = {"u\u017fd": "USD", "\ufb00": "ff"}
    if data is None:
        other = flips[one]
    else:  # as often another spelling of it (case flipped here and there) as not
        other = data.draw(
            st.one_of(
                st.text(CODE_CHARS, max_size=8),
                st.lists(st.booleans(), min_size=len(one), max_size=len(one)).map(
                    lambda flip: "".join(
                        c.swapcase() if f else c for c, f in zip(one, flip, strict=True)
                    )
                ),
            )
        )
    a, b = _outcome("upper", "o", one), _outcome("upper", "o", other)
    if a is None or b is None:
        return
    assert (a == b) == (_lowered(one) == _lowered(other))


@PROPS
@given(value=st.text(max_size=12))
@example(value="usd")
@example(value="円x")
def test_upper_keeps_the_key_of_every_value_it_still_accepts(value: str) -> None:
    # Refusing (never re-spelling) keeps every earlier key: a DONE effect submitted again
    # after an upgrade must find its record.
    try:
        form = derive(SPECS["upper"], "o", {"f": value}).normalized["f"]
    except IdentityError:
        return
    assert form == unicodedata.normalize("NFC", unicodedata.normalize("NFC", value).strip().upper())


def test_casefold_is_unicode_caseless_matching_as_documented_and_id_merges_int_and_text() -> None:
    # Kept merges, each one the provider's own: a caseless provider matches by Unicode
    # default case folding (as the email key does), and an id is text on the wire.
    assert _outcome("casefold", "o", "Straße") == _outcome("casefold", "o", "STRASSE")
    assert _outcome("id", "o", 42) == _outcome("id", "o", "42") is not None
    assert _outcome("id", "o", "042") != _outcome("id", "o", 42)


# -- at the faces: one line and exit 2, before anything is contacted -------------------------

# The ledger and broker at a closed port: a refusal that came after contacting either would
# be exit 7, not 2.
UNREACHABLE = {
    "EFFECTQ_REDIS_URL": "redis://127.0.0.1:1/0",
    "EFFECTQ_BROKER_URL": "redis://127.0.0.1:1/1",
    "COLUMNS": "200",
}
CHARGE = ["submit", "charge", "--arg", "amount=10.00"]


def _one_line(code: int, stderr: str, *secrets: str) -> str:
    assert code == 2, (code, stderr)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("effectq: "), stderr
    assert "Traceback" not in stderr and not any(s in stderr for s in secrets), stderr
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "field"),
    [([*CHARGE, "--scope", "order-1", "--arg", "customer=cus_1\u200b", "--arg", "currency=usd"],
      "charge.customer: holds"),
     ([*CHARGE, "--scope", "order\u2060-1", "--arg", "customer=cus_1", "--arg", "currency=usd"],
      "charge: scope holds"),
     ([*CHARGE, "--scope", "order-1", "--arg", "customer=cus_1", "--arg", "currency=u\u017fd"],
      "charge.currency: upper"),
     (["submit", "send_email", "--scope", "s", "--arg", "recipient=ana\ufe0f@x.example"],
      "send_email.recipient: holds")],
    ids=["id", "scope", "upper", "email"],
)  # fmt: skip
def test_the_cli_refuses_an_invisible_character_in_one_line_with_exit_2(
    argv: list[str], field: str
) -> None:
    from typer.testing import CliRunner

    from workers.cli import app

    result = CliRunner().invoke(app, argv, env=UNREACHABLE)
    line = _one_line(result.exit_code, result.stderr, "cus_1\u200b", "order\u2060", "ana")
    assert line.startswith(f"effectq: {field}"), line


def test_the_cli_refuses_a_campaign_whose_id_holds_an_invisible_character(tmp_path: Any) -> None:
    import json

    from typer.testing import CliRunner

    from workers.cli import app

    path = tmp_path / "c.json"
    path.write_text(
        json.dumps({"campaign_id": "spring\u200b-2027", "tool": "send_email",
                    "args": {"subject": "s", "body": "b"}, "recipients": ["a@x.example"]})
    )  # fmt: skip
    result = CliRunner().invoke(app, ["campaign", "submit", str(path)], env=UNREACHABLE)
    line = _one_line(result.exit_code, result.stderr, "spring")
    assert line.startswith("effectq: campaign id holds"), line


def test_the_effectq_command_refuses_a_zero_width_customer_in_one_line_with_exit_2() -> None:
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "workers", *CHARGE, "--scope", "order-1",
         "--arg", "customer=cus_1\u200b", "--arg", "currency=usd"],
        env={**os.environ, **UNREACHABLE}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    line = _one_line(done.returncode, done.stderr, "cus_1")
    assert line.startswith("effectq: charge.customer: holds a control, format, invisible"), line
    assert done.stdout == ""


def test_the_api_answers_422_naming_the_field_never_the_value() -> None:
    from pydantic import SecretStr
    from starlette.testclient import TestClient

    from workers.api.app import create_app
    from workers.settings import Settings

    token = "shop-token-0123456789abcdef"
    ledger, broker = UNREACHABLE["EFFECTQ_REDIS_URL"], UNREACHABLE["EFFECTQ_BROKER_URL"]
    tokens = SecretStr(f"shop:{token}:submit")
    app = create_app(Settings(api_tokens=tokens, redis_url=ledger, broker_url=broker))
    calls = [
        ({"tool": "charge", "scope": "order-1",
          "args": {"customer": "cus_1\u200b", "amount": "10.00", "currency": "usd"}},
         "charge.customer: holds"),
        ({"tool": "charge", "scope": "\ufefforder-1",
          "args": {"customer": "cus_1", "amount": "10.00", "currency": "usd"}},
         "charge: scope holds"),
        ({"tool": "charge", "scope": "order-1",
          "args": {"customer": "cus_1", "amount": "10.00", "currency": "\ufb00"}},
         "charge.currency: upper"),
    ]  # fmt: skip
    with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as client:
        for body, field in calls:
            response = client.post("/v1/tool-calls", json=body)
            assert response.status_code == 422, response.text
            assert response.json()["message"].startswith(field), response.text
            assert "cus_1\u200b" not in response.text and "\ufeff" not in response.text
        campaign = {
            "campaign_id": "spring\u200b-2027",
            "tool": "send_email",
            "args": {"subject": "s", "body": "b"},
            "recipients": ["a@x.example"],
        }
        response = client.post("/v1/campaigns", json=campaign)
        assert response.status_code == 422, response.text
        assert response.json()["message"].startswith("campaign id holds"), response.text


@pytest.mark.parametrize("char", INVISIBLE.values(), ids=INVISIBLE.keys())
def test_the_agent_faces_refuse_by_the_same_rule_in_identity_and_bound_text(char: str) -> None:
    # MCP and LangChain check a model's arguments before the guard (workers.agents._checks):
    # the same set, so a variation selector or a Hangul filler is refused there too.
    import workers.examples  # noqa: F401  (declares charge)
    from workers import get_tool
    from workers.agents._checks import refusal
    from workers.guard import Guarded

    guard = Guarded(get_tool("charge"), scope="order-1")
    ok = {"customer": "cus_1", "amount": "10.00", "currency": "usd"}
    assert refusal(guard, ok) is None
    for name in ("customer", "currency"):
        answer = refusal(guard, {**ok, name: ok[name][:2] + char + ok[name][2:]})
        assert answer == f"{name} carries invisible or control characters.", answer
