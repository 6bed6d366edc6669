"""The suite's pipeline fixtures with the broker on RabbitMQ (this machine's node,
``EFFECTQ_TEST_RABBITMQ`` or amqp://guest:guest@127.0.0.1:5672).

``stack`` is overridden for this package: a ledger Redis and a sandbox of its own, and a
vhost of its own on the node (made with ``rabbitmqctl``, deleted with its queues at the
end), so runs never see each other's messages. The root ``live`` and ``fenceless`` — the
fixtures the reused test bodies ask for — then run on it; ``live`` here also empties the
vhost's queues before each test. Afterwards this process is pointed back at whatever it
was configured for before (the session's Redis stack, for the packages after this one).

No reachable node, or no ``rabbitmqctl`` that can manage it: skipped with the reason, a
failure under CI=true.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import dramatiq
import pika  # type: ignore[import-untyped]
import pika.exceptions  # type: ignore[import-untyped]
import pytest

from tests.support.requires import need_binary, unavailable
from workers import runtime
from workers.dev.local import LocalStack

NODE = os.environ.get("EFFECTQ_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672")


def _unreachable() -> str | None:
    params = pika.URLParameters(f"{NODE}/%2F?connection_attempts=1&socket_timeout=2")
    try:
        pika.BlockingConnection(params).close()
    except pika.exceptions.AMQPError as exc:
        return (
            f"no RabbitMQ answering at {params.host}:{params.port} ({type(exc).__name__}): "
            "start one (rabbitmq-server -detached) or set EFFECTQ_TEST_RABBITMQ"
        )
    ctl = need_binary("rabbitmqctl", "RabbitMQ's admin CLI: each run makes a vhost of its own")
    done = subprocess.run([ctl, "-q", "list_vhosts"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return f"rabbitmqctl cannot manage the node: {(done.stderr or done.stdout).strip()[:200]}"
    return None


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    problem = _unreachable()
    if problem is not None:
        unavailable(problem)
    before = {k: v for k, v in os.environ.items() if k.startswith("EFFECTQ_")}
    encoder = dramatiq.get_encoder()
    try:
        with LocalStack(rabbitmq=NODE, workdir=tmp_path_factory.mktemp("rabbitmq")) as local:
            local.apply_env()
            import workers.examples  # noqa: F401  (declares the tools, if no test did yet)

            yield local
            runtime.broker().close()  # before its vhost goes
    finally:
        for key in [k for k in os.environ if k.startswith("EFFECTQ_")]:
            del os.environ[key]
        os.environ.update(before)
        dramatiq.set_encoder(encoder)
        runtime.rebind()


@pytest.fixture
def live(live: LocalStack) -> LocalStack:
    """The root ``live`` (ledger flushed, sandbox reset), and the queues emptied: once the
    last test's workers are gone — their unacked messages back in the queues — purged."""
    queue = runtime.current().settings.queue
    # A connection of its own: the producer's may have been closed for missed heartbeats.
    with pika.BlockingConnection(pika.URLParameters(live.broker_url)) as connection:
        deadline = time.monotonic() + 30
        for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
            channel = connection.channel()
            try:
                while channel.queue_declare(name, passive=True).method.consumer_count:
                    assert time.monotonic() < deadline, f"consumers still on {name}"
                    time.sleep(0.05)
            except pika.exceptions.ChannelClosedByBroker as exc:
                if exc.reply_code != 404:
                    raise
                continue  # not declared yet (or deleted by a test): nothing in it
            channel.queue_purge(name)
            channel.close()
    return live
