"""Secrets stay out of what operators and producers see by default: worker and reconciler
logs at INFO, the metrics scrape, and the messages of errors raised to producers carry
neither a raw recipient, nor the ledger's Redis password, nor a full effect key (effectq's
own log lines cut keys to 12 characters)."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import Iterator

import dramatiq
import httpx
import pytest
import redis
from typer.testing import CliRunner

from dedupe import EffectqError, IdentityError, State
from tests.support.stack import wait_for, wait_states
from workers import Envelope, get_tool, runtime, submit
from workers.campaigns import campaign_status, submit_campaign
from workers.cli import app
from workers.dev.local import LocalStack
from workers.dev.ports import free_port

SECRET = "secret.person@leak.example"
OTHERS = ["secret.other@leak.example", "secret.third@leak.example"]
PASSWORD = "leak-test-pw-7f3a9c"
FULL_KEY = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")


@pytest.fixture
def acl_user(live: LocalStack) -> Iterator[str]:
    """A password-protected ACL user on the stack's Redis (the default user is left as it
    is, so nothing else in the session notices); yields the ledger URL with its password."""
    admin = redis.Redis.from_url(live.ledger_url)
    user = f"leak{uuid.uuid4().hex[:6]}"
    admin.execute_command("ACL", "SETUSER", user, "on", f">{PASSWORD}", "~*", "&*", "+@all")  # type: ignore[no-untyped-call]
    yield live.ledger_url.replace("redis://", f"redis://{user}:{PASSWORD}@")
    admin.execute_command("ACL", "DELUSER", user)  # type: ignore[no-untyped-call]
    admin.close()


def _leaks(text: str, keys: set[str]) -> list[str]:
    found = [s for s in (SECRET, *OTHERS, PASSWORD, "secret.person", "leak.example") if s in text]
    found += [k[:16] + "…" for k in keys if k in text]
    return found


def test_pipeline_logs_and_metrics_carry_no_recipient_password_or_full_key(
    live: LocalStack, acl_user: str
) -> None:
    env = {"EFFECTQ_REDIS_URL": acl_user}
    reconciler_port, pool_port = free_port(), free_port()
    live.start_reconciler(interval=0.3, EFFECTQ_METRICS_PORT=str(reconciler_port), **env)
    # One effect whose worker dies right after the provider executed it: the reconciler
    # takes the expired claim over and settles it from the provider's lookup.
    crashing = live.start_workers(1, 2, EFFECTQ_FAILPOINTS="after_effect=kill", **env)
    crashed = submit("send_email", scope="leak-crash", recipient=SECRET)
    wait_states(runtime.ledger(), [crashed.key], timeout=60)
    live.stop_pool(crashing)
    pool = live.start_workers(1, 2, EFFECTQ_METRICS_PORT=str(pool_port), **env)
    handles = [submit("send_email", scope=f"leak-{i}", recipient=SECRET) for i in range(3)]
    handles.append(submit("send_email", scope="leak-0", recipient=SECRET))  # a duplicate
    report = submit_campaign(f"leak-campaign-{uuid.uuid4().hex[:6]}", "send_email", OTHERS)
    assert report.sent == len(OTHERS)
    for handle in handles:
        handle.wait(30)
    keys = {crashed.key, *(h.key for h in handles)}
    status = campaign_status(report.campaign_id)
    keys |= {row["key"] for row in status["recipients"]}
    wait_states(runtime.ledger(), keys, timeout=60)
    record = runtime.ledger().get(crashed.key)
    # The crash happened: the record was taken over (token 2) and settled from the lookup.
    assert record is not None and record.state is State.DONE and record.token >= 2

    def scrape(port: int) -> str:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text

    wait_for(lambda: "effectq_ledger_up 1.0" in scrape(pool_port), what="pool metrics")
    scrapes = scrape(pool_port) + scrape(reconciler_port)
    assert "effectq_" in scrapes
    workers_log, reconciler_log = live.log("workers.log"), live.log("reconciler.log")
    assert reconciler_log.strip(), "the reconciler logged its decision"
    assert pool.poll() is None
    for name, text in (("workers.log", workers_log), ("reconciler.log", reconciler_log),
                       ("metrics", scrapes)):  # fmt: skip
        assert not _leaks(text, keys), (name, _leaks(text, keys))
        assert not FULL_KEY.findall(text), (name, FULL_KEY.findall(text)[:3])
    # Keys appear cut to 12 characters where effectq logs one.
    assert crashed.key[:12] in reconciler_log


def test_errors_shown_to_producers_name_no_recipient(live: LocalStack) -> None:
    bad = ["secret.person@leak", "secret person@leak.example", "secret.person"]
    for recipient in bad:
        with pytest.raises(IdentityError) as caught:
            submit("send_email", scope="leak-bad", recipient=recipient)
        assert "secret" not in str(caught.value) and "secret" not in repr(caught.value.details)
        result = CliRunner().invoke(
            app, ["submit", "send_email", "--scope", "leak-bad", "--arg", f"recipient={recipient}"]
        )
        assert result.exit_code == 2 and "secret" not in result.output + result.stderr
    # A conflict names the key, never the bound fields' values.
    first = submit("charge", scope="leak-order", customer="secret-customer", amount="1.00",
                   currency="usd")  # fmt: skip
    second = submit("charge", scope="leak-order", customer="secret-customer", amount="2.00",
                    currency="usd")  # fmt: skip
    assert second.status.value == "conflict"
    with pytest.raises(EffectqError) as refused:
        second.wait(1)
    assert "secret" not in str(refused.value) and first.key == refused.value.key
    # A campaign whose recipients are all invalid: the rejection reasons name indexes.
    with pytest.raises(EffectqError) as rejected:
        submit_campaign("leak-bad-campaign", "send_email", ["secret.person", "secret@nodot"])
    assert "secret" not in str(rejected.value)


def test_a_wrong_ledger_password_is_not_echoed(live: LocalStack, acl_user: str) -> None:
    wrong = acl_user.replace(PASSWORD, "wrong-" + PASSWORD)
    proc = subprocess.run(
        [sys.executable, "-m", "workers", "worker", "-p", "1"],
        env=live.env(EFFECTQ_REDIS_URL=wrong), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr  # a configuration error, not an outage
    assert "refused the credentials" in proc.stderr
    assert PASSWORD not in proc.stdout + proc.stderr


def test_a_dead_lettered_message_does_not_put_its_recipient_in_the_worker_log(
    live: LocalStack,
) -> None:
    live.start_workers(1, 2)
    tool = get_tool("send_email")
    envelope = Envelope.of(tool.derive("leak-dead", {"recipient": SECRET})).model_dump()
    envelope["key"] = "0" * 64  # does not match: dead-lettered, never executed
    runtime.broker().enqueue(
        dramatiq.Message(
            queue_name="effectq", actor_name="send_email", args=(envelope,), kwargs={},
            options={},
        )
    )  # fmt: skip
    ledger = runtime.ledger()
    wait_for(lambda: ledger.dead_letters(), what="dead-letter")
    wait_for(lambda: "dead-lettered" in live.log("workers.log"), what="dead-letter logged")
    assert live.stats()["total"] == 0
    assert SECRET not in ledger.dead_letters()[0]["reason"]
    assert SECRET not in live.log("workers.log")
