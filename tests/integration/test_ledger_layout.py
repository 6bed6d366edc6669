"""A worker, reconciler or API refuses a ledger laid out otherwise: a changed namespace or
bucket count on a ledger that holds records would make every recorded effect invisible,
and let it run again (UPGRADING, "the settings that must never change")."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dedupe import LayoutChangedError, Ledger
from dedupe.ledger import LEDGER_FORMAT, SCHEMA_KEY
from tests.support.ledgers import charge
from workers.dev.redis_server import RedisServer
from workers.settings import Settings, ledger_from_settings


def _settings(server: RedisServer, **values: object) -> Settings:
    return Settings(redis_url=server.url, **values)  # type: ignore[arg-type]


def test_a_changed_namespace_on_a_ledger_with_records_is_refused(
    redis_server: RedisServer,
) -> None:
    ledger = ledger_from_settings(_settings(redis_server, namespace="shop"))
    ledger.claim(charge(), lease_s=30, holder="w/1")
    with pytest.raises(
        LayoutChangedError, match="namespace 'shop2' is new on a ledger laid out for another"
    ):
        ledger_from_settings(_settings(redis_server, namespace="shop2"))
    # A second deployment on one ledger, on purpose; then it is known.
    ledger_from_settings(_settings(redis_server, namespace="shop2", allow_new_namespace=True))
    ledger_from_settings(_settings(redis_server, namespace="shop2"))
    ledger_from_settings(_settings(redis_server, namespace="shop"))


@pytest.mark.parametrize("renamed", ["shop*", "sh?p", "s[h]op", "sho\\p"])
def test_a_namespace_with_glob_characters_is_refused_before_it_can_pass_for_another(
    redis_server: RedisServer, renamed: str
) -> None:
    # The layout check finds "its" keys by a SCAN pattern made of the namespace: `shop*`
    # matched shop's records, passed for a known namespace, and every effect ran again.
    ledger = ledger_from_settings(_settings(redis_server, namespace="shop"))
    ledger.claim(charge(), lease_s=30, holder="w/1")
    with pytest.raises(ValueError, match="namespace must be"):
        ledger_from_settings(_settings(redis_server, namespace=renamed))
    assert not redis_server.client().exists(f"{renamed}:layout")


def test_a_changed_bucket_count_is_refused(redis_server: RedisServer) -> None:
    Ledger.from_url(redis_server.url, namespace="shop").check_layout()
    with pytest.raises(LayoutChangedError, match="laid out in 256 buckets, not 64"):
        Ledger.from_url(redis_server.url, namespace="shop", buckets=64).check_layout()


def test_records_written_before_the_layout_key_existed_are_adopted(
    redis_server: RedisServer,
) -> None:
    # A ledger of 0.1.0: records, no layout key. Another namespace's keys are there too.
    old = Ledger.from_url(redis_server.url, namespace="shop")
    old.claim(charge(), lease_s=30, holder="w/1")
    Ledger.from_url(redis_server.url, namespace="other").claim(charge(), lease_s=30, holder="x")
    old.check_layout()  # its own records: adopted, not refused
    assert redis_server.client().get("shop:layout") == b"256"


def test_an_empty_ledger_takes_any_namespace(redis_server: RedisServer) -> None:
    ledger_from_settings(_settings(redis_server, namespace="fresh"))


def test_effectq_worker_refuses_to_start_on_a_renamed_namespace(
    redis_server: RedisServer,
) -> None:
    ledger_from_settings(_settings(redis_server)).claim(charge(), lease_s=30, holder="w/1")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("EFFECTQ_")},
        "EFFECTQ_REDIS_URL": redis_server.url,
        "EFFECTQ_BROKER_URL": redis_server.url.rpartition("/")[0] + "/1",
        "EFFECTQ_NAMESPACE": "renamed",
        "EFFECTQ_METRICS_PORT": "0",
    }
    done = subprocess.run(
        [sys.executable, "-m", "workers", "worker", "-p", "1", "-t", "1"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "namespace 'renamed' is new" in line and "Traceback" not in done.stderr


def test_a_ledger_written_before_versions_refuses_a_namespace_owning_none_of_its_records(
    redis_server: RedisServer,
) -> None:
    """The upgrade hole (issue 37, item 6): records of the previous release, no version
    record, no layout key. A process started under another namespace (a typo, the chart's
    default) must not decide alone that the ledger is its own: every DONE effect would be
    invisible to it and run again."""
    old = Ledger.from_url(redis_server.url, namespace="shop")
    effect = charge()
    token = old.claim(effect, lease_s=30, holder="w/1").token
    assert old.commit(effect.key, token, {"id": "ch_1"}, retention_s=600).ok
    for allow in (False, True):  # not even "a second deployment on purpose" guesses here
        with pytest.raises(LayoutChangedError, match="effectq ledger adopt --namespace"):
            ledger_from_settings(_settings(redis_server, namespace="shopp",
                                           allow_new_namespace=allow))  # fmt: skip
    assert not redis_server.client().exists(SCHEMA_KEY)
    # The namespace that owns the records is accepted, and the ledger gets its version: format
    # 1, hex names (the previous release may still run on its records).
    ledger_from_settings(_settings(redis_server, namespace="shop"))
    assert redis_server.client().hgetall(SCHEMA_KEY) == {b"format": b"1", b"ns:shop": b"256"}
    with pytest.raises(LayoutChangedError, match="is new on a ledger laid out for another"):
        ledger_from_settings(_settings(redis_server, namespace="shopp"))


def test_ledger_adopt_registers_a_namespace_on_an_operators_word_and_audits_it(
    redis_server: RedisServer,
) -> None:
    Ledger.from_url(redis_server.url, namespace="embedded").claim(charge(), lease_s=30, holder="x")
    with pytest.raises(LayoutChangedError, match="ledger adopt"):
        ledger_from_settings(_settings(redis_server, namespace="effectq"))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("EFFECTQ_")},
        "EFFECTQ_REDIS_URL": redis_server.url,
        "EFFECTQ_ALLOW_VOLATILE_LEDGER": "true",
    }
    command = [sys.executable, "-m", "workers", "ledger", "adopt", "--namespace", "effectq"]
    refused = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr  # no actor / reason
    done = subprocess.run(
        [*command, "--actor", "sre", "--reason", "upgrade 0.2", "--json"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"namespace": "effectq", "buckets": 256, "format": 1}
    ledger = ledger_from_settings(_settings(redis_server, namespace="effectq"))
    [entry] = ledger.audit_log()
    assert (entry["action"], entry["actor"], entry["reason"]) == ("ledger_adopt", "sre",
                                                                  "upgrade 0.2")  # fmt: skip


def test_a_ledger_of_a_newer_format_is_refused(redis_server: RedisServer) -> None:
    redis_server.client().hset(SCHEMA_KEY, mapping={"format": LEDGER_FORMAT + 1, "ns:shop": 256})
    with pytest.raises(LayoutChangedError, match="newer release"):
        ledger_from_settings(_settings(redis_server, namespace="shop"))
