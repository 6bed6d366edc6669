"""Campaign fan-out vs naive loops, one run, on one durable redis-server.

    python tests/bench/campaign_bench.py [--n 50000] [--rounds 2]

Phases, alternating each round, each on an empty broker:
  fan-out      submit_campaign(): normalize + derive every recipient, freeze the plan,
               pipelined ledger submit checks and pipelined enqueue (Dramatiq's own script)
  send loop    the same messages, one ``actor.send`` each (no ledger, no plan)
  submit loop  ``submit()`` per recipient (ledger check + enqueue, one call each)
Ends with one line of JSON.
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

TEMPLATE = {"subject": "Spring sale", "body": "Hello from the bench"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=2)
    opts = parser.parse_args()
    with LocalStack() as stack:
        stack.apply_env()
        from dedupe import derive
        from workers import Envelope, get_tool, submit
        from workers.campaign import submit_campaign
        from workers.examples import send_email

        broker_db = redis.Redis.from_url(stack.broker_url)
        rates: dict[str, list[float]] = {"fan-out": [], "send loop": [], "submit loop": []}
        for rnd in range(opts.rounds):
            people = [f"r{rnd}-{i}@example.com" for i in range(opts.n)]
            for phase in rates:
                broker_db.flushdb()
                campaign = f"bench-{rnd}-{phase.replace(' ', '-')}"
                started = time.perf_counter()
                if phase == "fan-out":
                    report = submit_campaign(campaign, "send_email", people, TEMPLATE)
                    assert report.sent == opts.n
                elif phase == "send loop":
                    for who in people:
                        effect = derive(send_email.spec, campaign, {**TEMPLATE, "recipient": who})
                        send_email.actor.send(Envelope.of(effect).model_dump())
                else:
                    for who in people:
                        submit(get_tool("send_email"), scope=campaign, recipient=who, **TEMPLATE)
                elapsed = time.perf_counter() - started
                queued = broker_db.hlen("dramatiq:effectq.msgs")
                assert queued == opts.n, (phase, queued)
                rates[phase].append(opts.n / elapsed)
                print(f"round {rnd} {phase:<12} {opts.n / elapsed:>9,.0f} recipients/s")
        med = {phase: statistics.median(values) for phase, values in rates.items()}
        print()
        for phase, rate in med.items():
            print(f"median {phase:<12} {rate:>9,.0f} recipients/s")
        ratio_send = med["fan-out"] / med["send loop"]
        ratio_submit = med["fan-out"] / med["submit loop"]
        print(f"fan-out / send loop    {ratio_send:.2f}x   (goal >= 4)")
        print(f"fan-out / submit loop  {ratio_submit:.2f}x")
        print(json.dumps({
            "bench": "campaign", "n": opts.n, "rounds": opts.rounds,
            "fanout_per_s": round(med["fan-out"], 1),
            "send_loop_per_s": round(med["send loop"], 1),
            "submit_loop_per_s": round(med["submit loop"], 1),
            "ratio_vs_send_loop": round(ratio_send, 2),
            "ratio_vs_submit_loop": round(ratio_submit, 2),
        }))  # fmt: skip


if __name__ == "__main__":
    main()
