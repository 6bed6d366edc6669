"""The email normalizer accepts a plain ASCII address with one regular expression and
checks every other character by character (``dedupe.normalize``): on generated ASCII text
built from the characters the rules turn on, the match accepts exactly what the full check
accepts, so the fast path never lets through an address the rules refuse nor refuses one
they accept (and the refusal's message is the full check's)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dedupe.errors import CanonicalizationError
from dedupe.normalize import _checked, _plain_ascii

# Letters and digits, every dot-atom symbol, the separators the rules look at, and ASCII
# that no address may hold (space, quotes, brackets, controls, DEL).
_PART = st.sampled_from(
    ["a", "Z", "0", "9", "-", ".", "@", "_", "+", "!", "#", "$", "%", "&", "'", "*", "/", "=",
     "?", "^", "`", "{", "|", "}", "~", " ", '"', "(", ")", "<", ">", "[", "]", ",", ";", ":",
     "\\", "\t", "\x00", "\x7f", "x" * 62, "y" * 63, "com", "1", "12"]
)  # fmt: skip
_ASCII = st.lists(_PART, min_size=1, max_size=14).map("".join)


def _accepted(address: str) -> bool:
    try:
        assert _checked(address) == address
    except CanonicalizationError:
        return False
    return True


@settings(max_examples=3000, deadline=None)
@given(_ASCII)
@example("a@b.c")
@example("a@b.1")  # a numeric top label: an IP address, refused
@example("a@1.com")
@example("a..b@c.d")
@example(".a@c.d")
@example("a.@c.d")
@example("a@-b.c")
@example("a@b-.c")
@example("a@b..c")
@example("a@b")
@example(f"{'l' * 64}@b.c")
@example(f"{'l' * 65}@b.c")
@example(f"a@{'d' * 63}.c")
@example(f"a@{'d' * 64}.c")
@example("a@b.c\n")
def test_the_ascii_match_accepts_exactly_what_the_full_check_accepts(address: str) -> None:
    assert _plain_ascii(address) == _accepted(address)


@pytest.mark.parametrize("address", ["ünï@example.de", "a@bü.de", "a@b.de\u00a0"])
def test_non_ascii_addresses_take_the_full_check(address: str) -> None:
    assert not _plain_ascii(address)
