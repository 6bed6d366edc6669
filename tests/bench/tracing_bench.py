"""Benchmark: what OpenTelemetry costs the worker path — the guarded no-op tool with
tracing off and on, alternating, in one run.

    python tests/bench/tracing_bench.py [--n N] [--rounds R] [--processes P] [--threads T]
                                        [--baseline CHECKOUT]

Built on ``worker_bench.py`` (same stack, fill, drain timing and CPU accounting; read its
docstring); the pools import ``tests.bench.traced_tools`` (``bench_tools`` with tracing set
up as ``workers.entry`` does):

* **off**: ``EFFECTQ_OTEL_ENDPOINT`` empty — what every deployment without the extra or
  the endpoint runs: each span hook is a module-global check returning a shared no-op;
* **on**: the endpoint set to an OTLP/HTTP sink in this process (it answers 200 and counts
  the bytes): four spans per message (process, claim, effect, commit), batched and
  exported by the SDK's BatchSpanProcessor.

* **base** (with ``--baseline``, e.g. ``git worktree add /tmp/effectq-base <commit>``): the
  pools run that other checkout's code (its ``tests.bench.bench_tools``, from its own
  directory) on the same stack — a build without the hooks, to measure what "off" costs.

The ratio on/off of msgs/s is the cost of tracing on; off/base the cost of the hooks off.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import redis

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from tests.bench.worker_bench import BENCH_ENV, WARMUP, Bench, Run  # noqa: E402
from workers.dev.local import LocalStack  # noqa: E402

TOOLS_MODULE = "tests.bench.traced_tools"


class Sink:
    """An OTLP/HTTP endpoint that accepts every export and counts its bytes."""

    def __init__(self) -> None:
        self.bytes = 0
        self.posts = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                sink.bytes += len(self.rfile.read(int(self.headers["Content-Length"])))
                sink.posts += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class TracingBench(Bench):
    def __init__(
        self, stack: LocalStack, processes: int, threads: int, sink: Sink, baseline: Path | None
    ) -> None:
        super().__init__(stack, processes, threads)
        self.sink = sink
        self.baseline = baseline
        self.mode = "off"

    def start_pool(self, queue: str, log: Path) -> subprocess.Popen[bytes]:
        base = self.mode == "base"
        root = self.baseline if base and self.baseline is not None else _ROOT
        module = "tests.bench.bench_tools" if base else TOOLS_MODULE
        cmd = [sys.executable, "-m", "dramatiq", module]
        cmd += ["-p", str(self.processes), "-t", str(self.threads), "-Q", queue]
        endpoint = self.sink.url if self.mode == "on" else ""
        env = self.stack.env(PYTHONPATH=str(root), EFFECTQ_OTEL_ENDPOINT=endpoint)
        with open(log, "ab") as out:
            return subprocess.Popen(
                cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip


def median(runs: list[Run], attr: str) -> float:
    return float(statistics.median(getattr(r, attr) for r in runs))


def per_msg(runs: list[Run], attr: str) -> float:
    return float(sum(getattr(r, attr) for r in runs) / sum(r.messages for r in runs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=5000, help="messages per phase")
    parser.add_argument("--rounds", type=int, default=3, help="on+off rounds")
    parser.add_argument("--processes", "-p", type=int, default=2)
    parser.add_argument("--threads", "-t", type=int, default=8)
    parser.add_argument("--baseline", type=Path, help="another checkout, run as 'base'")
    opts = parser.parse_args(argv)
    if opts.n < 10 or opts.rounds < 1:
        parser.error("--n must be at least 10 and --rounds positive")
    modes = ("on", "off", "base") if opts.baseline else ("on", "off")

    runs: dict[str, list[Run]] = {mode: [] for mode in modes}
    sink = Sink()
    wall = time.perf_counter()
    with LocalStack(env=BENCH_ENV) as stack:
        stack.apply_env()
        admin = redis.Redis.from_url(stack.ledger_url, decode_responses=True)
        admin.config_set("auto-aof-rewrite-percentage", 0)
        server = admin.info("server")
        bench = TracingBench(stack, opts.processes, opts.threads, sink, opts.baseline)
        phase = 0
        for mode in modes:  # unmeasured warm-up of each
            bench.mode = mode
            bench.phase("guarded", phase, min(WARMUP, opts.n))
            phase += 1
        exported = sink.bytes
        for rnd in range(opts.rounds):
            # Rotate which goes first, so a drift over the run does not favour one.
            for mode in modes[rnd % len(modes) :] + modes[: rnd % len(modes)]:
                bench.mode = mode
                run = bench.phase("guarded", phase, opts.n)
                run.kind, run.round = mode, rnd
                runs[mode].append(run)
                phase += 1
        exported = sink.bytes - exported
    wall = time.perf_counter() - wall

    ratio = median(runs["on"], "per_s") / median(runs["off"], "per_s")
    steady = median(runs["on"], "steady_per_s") / median(runs["off"], "steady_per_s")
    cpu = per_msg(runs["on"], "pool_cpu_s") / per_msg(runs["off"], "pool_cpu_s")
    print(
        f"effectq tracing bench: n={opts.n} per phase, {opts.rounds} rounds on/off, "
        f"-p {opts.processes} -t {opts.threads}, {os.cpu_count()} CPUs, redis-server "
        f"{server['redis_version']}, python {platform.python_version()}; wall {wall:.0f} s"
    )
    header = (
        f"{'round':>5} {'tracing':<7} {'msgs':>6} {'seconds':>8} {'msgs/s':>8} "
        f"{'steady/s':>9} {'pool cpu us':>12}"
    )
    print(header)
    print("-" * len(header))
    for r in sorted([r for rs in runs.values() for r in rs], key=lambda r: (r.round, r.kind)):
        print(
            f"{r.round:>5} {r.kind:<7} {r.messages:>6} {r.seconds:>8.2f} {r.per_s:>8.0f} "
            f"{r.steady_per_s:>9.0f} {r.pool_cpu_s / r.messages * 1e6:>12.0f}"
        )
    print("-" * len(header))
    for mode, rs in runs.items():
        print(
            f"{'med':>5} {mode:<7} {'':>6} {'':>8} {median(rs, 'per_s'):>8.0f} "
            f"{median(rs, 'steady_per_s'):>9.0f} {per_msg(rs, 'pool_cpu_s') * 1e6:>12.0f}"
        )
    print(f"OTLP bytes exported during the measured 'on' phases: {exported}")
    print(f"{'ratio on/off, msgs/s':<28} {ratio:>6.3f}")
    print(f"{'ratio on/off, steady/s':<28} {steady:>6.3f}")
    print(f"{'ratio on/off, cpu/msg':<28} {cpu:>6.3f}")
    off_base = off_base_steady = off_base_cpu = None
    if runs.get("base"):
        off_base = median(runs["off"], "per_s") / median(runs["base"], "per_s")
        off_base_steady = median(runs["off"], "steady_per_s") / median(runs["base"], "steady_per_s")
        off_base_cpu = per_msg(runs["off"], "pool_cpu_s") / per_msg(runs["base"], "pool_cpu_s")
        print(f"{'ratio off/base, msgs/s':<28} {off_base:>6.3f}")
        print(f"{'ratio off/base, steady/s':<28} {off_base_steady:>6.3f}")
        print(f"{'ratio off/base, cpu/msg':<28} {off_base_cpu:>6.3f}")
    result = {
        "bench": "tracing",
        "n": opts.n,
        "rounds": opts.rounds,
        "processes": opts.processes,
        "threads": opts.threads,
        "on_msgs_per_s": round(median(runs["on"], "per_s"), 1),
        "off_msgs_per_s": round(median(runs["off"], "per_s"), 1),
        "ratio": round(ratio, 3),
        "steady_ratio": round(steady, 3),
        "cpu_ratio": round(cpu, 3),
        "otlp_bytes": exported,
        "off_base_ratio": None if off_base is None else round(off_base, 3),
        "off_base_steady_ratio": None if off_base_steady is None else round(off_base_steady, 3),
        "off_base_cpu_ratio": None if off_base_cpu is None else round(off_base_cpu, 3),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
