"""Benchmark: what metrics cost the worker path — the guarded no-op tool with metrics on
and off, alternating, in one run.

    python tests/bench/metrics_bench.py [--n N] [--rounds R] [--processes P] [--threads T]
                                        [--scrape-interval S] [--binary embedded|system]

Built on ``worker_bench.py`` (same stack, same fill, same drain timing, same CPU and
command accounting; read its docstring), with one phase kind, ``guarded``, run two ways:

* **on**: what a supervised pool does — ``PROMETHEUS_MULTIPROC_DIR`` set for the pool (a
  fresh directory per phase), the worker path's counters and histograms written to the
  per-process mmap files, and the pool's endpoint collected every ``--scrape-interval``
  seconds (default 1 s; Prometheus's default is 15 s) by this process, exactly as the
  supervisor serves it: the sum over the directory plus the ledger's and broker's series
  read from Redis (its commands land in the phase's command counts);
* **off**: ``EFFECTQ_METRICS_ENABLED=false`` — the hooks are bound to no-ops, no directory.

The ratio on/off of msgs/s is the cost; CPU per message tells where it goes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from tests.bench.worker_bench import (  # noqa: E402
    BENCH_ENV,
    TOOLS_MODULE,
    WARMUP,
    Bench,
    Run,
)
from workers.dev.local import LocalStack  # noqa: E402


class MetricsBench(Bench):
    """``Bench`` whose pools run with metrics on or off."""

    def __init__(self, stack: LocalStack, processes: int, threads: int, scrape_s: float) -> None:
        super().__init__(stack, processes, threads)
        self.scrape_s = scrape_s
        self.on = False
        self.scrapes = 0
        self.counted: float | None = None  # what the last 'on' phase's metrics counted
        self._dir: Path | None = None
        self._stop = threading.Event()
        self._scraper: threading.Thread | None = None

    def start_pool(self, queue: str, log: Path) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "dramatiq", TOOLS_MODULE]
        cmd += ["-p", str(self.processes), "-t", str(self.threads), "-Q", queue]
        path = os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")]))
        env = self.stack.env(PYTHONPATH=path)
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        if self.on:
            self._dir = Path(tempfile.mkdtemp(prefix="effectq-bench-metrics-"))
            env.update(PROMETHEUS_MULTIPROC_DIR=str(self._dir), EFFECTQ_METRICS_ENABLED="true")
            self._start_scraper(self._dir)
        else:
            env["EFFECTQ_METRICS_ENABLED"] = "false"
        with open(log, "ab") as out:
            return subprocess.Popen(
                cmd, cwd=_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def _start_scraper(self, directory: Path) -> None:
        from prometheus_client import generate_latest

        from workers import runtime
        from workers.metrics import server

        source = server.exposition(
            runtime.ledger, multiprocess_dir=str(directory), queues=["effectq"]
        )
        self._stop.clear()

        def scrape() -> None:
            while not self._stop.wait(self.scrape_s):
                generate_latest(source)  # type: ignore[arg-type]
                self.scrapes += 1

        self._scraper = threading.Thread(target=scrape, name="scraper", daemon=True)
        self._scraper.start()

    def stop_pool(self, pool: subprocess.Popen[bytes]) -> None:
        Bench.stop_pool(pool)
        self._stop.set()
        if self._scraper is not None:
            self._scraper.join()
            self._scraper = None
        if self._dir is not None:
            from prometheus_client import CollectorRegistry
            from prometheus_client.multiprocess import MultiProcessCollector

            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=str(self._dir))
            self.counted = registry.get_sample_value(
                "effectq_effects_total", {"tool": "bench_noop", "outcome": "succeeded"}
            )
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def median(runs: list[Run], attr: str) -> float:
    return statistics.median(getattr(r, attr) for r in runs)


def per_msg(runs: list[Run], attr: str) -> float:
    return sum(getattr(r, attr) for r in runs) / sum(r.messages for r in runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=10000, help="messages per phase")
    parser.add_argument("--rounds", type=int, default=3, help="on+off rounds")
    parser.add_argument("--processes", "-p", type=int, default=2)
    parser.add_argument("--threads", "-t", type=int, default=8)
    parser.add_argument("--scrape-interval", type=float, default=1.0, help="seconds")
    parser.add_argument("--binary", choices=("embedded", "system"), default="embedded")
    opts = parser.parse_args(argv)
    if opts.n < 10 or opts.rounds < 1:
        parser.error("--n must be at least 10 and --rounds positive")

    runs: dict[str, list[Run]] = {"on": [], "off": []}
    scrapes = 0
    wall = time.perf_counter()
    with LocalStack(embedded=opts.binary == "embedded", env=BENCH_ENV) as stack:
        stack.apply_env()
        admin = redis.Redis.from_url(stack.ledger_url, decode_responses=True)
        admin.config_set("auto-aof-rewrite-percentage", 0)
        server = admin.info("server")
        bench = MetricsBench(stack, opts.processes, opts.threads, opts.scrape_interval)
        phase = 0
        for mode in ("on", "off"):  # unmeasured warm-up of both
            bench.on = mode == "on"
            bench.phase("guarded", phase, min(WARMUP, opts.n))
            phase += 1
        for rnd in range(opts.rounds):
            # Alternate which goes first, so a drift over the run does not favour one.
            for mode in ("on", "off") if rnd % 2 == 0 else ("off", "on"):
                bench.on = mode == "on"
                before = bench.scrapes
                bench.counted = None
                run = bench.phase("guarded", phase, opts.n)
                if bench.on and bench.counted != opts.n:
                    raise RuntimeError(f"metrics counted {bench.counted} of {opts.n} effects")
                run.kind = mode
                run.round = rnd
                runs[mode].append(run)
                scrapes += bench.scrapes - before
                phase += 1
    wall = time.perf_counter() - wall

    ratio = median(runs["on"], "per_s") / median(runs["off"], "per_s")
    steady = median(runs["on"], "steady_per_s") / median(runs["off"], "steady_per_s")
    print(
        f"effectq metrics bench: n={opts.n} per phase, {opts.rounds} rounds on/off, "
        f"-p {opts.processes} -t {opts.threads}, {os.cpu_count()} CPUs, redis-server "
        f"{server['redis_version']} ({opts.binary}), python {platform.python_version()}; "
        f"on: multiprocess mode + a scrape every {opts.scrape_interval:g} s; wall {wall:.0f} s"
    )
    print()
    header = (
        f"{'round':>5} {'metrics':<7} {'msgs':>6} {'seconds':>8} {'msgs/s':>8} {'steady/s':>9} "
        f"{'cmds/msg':>9} {'pool cpu us':>12} {'redis us':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in sorted([*runs["on"], *runs["off"]], key=lambda r: (r.round, r.kind)):
        print(
            f"{r.round:>5} {r.kind:<7} {r.messages:>6} {r.seconds:>8.2f} {r.per_s:>8.0f} "
            f"{r.steady_per_s:>9.0f} {r.cmds / r.messages:>9.2f} "
            f"{r.pool_cpu_s / r.messages * 1e6:>12.0f} {r.redis_cpu_s / r.messages * 1e6:>9.0f}"
        )
    print("-" * len(header))
    for mode in ("on", "off"):
        rs = runs[mode]
        print(
            f"{'med':>5} {mode:<7} {'':>6} {'':>8} {median(rs, 'per_s'):>8.0f} "
            f"{median(rs, 'steady_per_s'):>9.0f} {per_msg(rs, 'cmds'):>9.2f} "
            f"{per_msg(rs, 'pool_cpu_s') * 1e6:>12.0f} {per_msg(rs, 'redis_cpu_s') * 1e6:>9.0f}"
        )
    print()
    print(f"scrapes during the measured 'on' phases: {scrapes}")
    print(f"{'ratio on/off, msgs/s':<28} {ratio:>6.3f}")
    print(f"{'ratio on/off, steady/s':<28} {steady:>6.3f}")
    result = {
        "bench": "metrics",
        "n": opts.n,
        "rounds": opts.rounds,
        "processes": opts.processes,
        "threads": opts.threads,
        "scrape_interval_s": opts.scrape_interval,
        "on_msgs_per_s": round(median(runs["on"], "per_s"), 1),
        "off_msgs_per_s": round(median(runs["off"], "per_s"), 1),
        "ratio": round(ratio, 3),
        "steady_ratio": round(steady, 3),
        "on_pool_cpu_us_per_msg": round(per_msg(runs["on"], "pool_cpu_s") * 1e6, 1),
        "off_pool_cpu_us_per_msg": round(per_msg(runs["off"], "pool_cpu_s") * 1e6, 1),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
