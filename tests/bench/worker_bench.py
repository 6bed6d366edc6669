"""Benchmark: a guarded no-op effect tool against a bare Dramatiq actor on the same broker.

    python tests/bench/worker_bench.py [--n N] [--rounds R] [--processes P] [--threads T]
                                       [--binary embedded|system]
                                       [--appendfsync always|everysec]

One run starts a ``LocalStack`` (its durable redis-server: AOF, ``appendfsync always`` unless
``--appendfsync everysec``, the production setting; the ledger in db 0, the broker in db 1;
automatic AOF rewrite switched off so a rewrite cannot land inside one phase only) and then,
per round, guarded then bare:

1. fills the phase's queue with N messages (pipelined, through the broker's own enqueue
   script; the producer API's per-call ledger check is not what is measured). Guarded
   messages are ``bench_noop`` envelopes for a fresh scope, so every one is a first
   execution; the bare actor gets envelopes of the same shape and size;
2. starts ``python -m dramatiq tests.bench.bench_tools -p P -t T -Q <queue>`` (Dramatiq's
   default prefetch, effectq's broker defaults: heartbeat 60 s, maintenance 1000 per million);
3. polls ``HLEN dramatiq:<queue>.msgs`` (a message leaves that hash when it is acked) every
   5 ms. The clock starts at the first poll that sees an ack — pool boot (imports, connect)
   is reported apart, not timed — and stops when the hash is empty. Rate = messages acked
   inside that window / its length; "steady" is the rate between 10 % and 90 % acked;
4. stops the pool (SIGTERM) and checks that nothing was retried or dead-lettered and that
   the guarded effects are DONE in the ledger.

Redis commands per message come from ``INFO commandstats`` deltas over the same window,
without the bench's own polling (INFO, HLEN — no worker sends either). Redis counts the
commands a Lua script runs there too, so "cmds" is server work; "calls" counts the
top-level commands only (script calls plus connection commands: every data command of the
worker path runs inside the broker's or the ledger's script); "reads" counts the socket
reads the server processed (``total_reads_processed``, the bench's own commands taken off):
the round trips, where several pipelined calls arrive in one read. CPU per message: the pool's
processes (psutil) and redis-server (``INFO cpu``) over the window.

The table comes first; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dramatiq
import psutil
import redis
import redis.utils

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from tests.bench._common import add_stack_options  # noqa: E402
from workers.broker.fanout import enqueue_many  # noqa: E402
from workers.dev.local import LocalStack  # noqa: E402
from workers.settings import Settings  # noqa: E402

TOOLS_MODULE = "tests.bench.bench_tools"
POLL_S = 0.005
WARMUP = 1000
GOAL = 0.9
DRAIN_TIMEOUT_S = 300.0
# The pools run with effectq's production broker settings, not LocalStack's fast-failover
# ones (a 20 % maintenance chance would add a KEYS scan to every fifth broker call).
BENCH_ENV = {
    "EFFECTQ_BROKER_HEARTBEAT_TIMEOUT_MS": str(
        Settings.model_fields["broker_heartbeat_timeout_ms"].default
    ),
    "EFFECTQ_BROKER_MAINTENANCE_CHANCE": str(
        Settings.model_fields["broker_maintenance_chance"].default
    ),
    "EFFECTQ_FAILPOINTS": "",
}
# Commands the bench itself sends while a phase runs; the workers send neither.
_OWN_COMMANDS = {"info", "hlen"}
# Top-level commands: the client sends them. Everything else is run by a script.
_SCRIPT_COMMANDS = {"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"}
_SESSION_COMMANDS = {"hello", "ping", "select", "auth", "client", "script", "quit", "reset"}

Stats = dict[str, int]  # command -> calls


def commandstats(client: redis.Redis) -> Stats:
    stats: dict[str, Any] = client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): int(v["calls"])
        for name, v in stats.items()
        if isinstance(v, dict)
    }


def reads_processed(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("stats")
    return int(stats["total_reads_processed"])


def redis_cpu_s(client: redis.Redis) -> float:
    cpu: dict[str, Any] = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and all its live descendants."""
    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return total
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


