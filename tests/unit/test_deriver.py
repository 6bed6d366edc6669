"""``Deriver`` (a campaign's derive, one varying identity field) gives derive's effect byte for
byte, or raises what derive raises, on generated scopes, shared arguments and values: for
every shipped normalizer, a field that is also bound or not, shared identity and bound
fields beside it, and inputs built to break the template (its placeholder in the scope, an
identity over its bound, non-ASCII key forms, values of every JSON type)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dedupe import IdentityError, ToolSpec, derive
from dedupe.identity import _PLACEHOLDER, Deriver
from dedupe.normalize import NORMALIZERS
from tests.unit.test_identity_properties import addresses

PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SPECS: dict[str, ToolSpec] = {
    **{
        f"{name}, bound": ToolSpec(name="t", identity=("f",), bound=("f",), free=("w",),
                                   normalizers={"f": name})
        for name in NORMALIZERS
    },
    "none, bound": ToolSpec(name="t", identity=("f",), bound=("f",), free=("w",)),
    # The field is identity only: one fingerprint over the shared bound fields.
    "email beside shared fields": ToolSpec(
        name="pay", identity=("f", "g"), bound=("amount", "g"), free=("w",),
        normalizers={"f": "email", "g": "id", "amount": "money"},
    ),
    "two actions": ToolSpec(name="mail", identity=("f",), bound=("f",), free=("w",),
                            action="receipt", actions=("reminder",), normalizers={"f": "email"}),
}  # fmt: skip

_TEXT = st.text(max_size=24)
_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), _TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_TEXT, inner, max_size=3)),
    max_leaves=8,
)
_VALUES = st.one_of(
    addresses,
    addresses.map(lambda a: f"  {a.upper()} "),
    st.from_regex(r"[A-Za-z0-9_.:-]{1,40}", fullmatch=True),
    _TEXT,
    st.just(_PLACEHOLDER),
    st.text(min_size=8000, max_size=8300, alphabet="ab"),  # over the identity's bound
    _JSON,
)
_SCOPES = st.one_of(
    st.from_regex(r"[a-z0-9-]{1,20}", fullmatch=True),
    _TEXT,
    st.just(f"spring {_PLACEHOLDER}"),  # the placeholder twice: no template
    st.just("x" * 300),  # over the scope's bound
)
_SHARED = st.fixed_dictionaries(
    {},
    optional={"g": st.one_of(st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True), _JSON),
              "amount": st.one_of(st.sampled_from(["10.50", "1e3", "-0"]), _JSON),
              "w": _JSON, "stray": st.just(1)},
)  # fmt: skip


def _outcome(call: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return call(*args, **kwargs)
    except IdentityError as exc:
        return (type(exc), exc.message)


@PROPS
@given(
    st.sampled_from(sorted(SPECS)), _SCOPES, _SHARED, st.lists(_VALUES, min_size=1, max_size=4),
    st.sampled_from([None, "receipt", "reminder", "undeclared"]),
)  # fmt: skip
def test_a_deriver_gives_what_derive_gives_for_every_value(
    name: str, scope: str, shared: dict[str, Any], values: list[Any], action: str | None
) -> None:
    spec = SPECS[name]
    deriver = Deriver(spec, scope, shared, "f", action)
    for value in values:
        expected = _outcome(derive, spec, scope, {**shared, "f": value}, action=action)
        assert _outcome(deriver, value) == expected


@pytest.mark.parametrize("name", ["email, bound", "id, bound", "email beside shared fields"])
def test_ordinary_recipients_take_the_template(name: str) -> None:
    # Else the property above would hold by derive alone.
    spec = SPECS[name]
    shared = {"g": "acct-1", "amount": "10.50"} if "shared" in name else {}
    deriver = Deriver(spec, "campaign-7", {**shared, "w": {"subject": "Hi"}}, "f")
    assert deriver._fast is not None
    for value in ("anna@example.com", " Bob@Example.COM", "c.d+tag@mail.example.org"):
        fast = deriver._fast.effect(spec, "f", value)
        assert fast is not None
        assert fast == derive(spec, "campaign-7", {**shared, "w": {"subject": "Hi"}, "f": value})


# Values at the template's edges, each compared on every spec: identities just under and
# over their bound, key forms that are not NFC after the normalizer (casefold of U+01F0),
# non-ASCII and dotted-I forms, a value spelled as the placeholder, JSON that is no string.
EDGES = [
    *("a" * n for n in (8100, 8120, 8125, 8130, 8140, 8192)),
    "\u01f0", "J\u030c", "e\u0301", "\u0130", "ß", "ﬃ@example.com", "Ä@example.com",
    _PLACEHOLDER, f'"{_PLACEHOLDER}"', "quote\"back\\slash\x00\x1f\x7f", "", " ", None, 7,
    True, 1.5, ["a@example.com"], {"to": "a@example.com"},
]  # fmt: skip


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize(
    ("scope", "account"),
    [("campaign-7", "acct-1"), ("Kampagne-\u00e4", "acct-1"), (_PLACEHOLDER, "acct-1"),
     ("campaign-7", _PLACEHOLDER)],  # the placeholder's JSON twice in a form: no template
)  # fmt: skip
def test_a_deriver_gives_what_derive_gives_at_the_edges(
    name: str, scope: str, account: str
) -> None:
    spec = SPECS[name]
    shared = {"g": account, "amount": "10.50"} if "g" in spec.fields else {}
    deriver = Deriver(spec, scope, shared, "f")
    for value in EDGES:
        expected = _outcome(derive, spec, scope, {**shared, "f": value})
        assert _outcome(deriver, value) == expected, (name, scope, value)
