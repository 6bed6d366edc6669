"""A worker, reconciler or API refuses a ledger laid out otherwise: a changed namespace or
bucket count on a ledger that holds records would make every recorded effect invisible,
and let it run again (UPGRADING, "the settings that must never change")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dedupe import LayoutChangedError, Ledger
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


def test_a_ledger_shared_with_namespaces_that_never_registered_is_not_refused(
    redis_server: RedisServer,
) -> None:
    # Keys of other namespaces, none with a layout (embedding code, 0.1.0): not a rename.
    Ledger.from_url(redis_server.url, namespace="embedded").claim(charge(), lease_s=30, holder="x")
    ledger_from_settings(_settings(redis_server, namespace="effectq"))
