"""Campaign fan-out on RabbitMQ against Redis, one run.

    python tests/bench/fanout_rabbitmq_bench.py [--n 10000] [--rounds 2]

Two stacks: the Redis broker in its durable redis-server (AOF, ``appendfsync always``), and
RabbitMQ — this machine's node, a vhost of the bench's own (``rabbitmqctl``), durable
queues and persistent messages. Phases, alternating each round, each on an empty queue:

  enqueue_many   workers/fanout.py alone, on N prepared messages: on Redis the broker's
                 dispatch script over a pipeline, on RabbitMQ one AMQP transaction per
                 1,000 messages
  confirm loop   RabbitMQ only: ``broker.enqueue`` per message, each waiting for its
                 publisher confirm (Dramatiq's own path; what fan-out would cost without
                 transactions)
  campaign       ``submit_campaign``: derive every recipient, freeze the plan, pipelined
                 ledger checks, then the fan-out

Every phase checks that the broker holds exactly N messages afterwards. Ends with one line
of JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from workers.dev.local import LocalStack

NODE = "amqp://guest:guest@127.0.0.1:5672"
TEMPLATE = {"subject": "Spring sale", "body": "Hello from the bench"}


PHASES = (
    ("redis", "enqueue_many"), ("rabbitmq", "enqueue_many"), ("rabbitmq", "confirm loop"),
    ("redis", "campaign"), ("rabbitmq", "campaign"),
)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    opts = parser.parse_args()
    with LocalStack() as on_redis, LocalStack(rabbitmq=NODE) as on_rabbitmq:
        on_redis.apply_env()
        from workers import Envelope, runtime
        from workers.broker.fanout import enqueue_many
        from workers.campaigns import submit_campaign
        from workers.examples import send_email

        stacks = {"redis": on_redis, "rabbitmq": on_rabbitmq}
        assert on_rabbitmq.vhost is not None
        vhost = on_rabbitmq.vhost

        def held(broker: str) -> int:
            if broker == "rabbitmq":
                return vhost.queue_messages().get("effectq", 0)
            return int(redis.Redis.from_url(on_redis.broker_url).hlen("dramatiq:effectq.msgs"))

        def phase(broker: str, how: str, scope: str) -> float:
            """Seconds for ``how`` to put N messages on ``broker``'s empty queue."""
            stacks[broker].apply_env()
            if broker == "rabbitmq":
                runtime.broker().flush("effectq")
            else:
                redis.Redis.from_url(on_redis.broker_url).flushdb()
            if how == "campaign":
                people = [f"{scope}-{i}@example.com" for i in range(opts.n)]
                started = time.perf_counter()
                assert submit_campaign(scope, "send_email", people, TEMPLATE).sent == opts.n
                return time.perf_counter() - started
            messages = [
                send_email.actor.message(
                    Envelope.of(
                        send_email.derive(scope, {**TEMPLATE, "recipient": f"r{i}@example.com"})
                    ).model_dump()
                )
                for i in range(opts.n)
            ]
            started = time.perf_counter()
            if how == "confirm loop":
                for message in messages:
                    runtime.broker().enqueue(message)
            else:
                enqueue_many(runtime.broker(), messages)
            return time.perf_counter() - started

        rates: dict[str, list[float]] = {f"{b} {how}": [] for b, how in PHASES}
        for rnd in range(opts.rounds):
            for broker, how in PHASES:
                name = f"{broker} {how}"
                elapsed = phase(broker, how, f"bench-{rnd}-{broker}-{how.replace(' ', '-')}")
                assert held(broker) == opts.n, (name, held(broker))
                rates[name].append(opts.n / elapsed)
                print(f"round {rnd} {name:<22} {opts.n / elapsed:>9,.0f} msgs/s", flush=True)
        runtime.broker().close()
        med = {name: statistics.median(values) for name, values in rates.items()}
        print()
        for name, rate in med.items():
            print(f"median {name:<22} {rate:>9,.0f} msgs/s")
        fan_ratio = med["rabbitmq enqueue_many"] / med["redis enqueue_many"]
        tx_ratio = med["rabbitmq enqueue_many"] / med["rabbitmq confirm loop"]
        print(f"rabbitmq / redis enqueue_many        {fan_ratio:.2f}x")
        print(f"rabbitmq transactions / confirm loop {tx_ratio:.2f}x")
        print(json.dumps({
            "bench": "fanout_rabbitmq", "n": opts.n, "rounds": opts.rounds,
            "rabbitmq_fanout_per_s": round(med["rabbitmq enqueue_many"], 1),
            "redis_fanout_per_s": round(med["redis enqueue_many"], 1),
            "rabbitmq_confirm_loop_per_s": round(med["rabbitmq confirm loop"], 1),
            "rabbitmq_campaign_per_s": round(med["rabbitmq campaign"], 1),
            "redis_campaign_per_s": round(med["redis campaign"], 1),
            "rabbitmq_vs_redis_fanout": round(fan_ratio, 2),
            "transactions_vs_confirm_loop": round(tx_ratio, 2),
        }))  # fmt: skip


if __name__ == "__main__":
    main()
