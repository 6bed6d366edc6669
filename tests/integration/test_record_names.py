"""A record's name (issue 39, "key names may shrink"): a namespace laid out by this release
writes each record under its key's 32 bytes in base64url (43 characters), one laid out
before keeps the 64 hex digits, and either spelling of the ledger finds a record written
under the other — a miss there would be a fresh claim, a second execution."""

from __future__ import annotations

import base64
import dataclasses
import random

import pytest
import redis

from dedupe import ClaimOutcome, Ledger, State
from dedupe.keys import SCHEMA_KEY, effect_key_of, short_name
from tests.support.ledgers import charge, fresh_ledger
from workers.dev.redis_server import RedisServer
from workers.settings import Settings, ledger_from_settings

RECEIPT = {"id": "ch_" + "x" * 80, "ok": True}  # about 100 bytes, as docs/capacity.md counts


def _names(client: redis.Redis, ledger: Ledger) -> list[str]:
    found = client.scan_iter(match=ledger.keyspace.records, count=1000)
    return sorted(k.decode() if isinstance(k, bytes) else str(k) for k in found)


def _suffix(name: str) -> str:
    return name.rsplit(":", 1)[1]


def test_a_namespace_this_release_lays_out_names_its_records_short(
    redis_server: RedisServer,
) -> None:
    ledger = ledger_from_settings(Settings(redis_url=redis_server.url, namespace="shop"))  # type: ignore[call-arg]
    client = redis_server.client()
    schema = client.hgetall(SCHEMA_KEY)
    # Format 2: a release that reads hex names only refuses this ledger at start.
    assert schema[b"format"] == b"2" and schema[b"names:shop"] == b"short", schema
    effect = charge()
    token = ledger.claim(effect, lease_s=30, holder="w/1").token
    assert ledger.commit(effect.key, token, RECEIPT, retention_s=600).ok
    [name] = _names(client, ledger)
    assert len(_suffix(name)) == 43
    assert base64.urlsafe_b64decode(_suffix(name) + "=").hex() == effect.key
    # Another process of the namespace (laid out already) writes the same spelling.
    again = ledger_from_settings(Settings(redis_url=redis_server.url, namespace="shop"))  # type: ignore[call-arg]
    assert again.keyspace.short


def test_a_namespace_laid_out_before_keeps_hex_names(redis_server: RedisServer) -> None:
    """Its records may be read by the previous release during a rolling upgrade."""
    Ledger.from_url(redis_server.url, namespace="shop").claim(charge(), lease_s=30, holder="w")
    ledger = ledger_from_settings(Settings(redis_url=redis_server.url, namespace="shop"))  # type: ignore[call-arg]
    assert not ledger.keyspace.short
    assert redis_server.client().hget(SCHEMA_KEY, "format") == b"1"
    effect = charge()
    ledger.claim(effect, lease_s=30, holder="w/1")
    tag = ledger.keyspace.tag(ledger.bucket_of(effect.key))
    assert redis_server.client().exists(f"{tag}:r:{effect.key}")


@pytest.mark.parametrize("writer_short", [False, True], ids=["hex-written", "short-written"])
def test_a_record_is_found_under_either_name_and_moves_to_the_writers(
    shared_redis_server: RedisServer, writer_short: bool
) -> None:
    client = shared_redis_server.client()
    first = fresh_ledger(shared_redis_server.url, short_names=writer_short)
    other = Ledger.from_url(
        shared_redis_server.url, namespace=first.namespace, short_names=not writer_short
    )
    done, live = charge(), charge()
    token = first.claim(done, lease_s=30, holder="w/1").token
    assert first.commit(done.key, token, RECEIPT, retention_s=600).ok
    live_claim = first.claim(live, lease_s=30, holder="w/1")
    # The other spelling's ledger sees both: a duplicate, not a fresh claim; in flight.
    duplicate = other.claim(done, lease_s=30, holder="w/2")
    assert duplicate.outcome is ClaimOutcome.DUPLICATE and duplicate.receipt == RECEIPT
    assert other.claim(live, lease_s=30, holder="w/2").outcome is ClaimOutcome.IN_FLIGHT
    record = other.get(done.key)
    assert record is not None and record.state is State.DONE and (record.ttl_ms or 0) > 0
    assert sorted(other.keys_in(State.DONE)) == [done.key]
    before = _names(client, first)
    # A write by the other ledger moves the record to its own spelling: one name at a time,
    # the retention kept.
    assert other.commit(live.key, live_claim.token, RECEIPT, retention_s=600).ok
    after = _names(client, first)
    assert len(after) == len(before) == 2
    moved = [n for n in after if effect_key_of(_suffix(n)) == live.key]
    assert [len(_suffix(n)) for n in moved] == [64 if writer_short else 43]
    assert client.pttl(moved[0]) > 0
    assert first.get(live.key) is not None and first.get(live.key).state is State.DONE  # type: ignore[union-attr]


def test_a_key_prefix_finds_records_of_both_spellings(shared_redis_server: RedisServer) -> None:
    """The operator's key search (``effectq inspect <prefix>``): every prefix length from the
    bucket's 8 digits to the whole key, against names of both spellings — the base64 pattern
    covers a prefix that ends inside a character (1 or 2 hex digits over a multiple of 3)."""
    rng = random.Random(39)
    hex_ledger = fresh_ledger(shared_redis_server.url, buckets=1)
    short_ledger = Ledger.from_url(
        shared_redis_server.url, namespace=hex_ledger.namespace, buckets=1, short_names=True
    )
    keys = []
    for i in range(60):
        effect = charge(f"prefix-{i}")
        (short_ledger if i % 2 else hex_ledger).claim(effect, lease_s=30, holder="w")
        keys.append(effect.key)
    # Keys sharing long prefixes, so a pattern that matched too much would show.
    for key in rng.sample(keys, 25):
        for length in (8, 9, 10, 11, 12, 13, 14, 31, 32, 33, 63, 64):
            prefix = key[:length]
            want = sorted(k for k in keys if k.startswith(prefix))
            assert sorted(hex_ledger.keys_with_prefix(prefix)) == want, prefix
    # A prefix ending one digit past a multiple of three: that digit fixes 4 of the next
    # character's 6 bits, a range of 4 in the alphabet ("89-_" for f: '-' must be escaped in
    # the pattern's class). Keys made for every digit and the 2 bits after it.
    base = keys[0][:9]
    made = [base + a + b + keys[0][11:] for a in "0123456789abcdef" for b in "0123456789abcdef"]
    for key in made:
        short_ledger.claim(dataclasses.replace(charge(), key=key), lease_s=30, holder="w")
    for digit in "0123456789abcdef":
        want = sorted(k for k in made if k.startswith(base + digit))
        assert len(want) == 16
        assert sorted(hex_ledger.keys_with_prefix(base + digit)) == want, digit


def test_short_names_spell_every_digest_and_nothing_else() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        key = rng.randbytes(32).hex()
        name = short_name(key)
        assert len(name) == 43 and effect_key_of(name) == key
    # Keys that are no SHA-256 in hex (tests make such) keep their spelling.
    for key in ("k1", "0" * 63, "A" * 64, "g" * 64):
        assert short_name(key) == key