def is_top_level(command: str) -> bool:
    base = command.split("|", 1)[0]
    return base in _SCRIPT_COMMANDS or base in _SESSION_COMMANDS


@dataclass
class Sample:
    """Server and pool counters at one instant."""

    t: float
    commands: Stats
    redis_cpu: float
    pool_cpu: float
    reads: int

    @classmethod
    def take(cls, client: redis.Redis, pool_pid: int) -> Sample:
        commands, redis_cpu = commandstats(client), redis_cpu_s(client)
        reads = reads_processed(client)
        return cls(time.perf_counter(), commands, redis_cpu, tree_cpu_s(pool_pid), reads)


@dataclass
class Run:
    """One drained queue."""

    kind: str
    round: int
    messages: int
    seconds: float
    boot_s: float
    steady_per_s: float
    pool_cpu_s: float
    redis_cpu_s: float
    reads: int
    commands: Stats = field(default_factory=dict)

    @property
    def per_s(self) -> float:
        return self.messages / self.seconds

    @property
    def cmds(self) -> int:
        return sum(self.commands.values())

    @property
    def calls(self) -> int:
        return sum(calls for name, calls in self.commands.items() if is_top_level(name))


class Bench:
    """The stack, the broker client and the two actors; one ``phase`` per drained queue."""

    def __init__(self, stack: LocalStack, processes: int, threads: int) -> None:
        from dramatiq.brokers.redis import RedisBroker

        from tests.bench import bench_tools
        from workers import runtime

        self.stack = stack
        self.processes = processes
        self.threads = threads
        self.tools = bench_tools
        broker = runtime.broker()
        if not isinstance(broker, RedisBroker):
            raise SystemExit(f"the worker bench needs a Redis broker, got {type(broker).__name__}")
        self.broker = broker
        self.ledger = runtime.ledger()
        self.client = redis.Redis.from_url(stack.broker_url, decode_responses=True)
        self.run_id = uuid.uuid4().hex[:8]
        self.log_dir = stack.workdir

    # -- queues ------------------------------------------------------------------------

    def queue_of(self, kind: str) -> str:
        actor = self.tools.bench_noop.actor if kind == "guarded" else self.tools.bench_bare
        return str(actor.queue_name)

    def _hash(self, queue: str) -> str:
        return f"{self.broker.namespace}:{queue}.msgs"

    def leftovers(self, queue: str) -> dict[str, int]:
        return {
            "live": int(self.client.hlen(self._hash(queue))),
            "delayed": int(self.client.hlen(self._hash(f"{queue}.DQ"))),
            "dead": int(self.client.hlen(self._hash(f"{queue}.XQ"))),
        }

    def fill(self, kind: str, scope: str, n: int) -> list[str]:
        """Enqueue n messages for ``scope``; return the guarded effects' keys."""
        from workers.tool import Envelope

        tool = self.tools.bench_noop
        actor = tool.actor if kind == "guarded" else self.tools.bench_bare
        keys: list[str] = []
        messages = []
        for i in range(n):
            effect = tool.derive(scope, {"n": i})
            keys.append(effect.key)
            messages.append(actor.message(Envelope.of(effect).model_dump()))
        # Dramatiq's own enqueue script, pipelined (what campaigns use too).
        enqueue_many(self.broker, messages)
        return keys

    # -- pools -------------------------------------------------------------------------

    def start_pool(self, queue: str, log: Path) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "dramatiq", TOOLS_MODULE]
        cmd += ["-p", str(self.processes), "-t", str(self.threads), "-Q", queue]
        path = os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")]))
        env = self.stack.env(PYTHONPATH=path)
        with open(log, "ab") as out:
            return subprocess.Popen(
                cmd,
                cwd=_ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @staticmethod
    def stop_pool(pool: subprocess.Popen[bytes]) -> None:
        if pool.poll() is None:
            pool.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            pool.wait(timeout=30)
        # The session is the process group: nothing of a pool outlives its phase.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pool.pid, signal.SIGKILL)
        pool.wait()

    # -- one phase ---------------------------------------------------------------------

    def phase(self, kind: str, rnd: int, n: int) -> Run:
        queue = self.queue_of(kind)
        scope = f"bench-{self.run_id}-{kind}-{rnd}"
        keys = self.fill(kind, scope, n)
        if (held := self.leftovers(queue)) != {"live": n, "delayed": 0, "dead": 0}:
            raise RuntimeError(f"{queue}: expected {n} queued messages, found {held}")
        pending = self._hash(queue)
        log = self.log_dir / f"pool-{kind}-{rnd}.log"
        client = self.client
        pool = self.start_pool(queue, log)
        try:
            started = time.perf_counter()
            deadline = time.monotonic() + DRAIN_TIMEOUT_S
            first: Sample | None = None
            left_first = n
            trace: list[tuple[float, int]] = []
            while True:
                left = int(client.hlen(pending))
                now = time.perf_counter()
                if first is None and left < n:
                    first = Sample.take(client, pool.pid)
                    left_first = int(client.hlen(pending))
                    now = first.t = time.perf_counter()
                    left = left_first
                    if left_first == 0:
                        raise RuntimeError(f"{kind}: drained before the first poll; raise --n")
                trace.append((now, left))
                if left == 0:
                    break
                if pool.poll() is not None:
                    raise RuntimeError(f"{kind} pool exited with {pool.returncode}:\n{tail(log)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{kind}: {left} of {n} messages left after {DRAIN_TIMEOUT_S}s"
                    )
                time.sleep(POLL_S)
            end = Sample.take(client, pool.pid)
            end.t = now
        finally:
            self.stop_pool(pool)
        assert first is not None
        if (held := self.leftovers(queue)) != {"live": 0, "delayed": 0, "dead": 0}:
            raise RuntimeError(f"{queue}: messages retried or dead-lettered: {held}\n{tail(log)}")
        if kind == "guarded":
            self.check_done(keys)
        delta = {
            name: calls - first.commands.get(name, 0)
            for name, calls in end.commands.items()
            if calls - first.commands.get(name, 0)
        }
        commands = {name: calls for name, calls in delta.items() if name not in _OWN_COMMANDS}
        # Each of the bench's own commands (not pipelined) is one read (give or take the
        # samples' own INFOs: a few per phase).
        own = sum(calls for name, calls in delta.items() if name in _OWN_COMMANDS)
        return Run(
            kind=kind,
            round=rnd,
            messages=left_first,
            seconds=end.t - first.t,
            boot_s=first.t - started,
            steady_per_s=steady_rate(trace, n),
            pool_cpu_s=end.pool_cpu - first.pool_cpu,
            redis_cpu_s=end.redis_cpu - first.redis_cpu,
            reads=end.reads - first.reads - own,
            commands=commands,
        )

    def check_done(self, keys: list[str]) -> None:
        step = max(1, len(keys) // 100)
        for key in [*keys[::step], keys[-1]]:
            record = self.ledger.get(key)
            if record is None or record.state.value != "DONE":
                raise RuntimeError(f"effect {key[:12]} is {record.state if record else 'ABSENT'}")


def steady_rate(trace: list[tuple[float, int]], n: int) -> float:
    """Acks per second between the first polls that saw 10 % and 90 % of n acked."""
    lo = next((t, n - left) for t, left in trace if n - left >= n * 0.1)
    hi = next((t, n - left) for t, left in trace if n - left >= n * 0.9)
    return (hi[1] - lo[1]) / (hi[0] - lo[0]) if hi[0] > lo[0] else float("nan")


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


@dataclass
class Summary:
    """The rounds of one phase kind."""

    kind: str
    runs: list[Run]

    @property
    def median_per_s(self) -> float:
        return statistics.median(r.per_s for r in self.runs)

    @property
    def median_steady(self) -> float:
        return statistics.median(r.steady_per_s for r in self.runs)

    @property
    def messages(self) -> int:
        return sum(r.messages for r in self.runs)

    def per_msg(self, attr: str) -> float:
        return sum(getattr(r, attr) for r in self.runs) / self.messages

    def breakdown(self) -> str:
        total: dict[str, int] = {}
        for r in self.runs:
            for name, calls in r.commands.items():
                total[name] = total.get(name, 0) + calls
        parts = sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))
        return " ".join(
            f"{name}={calls / self.messages:.3g}"
            for name, calls in parts
            if calls / self.messages >= 0.001
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=20000, help="messages per phase")
    parser.add_argument("--rounds", type=int, default=2, help="guarded+bare rounds")
    parser.add_argument("--processes", "-p", type=int, default=2)
    parser.add_argument("--threads", "-t", type=int, default=8)
    add_stack_options(parser)
    opts = parser.parse_args(argv)
    n: int = opts.n
    if n < 10 or opts.rounds < 1 or opts.processes < 1 or opts.threads < 1:
        parser.error("--n must be at least 10; --rounds, --processes, --threads positive")

    runs: list[Run] = []
    wall = time.perf_counter()
    with LocalStack(embedded=opts.binary == "embedded", env=BENCH_ENV) as stack:
        stack.apply_env()
        assert stack.redis is not None
        admin = redis.Redis.from_url(stack.ledger_url, decode_responses=True)
        admin.config_set("auto-aof-rewrite-percentage", 0)
        admin.config_set("appendfsync", opts.appendfsync)
        persistence: dict[str, Any] = admin.config_get("append*")
        server: dict[str, Any] = admin.info("server")
        bench = Bench(stack, opts.processes, opts.threads)
        # Unmeasured: load both scripts on the server, warm the page cache and the imports.
        for kind in ("guarded", "bare"):
            bench.phase(kind, -1, min(WARMUP, n))
        for rnd in range(opts.rounds):
            for kind in ("guarded", "bare"):
                runs.append(bench.phase(kind, rnd, n))
    wall = time.perf_counter() - wall

    guarded = Summary("guarded", [r for r in runs if r.kind == "guarded"])
    bare = Summary("bare", [r for r in runs if r.kind == "bare"])
    ratio = guarded.median_per_s / bare.median_per_s
    steady_ratio = guarded.median_steady / bare.median_steady

    # Dramatiq's default (its env var is read in the pool too, which inherits ours).
    prefetch = dramatiq.worker.QUEUE_PREFETCH or min(opts.threads * 2, 65535)
    print(
        f"effectq worker bench: n={n} per phase, {opts.rounds} rounds alternating guarded/bare, "
        f"-p {opts.processes} -t {opts.threads} (prefetch {prefetch}), {os.cpu_count()} CPUs"
    )
    print(
        f"redis-server {server['redis_version']} ({opts.binary}), appendonly "
        f"{persistence.get('appendonly')}, appendfsync {persistence.get('appendfsync')}, "
        "auto-aof-rewrite off; ledger db 0, broker db 1, same server"
    )
    print(
        f"python {platform.python_version()}, dramatiq {dramatiq.__version__}, redis-py "
        f"{redis.__version__}, hiredis={'yes' if redis.utils.HIREDIS_AVAILABLE else 'no'}; "
        f"warm-up {min(WARMUP, n)} messages per phase; wall {wall:.0f} s"
    )
    print()
    header = (
        f"{'round':>5} {'phase':<8} {'msgs':>6} {'seconds':>8} {'msgs/s':>8} {'steady/s':>9} "
        f"{'boot s':>7} {'cmds/msg':>9} {'calls/msg':>10} {'reads/msg':>10} {'pool cpu us':>12} "
        f"{'redis us':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in runs:
        print(
            f"{r.round:>5} {r.kind:<8} {r.messages:>6} {r.seconds:>8.2f} {r.per_s:>8.0f} "
            f"{r.steady_per_s:>9.0f} {r.boot_s:>7.2f} {r.cmds / r.messages:>9.2f} "
            f"{r.calls / r.messages:>10.2f} {r.reads / r.messages:>10.2f} "
            f"{r.pool_cpu_s / r.messages * 1e6:>12.0f} "
            f"{r.redis_cpu_s / r.messages * 1e6:>9.0f}"
        )
    print("-" * len(header))
    for s in (guarded, bare):
        print(
            f"{'med':>5} {s.kind:<8} {s.messages // len(s.runs):>6} {'':>8} "
            f"{s.median_per_s:>8.0f} {s.median_steady:>9.0f} {'':>7} "
            f"{s.per_msg('cmds'):>9.2f} {s.per_msg('calls'):>10.2f} {s.per_msg('reads'):>10.2f} "
            f"{s.per_msg('pool_cpu_s') * 1e6:>12.0f} {s.per_msg('redis_cpu_s') * 1e6:>9.0f}"
        )
    print()
    print("msgs/s:    acks in [first ack seen, queue empty] / its length (HLEN polled every")
    print(f"           {POLL_S * 1000:.0f} ms); boot s: pool start -> first ack, not timed;")
    print("           steady/s: between 10 % and 90 % acked")
    print("cmds/msg:  INFO commandstats delta per message over the window, the bench's INFO")
    print("           and HLEN excluded; includes the commands Lua scripts run (server work):")
    for s in (guarded, bare):
        print(f"  {s.kind:<8} {s.breakdown()}")
    print("calls/msg: top-level commands only (EVALSHA/FCALL + connection commands)")
    print("reads/msg: socket reads the server processed (round trips; a pipelined batch is")
    print("           one), the bench's own INFO and HLEN taken off")
    print("pool cpu us / redis us: CPU of the pool's processes / of redis-server per message")
    print()
    print(
        f"{'ratio guarded/bare, msgs/s':<32} {ratio:>6.3f}   (goal >= {GOAL}: "
        f"{'met' if ratio >= GOAL else 'NOT met'})"
    )
    print(f"{'ratio guarded/bare, steady/s':<32} {steady_ratio:>6.3f}")

    result = {
        "bench": "worker",
        "n": n,
        "rounds": opts.rounds,
        "processes": opts.processes,
        "threads": opts.threads,
        "redis": server["redis_version"],
        "appendfsync": persistence.get("appendfsync"),
        "bare_msgs_per_s": round(bare.median_per_s, 1),
        "guarded_msgs_per_s": round(guarded.median_per_s, 1),
        "ratio": round(ratio, 3),
        "steady_ratio": round(steady_ratio, 3),
        "bare_cmds_per_msg": round(bare.per_msg("cmds"), 3),
        "guarded_cmds_per_msg": round(guarded.per_msg("cmds"), 3),
        "bare_calls_per_msg": round(bare.per_msg("calls"), 3),
        "guarded_calls_per_msg": round(guarded.per_msg("calls"), 3),
        "bare_reads_per_msg": round(bare.per_msg("reads"), 3),
        "guarded_reads_per_msg": round(guarded.per_msg("reads"), 3),
        "bare_pool_cpu_us_per_msg": round(bare.per_msg("pool_cpu_s") * 1e6, 1),
        "guarded_pool_cpu_us_per_msg": round(guarded.per_msg("pool_cpu_s") * 1e6, 1),
        "bare_redis_cpu_us_per_msg": round(bare.per_msg("redis_cpu_s") * 1e6, 1),
        "guarded_redis_cpu_us_per_msg": round(guarded.per_msg("redis_cpu_s") * 1e6, 1),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
