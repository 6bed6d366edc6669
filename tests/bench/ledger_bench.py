"""Benchmark: the effectq claim ledger against aws-lambda-powertools idempotency on Redis.

    python tests/bench/ledger_bench.py [--n N] [--binary system|embedded]
    python tests/bench/ledger_bench.py --compare REV [REV ...]   # in-situ server time only

One run starts its own durable redis-server (AOF on, ``appendfsync everysec``, automatic AOF
rewrite off so a rewrite cannot land inside one phase only) in a temp dir and measures, on one
client connection per library, single-threaded:

* effectq first executions (derive + claim + commit) and duplicates (derive + claim → DONE);
* powertools ``idempotent_function`` first calls and duplicates on the same server (db 1);
* raw ``SET NX`` for scale;
* Redis commands per call from ``INFO commandstats`` deltas. Redis counts the commands a Lua
  script runs (``redis.call``) in commandstats too, so this is server work, not round trips;
  round trips (commands the client sends) are counted separately on an audit client;
* effectq submits (the producer's ledger call) on fresh keys, for the server time per submit;
* the same claim + commit and duplicate claim *in situ*: one FCALL runs ``ledger.lua``'s own
  entry point INSITU_N times on fresh keys of one bucket and times itself with ``TIME``, the
  minimum of INSITU_ROUNDS runs: the script and its commands without the call's dispatch,
  network and client, so a busy machine moves it far less than the commandstats figure;
* ``MEMORY USAGE`` of one DONE record holding a 100-byte receipt, and the ``used_memory``
  growth per DONE record over MEMORY_N fresh effects (keys, values, expiry entries).

The table comes first; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import redis
import redis.utils

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from dedupe import ClaimOutcome, Ledger, ToolSpec, derive  # noqa: E402
from dedupe.script import SOURCE  # noqa: E402
from tests.bench._common import Stats, commandstats, compact, pick_binary  # noqa: E402
from workers.dev.redis_server import (  # noqa: E402
    RedisServer,
)

# Powertools reads this at call time; a set value would skip idempotency entirely.
os.environ.pop("POWERTOOLS_IDEMPOTENCY_DISABLED", None)

from aws_lambda_powertools.utilities.idempotency import (  # noqa: E402
    IdempotencyConfig,
    idempotent_function,
)

# persistence.cache.CachePersistenceLayer is the same class as persistence.redis'
# RedisCachePersistenceLayer (a TypeAlias); the class itself is marked deprecated for v4.
from aws_lambda_powertools.utilities.idempotency.persistence.cache import (  # noqa: E402
    CachePersistenceLayer,
)
from aws_lambda_powertools.utilities.typing import LambdaContext  # noqa: E402

SPEC = ToolSpec(
    name="charge",
    identity=("customer",),
    bound=("customer", "amount", "currency"),
    normalizers={"customer": "id", "amount": "money", "currency": "upper"},
)
ARGS: Mapping[str, Any] = {"customer": "cus_42", "amount": "10.50", "currency": "usd"}
LEASE_S = 30.0
RETENTION_S = 7 * 86400.0
HOLDER = "bench/1"
RECEIPT_BYTES = 100
WARMUP = 500
ROUNDS = 10
AUDIT = 200
MEMORY_N = 5000
APPENDFSYNC = "everysec"
REDIS_ARGS = ["--appendfsync", APPENDFSYNC, "--auto-aof-rewrite-percentage", "0"]
PT_DB = 1
INSITU_N = 1000
INSITU_ROUNDS = 10
# A library of its own on the bench's server: ledger.lua, and a function that runs its entry
# point (run) over claim + commit on fresh keys, then a duplicate claim of each, timed by TIME.
_INSITU = r"""
local function insitu(keys, args)
  local n, prefix, fp, request, receipt = tonumber(args[1]), args[2], args[3], args[4], args[5]
  local function keys_of(k)
    return {'{insitu:0}:r:' .. k, '{insitu:0}:leases', '{insitu:0}:stats', '{insitu:0}:p:' .. k,
      '{insitu:0}:unknown', '{insitu:0}:campaigns', '{insitu:0}:floor'}
  end
  local function claim(k)
    local argv = {'claim', k, fp, 'charge', '30000', 'bench/1', request, '', '0', '0', '0'}
    return run(keys_of(k), argv)
  end
  local t0 = redis.call('TIME')
  for i = 1, n do
    local k = prefix .. i
    local token = claim(k)[2]
    run(keys_of(k), {'commit', k, tostring(token), receipt, '', '604800000', 'commit'})
  end
  local t1 = redis.call('TIME')
  for i = 1, n do claim(prefix .. i) end
  local t2 = redis.call('TIME')
  local function us(a, b) return tostring(((b[1] - a[1]) * 1e6 + (b[2] - a[2])) / n) end
  return {us(t0, t1), us(t1, t2)}
end
"""

Body = Callable[[int, int], None]


# -- helpers ----------------------------------------------------------------------------


def _pad_len() -> int:
    base = compact({"id": "eff_" + "0" * 16, "key": "0" * 16, "status": "sent", "pad": ""})
    return RECEIPT_BYTES - len(base)


_PAD = "x" * _pad_len()


def make_receipt(key16: str) -> dict[str, str]:
    """A receipt whose compact JSON is exactly RECEIPT_BYTES bytes (for a 16-char key16)."""
    return {"id": f"eff_{key16}", "key": key16, "status": "sent", "pad": _PAD}


# Commands a client sends to run a script: their usec covers the commands the script runs.
_SCRIPT_COMMANDS = {"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"}


def command_delta(before: Stats, after: Stats) -> Stats:
    """(calls, usec) per command between two snapshots, without the INFO calls that took them."""
    out: Stats = {}
    for name, (calls, usec) in after.items():
        if name == "info":
            continue
        calls0, usec0 = before.get(name, (0, 0))
        if calls - calls0:
            out[name] = (calls - calls0, usec - usec0)
    return out


def server_usec(delta: Stats) -> int:
    """Redis time spent on the client's commands; a script's inner commands are inside it."""
    if scripted := [usec for name, (_, usec) in delta.items() if name in _SCRIPT_COMMANDS]:
        return sum(scripted)
    return sum(usec for _, usec in delta.values())


class CountingConnection(redis.Connection):
    """Counts the writes a client makes to its socket: one per command, one per pipeline
    (a round trip either way)."""

    sent = 0

    def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        CountingConnection.sent += 1
        super().send_packed_command(*args, **kwargs)  # type: ignore[no-untyped-call]


def counting_client(port: int, db: int) -> redis.Redis:
    pool = redis.ConnectionPool(
        connection_class=CountingConnection,
        host="127.0.0.1",
        port=port,
        db=db,
        decode_responses=True,
    )
    client = redis.Redis(connection_pool=pool)
    client.ping()  # connect (HELLO / CLIENT SETINFO) before anything is counted
    return client


class FakeLambdaContext:
    """Just what powertools reads: the remaining time bounds the INPROGRESS lock."""

    function_name = "bench"

    def get_remaining_time_in_millis(self) -> int:
        return int(LEASE_S * 1000)


class Phase:
    """Calls, wall time and server commands of one phase, summed over its rounds."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0
        self.seconds = 0.0
        self.cpu_seconds = 0.0
        self.server_usec = 0
        self.commands: dict[str, int] = {}

    def run(self, client: redis.Redis, body: Body, lo: int, hi: int) -> None:
        if hi <= lo:
            return
        before = commandstats(client)
        cpu = time.process_time()
        start = time.perf_counter()
        body(lo, hi)
        self.seconds += time.perf_counter() - start
        self.cpu_seconds += time.process_time() - cpu
        after = commandstats(client)
        self.calls += hi - lo
        delta = command_delta(before, after)
        self.server_usec += server_usec(delta)
        for name, (calls, _) in delta.items():
            self.commands[name] = self.commands.get(name, 0) + calls

    @property
    def per_s(self) -> float:
        return self.calls / self.seconds

    @property
    def us_per_call(self) -> float:
        return self.seconds / self.calls * 1e6

    @property
    def cpu_us_per_call(self) -> float:
        return self.cpu_seconds / self.calls * 1e6

    @property
    def server_us_per_call(self) -> float:
        return self.server_usec / self.calls

    @property
    def cmds_per_call(self) -> float:
        return sum(self.commands.values()) / self.calls

    def breakdown(self) -> str:
        parts = sorted(self.commands.items(), key=lambda kv: (-kv[1], kv[0]))
        return " ".join(f"{name}={calls / self.calls:g}" for name, calls in parts)


# -- the two libraries under test ---------------------------------------------------------
# Each body runs calls lo..hi-1 of a loop; the same index always means the same effect.


def effectq_first(ledger: Ledger, prefix: str) -> Body:
    def run(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            effect = derive(SPEC, f"{prefix}-{i}", ARGS)
            claim = ledger.claim(effect, lease_s=LEASE_S, holder=HOLDER)
            if not claim.acquired:
                raise RuntimeError(f"{prefix}-{i}: expected acquired, got {claim.outcome}")
            receipt = make_receipt(effect.key[:16])
            write = ledger.commit(effect.key, claim.token, receipt, retention_s=RETENTION_S)
            if not write.ok:
                raise RuntimeError(f"{prefix}-{i}: commit fenced ({write.state})")

    return run


def effectq_dup(ledger: Ledger, prefix: str) -> Body:
    def run(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            effect = derive(SPEC, f"{prefix}-{i}", ARGS)
            claim = ledger.claim(effect, lease_s=LEASE_S, holder=HOLDER)
            if claim.outcome is not ClaimOutcome.DUPLICATE or claim.receipt is None:
                raise RuntimeError(f"{prefix}-{i}: expected duplicate, got {claim.outcome}")

    return run


class Powertools:
    """A powertools-idempotent ``charge`` on its own client and db of the same server."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.executions = 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            store = CachePersistenceLayer(client=cast(Any, client))
        config = IdempotencyConfig(expires_after_seconds=int(RETENTION_S))
        # Outside Lambda there is no context; without one powertools warns on every call and
        # writes no in-progress expiry. A fake one makes it behave as it would in Lambda.
        config.register_lambda_context(cast(LambdaContext, FakeLambdaContext()))

        @idempotent_function(  # type: ignore[untyped-decorator]
            data_keyword_argument="order", persistence_store=store, config=config
        )
        def charge(order: dict[str, Any]) -> dict[str, str]:
            self.executions += 1
            return make_receipt(f"{order['n']:016x}")

        self.charge: Callable[..., dict[str, str]] = charge

    def calls(self, prefix: str, *, first: bool) -> Body:
        def run(lo: int, hi: int) -> None:
            before = self.executions
            for i in range(lo, hi):
                order = {"n": i, "scope": f"{prefix}-{i}", **ARGS}
                result = self.charge(order=order)
                if result["status"] != "sent":
                    raise RuntimeError(f"{prefix}-{i}: unexpected result {result}")
            expected = hi - lo if first else 0
            if self.executions - before != expected:
                raise RuntimeError(
                    f"{prefix}: {self.executions - before} executions, expected {expected}"
                )

        return run


def effectq_submit(ledger: Ledger, prefix: str) -> Body:
    def run(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            effect = derive(SPEC, f"{prefix}-{i}", ARGS)
            answer = ledger.submit(effect, message_id=f"m-{i}", pending_s=LEASE_S)
            if answer.status != "enqueue":
                raise RuntimeError(f"{prefix}-{i}: expected enqueue, got {answer.status}")

    return run


def setnx(client: redis.Redis, prefix: str) -> Body:
    def run(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            if not client.set(f"{prefix}:{i}", "1", nx=True):
                raise RuntimeError(f"{prefix}:{i} already set")

    return run


# -- round trips and memory ---------------------------------------------------------------


def round_trips(body: Body, n: int) -> float:
    CountingConnection.sent = 0
    body(0, n)
    return CountingConnection.sent / n


def record_breakdown(record: dict[str, Any]) -> list[tuple[str, int]]:
    """Bytes each part takes in the stored (struct-packed) form of a settled record, as
    ledger.lua lays it out: length prefixes included."""

    def text(name: str, prefix: int) -> int:
        return prefix + len(str(record.get(name) or "").encode())

    sizes = [
        ("head", 19),  # layout and state, token, generation, attempts, created
        ("f", 1 + len(record["f"]) // 2),
        ("tool", text("tool", 1)),
        ("cp", text("cp", 1)),
        ("q", text("q", 3)),
        ("r", text("r", 3)),
        ("raw", text("raw", 3)),
        ("lr", 4 + sum(15 + len(str(r).encode()) for _, r, _ in record.get("lr") or [])),
        ("y", 1 + sum(10 + len(str(note).encode()) for *_, note in record["y"])),
    ]
    return sorted(sizes, key=lambda kv: -kv[1])


def memory_per_record(client: redis.Redis, ledger: Ledger, prefix: str) -> float:
    """used_memory growth per DONE record over MEMORY_N fresh effects."""
    body = effectq_first(ledger, prefix)
    body(0, 100)  # buckets' indexes, counters and floors exist before the baseline
    gc.collect()
    before = int(client.info("memory")["used_memory"])
    body(100, 100 + MEMORY_N)
    after = int(client.info("memory")["used_memory"])
    return (after - before) / MEMORY_N


def in_situ(
    client: redis.Redis, ledger: Ledger, sources: Mapping[str, str], rounds: int = INSITU_ROUNDS
) -> dict[str, tuple[float, float]]:
    """Server us per claim + commit and per duplicate claim of each ``ledger.lua`` source
    (name -> text), run inside one FCALL: the minimum over ``rounds`` runs of INSITU_N each,
    the sources taking turns so that drift hits them alike."""
    for n, text in enumerate(sources.values()):
        client.function_load(
            f"#!lua name=effectq_bench_insitu{n}\n{text}\n{_INSITU}\n"
            f"redis.register_function('effectq_bench_insitu{n}', insitu)\n",
            replace=True,
        )
    effect = derive(SPEC, "insitu", ARGS)
    request, receipt = ledger.request_text(effect), compact(make_receipt(effect.key[:16]))
    fingerprint = bytes.fromhex(effect.fingerprint)
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in sources}
    for r in range(rounds):
        for n, name in enumerate(sources):
            argv = (INSITU_N, f"{n}-{r}-", fingerprint, request, receipt)
            first, dup = cast(list[str], client.fcall(f"effectq_bench_insitu{n}", 0, *argv))
            runs[name].append((float(first), float(dup)))
    return {name: (min(a for a, _ in got), min(b for _, b in got)) for name, got in runs.items()}


def compare(binary: str, revisions: list[str]) -> int:
    """``--compare``: the in-situ figures of this tree's ledger.lua and of each revision's
    (``git show REV:dedupe/ledger.lua``) on one server, taking turns; one JSON line."""
    sources = {"this tree": SOURCE}
    for rev in revisions:
        sources[rev] = subprocess.run(
            ["git", "-C", str(_ROOT), "show", f"{rev}:dedupe/ledger.lua"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    with (
        tempfile.TemporaryDirectory(prefix="effectq-bench-") as tmp,
        RedisServer(binary, Path(tmp), extra_args=REDIS_ARGS) as server,
    ):
        client = redis.Redis(host="127.0.0.1", port=server.port, decode_responses=True)
        ledger = Ledger(client, allow_volatile=False)
        ledger.check_layout()
        figures = in_situ(client, ledger, sources, rounds=16)
    for name, (first, dup) in figures.items():
        print(f"{name:<44} claim+commit {first:6.1f} us, duplicate {dup:5.1f} us (in situ, min)")
    result = {
        name: {"server_us_in_situ_first": round(a, 1), "server_us_in_situ_dup": round(b, 1)}
        for name, (a, b) in figures.items()
    }
    print(json.dumps({"bench": "ledger_in_situ", "n": INSITU_N, "runs": 16, **result}))
    return 0


# -- main ---------------------------------------------------------------------------------


def interleave(client: redis.Redis, n: int, lineup: list[tuple[Phase, Body]]) -> None:
    """Warm each body up, then run ROUNDS slices of 0..n-1, alternating bodies per slice,
    so that drift (CPU frequency, neighbours, AOF growth) hits every phase alike."""
    for _, body in lineup:
        body(n, n + WARMUP)  # indices past n: keys the measured slices never touch
    step = -(-n // ROUNDS)
    for lo in range(0, n, step):
        gc.collect()
        for phase, body in lineup:
            phase.run(client, body, lo, min(lo + step, n))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=20000, help="calls per measured phase")
    parser.add_argument("--binary", choices=("system", "embedded"), default=None)
    parser.add_argument(
        "--compare",
        nargs="+",
        metavar="REV",
        help="only the in-situ server time, of this tree's ledger.lua and of each REV's",
    )
    opts = parser.parse_args(argv)
    n: int = opts.n
    if n < 1:
        parser.error("--n must be positive")
    binary = pick_binary(opts.binary)
    if opts.compare:
        return compare(binary, opts.compare)

    with (
        tempfile.TemporaryDirectory(prefix="effectq-bench-") as tmp,
        RedisServer(binary, Path(tmp), extra_args=REDIS_ARGS) as server,
    ):
        client = redis.Redis(host="127.0.0.1", port=server.port, decode_responses=True)
        pt_client = redis.Redis(host="127.0.0.1", port=server.port, db=PT_DB, decode_responses=True)
        persistence = cast(dict[str, Any], client.config_get("append*"))
        if persistence.get("appendonly") != "yes" or persistence.get("appendfsync") != APPENDFSYNC:
            raise RuntimeError(f"unexpected persistence config: {persistence}")

        # Laid out as a process lays out a new ledger (short record names, dedupe/keys.py).
        ledger = Ledger(client, allow_volatile=False)
        ledger.check_layout()
        pt = Powertools(pt_client)
        phases = {
            "effectq_first": Phase("effectq first (claim+commit)"),
            "pt_first": Phase("powertools first call"),
            "setnx": Phase("raw SET NX"),
            "effectq_dup": Phase("effectq duplicate (claim)"),
            "pt_dup": Phase("powertools duplicate"),
            "effectq_submit": Phase("effectq submit (producer)"),
        }
        interleave(
            client,
            n,
            [
                (phases["effectq_first"], effectq_first(ledger, "scope")),
                (phases["pt_first"], pt.calls("scope", first=True)),
                (phases["setnx"], setnx(client, "bench:setnx")),
            ],
        )
        # Every effect 0..n+WARMUP-1 is DONE now: claim them all again, same payloads.
        interleave(
            client,
            n,
            [
                (phases["effectq_dup"], effectq_dup(ledger, "scope")),
                (phases["pt_dup"], pt.calls("scope", first=False)),
                (phases["effectq_submit"], effectq_submit(ledger, "submit")),
            ],
        )

        # Round trips: the same loops on counting clients, on fresh keys.
        audit_ledger = Ledger(
            counting_client(server.port, 0), allow_volatile=False, short_names=ledger.keyspace.short
        )
        audit_pt = Powertools(counting_client(server.port, PT_DB))
        rt = {
            "effectq_first": round_trips(effectq_first(audit_ledger, "audit"), AUDIT),
            "effectq_dup": round_trips(effectq_dup(audit_ledger, "audit"), AUDIT),
            "pt_first": round_trips(audit_pt.calls("audit", first=True), AUDIT),
            "pt_dup": round_trips(audit_pt.calls("audit", first=False), AUDIT),
            "setnx": 1.0,
            "effectq_submit": round_trips(effectq_submit(audit_ledger, "audit-submit"), AUDIT),
        }

        # One DONE record with a 100-byte receipt (the measured phase wrote exactly those).
        effect = derive(SPEC, "scope-0", ARGS)
        record_key = ledger._keys(effect.key)[0]
        stored = ledger._stored(effect.key)
        if stored is None or stored["s"] != "DONE":
            raise RuntimeError(f"{record_key} is not a DONE record")
        if len(compact(json.loads(stored["r"]))) != RECEIPT_BYTES:
            raise RuntimeError("receipt is not 100 bytes of compact JSON")
        done_bytes = int(cast(int, client.memory_usage(record_key, samples=0)))
        done_len = int(client.strlen(record_key))
        pt_key = cast(str, pt_client.randomkey())
        pt_bytes = int(cast(int, pt_client.memory_usage(pt_key, samples=0)))
        pt_len = int(pt_client.strlen(pt_key))
        done_growth = memory_per_record(client, ledger, "memory")
        [(insitu_first, insitu_dup)] = in_situ(client, ledger, {"this tree": SOURCE}).values()
        version = server.version

    ef, ed = phases["effectq_first"], phases["effectq_dup"]
    pf, pd = phases["pt_first"], phases["pt_dup"]
    sx, es = phases["setnx"], phases["effectq_submit"]
    ratio_first = ef.per_s / pf.per_s
    ratio_dup = ed.per_s / pd.per_s
    # The physical floors: a first execution needs two sequential round trips, a duplicate one.
    first_vs_floor = ef.per_s / (sx.per_s / 2)
    dup_vs_floor = ed.per_s / sx.per_s

    print(
        f"effectq ledger bench: n={n}, redis-server {version} ({binary}), "
        f"appendonly yes, appendfsync {APPENDFSYNC}, auto-aof-rewrite off"
    )
    print(
        f"python {platform.python_version()}, redis-py {redis.__version__}, "
        f"hiredis={'yes' if redis.utils.HIREDIS_AVAILABLE else 'no'}; single-threaded, one "
        f"connection per library; warm-up {WARMUP} calls per phase, then {ROUNDS} rounds "
        "alternating the phases"
    )
    print()
    header = (
        f"{'phase':<30} {'calls/s':>9} {'us/call':>8} {'cpu us':>7} {'redis us':>9} "
        f"{'cmds/call':>10} {'trips/call':>11}"
    )
    print(header)
    print("-" * len(header))
    for key, phase in phases.items():
        print(
            f"{phase.name:<30} {phase.per_s:>9.0f} {phase.us_per_call:>8.1f} "
            f"{phase.cpu_us_per_call:>7.1f} {phase.server_us_per_call:>9.1f} "
            f"{phase.cmds_per_call:>10.2f} {rt[key]:>11.2f}"
        )
    print()
    print("cmds/call:  INFO commandstats delta per call, INFO excluded; Redis also counts the")
    print("            commands a Lua script runs, so this is server-side work:")
    for phase in phases.values():
        print(f"  {phase.name:<30} {phase.breakdown()}")
    print(f"trips/call: commands the client sent per call (audit pass, {AUDIT} calls each)")
    print("cpu us:     bench process CPU per call (Python + syscalls); redis us: server time per")
    print("            call in its commands (commandstats usec; a script counts as a whole)")
    print()
    print(f"{'ratio effectq/powertools, first':<40} {ratio_first:>6.2f}x   (goal >= 1.3x)")
    print(f"{'ratio effectq/powertools, duplicate':<40} {ratio_dup:>6.2f}x   (goal >= 2.5x)")
    print(f"{'effectq first / (raw SET NX / 2)':<40} {first_vs_floor:>6.2f}    (goal >= 0.8)")
    print(f"{'effectq duplicate / raw SET NX':<40} {dup_vs_floor:>6.2f}    (goal >= 0.8)")
    print(
        f"{'server us per claim+commit, submit':<40} {ef.server_us_per_call:>6.1f}, "
        f"{es.server_us_per_call:.1f}   (goal <= 25)"
    )
    print(
        f"{'  in situ (no dispatch, network, client)':<40} {insitu_first:>6.1f}, "
        f"duplicate {insitu_dup:.1f}   (min of {INSITU_ROUNDS} x {INSITU_N} in one FCALL)"
    )
    print(f"{'commands per claim+commit':<40} {ef.cmds_per_call:>6.1f}    (goal <= 8)")
    print()
    print(
        f"DONE record {record_key}: MEMORY USAGE {done_bytes} B (goal <= 300), "
        f"used_memory +{done_growth:.0f} B per DONE record, raw value {done_len} B, "
        f"receipt {RECEIPT_BYTES} B"
    )
    print(
        "  stored bytes per field: "
        + " ".join(f"{name}={size}" for name, size in record_breakdown(stored))
    )
    print(f"powertools COMPLETED record: MEMORY USAGE {pt_bytes} B, raw value {pt_len} B")

    result = {
        "bench": "ledger",
        "n": n,
        "redis": version,
        "effectq_first_per_s": round(ef.per_s, 1),
        "effectq_dup_per_s": round(ed.per_s, 1),
        "powertools_first_per_s": round(pf.per_s, 1),
        "powertools_dup_per_s": round(pd.per_s, 1),
        "ratio_first": round(ratio_first, 3),
        "ratio_dup": round(ratio_dup, 3),
        "cmds_per_first": round(ef.cmds_per_call, 3),
        "cmds_per_dup": round(ed.cmds_per_call, 3),
        "powertools_cmds_per_first": round(pf.cmds_per_call, 3),
        "powertools_cmds_per_dup": round(pd.cmds_per_call, 3),
        "setnx_per_s": round(sx.per_s, 1),
        "first_vs_floor": round(first_vs_floor, 3),
        "dup_vs_floor": round(dup_vs_floor, 3),
        "server_us_per_first": round(ef.server_us_per_call, 1),
        "server_us_per_dup": round(ed.server_us_per_call, 1),
        "server_us_per_submit": round(es.server_us_per_call, 1),
        "server_us_in_situ_first": round(insitu_first, 1),
        "server_us_in_situ_dup": round(insitu_dup, 1),
        "client_cpu_us_per_first": round(ef.cpu_us_per_call, 1),
        "client_cpu_us_per_dup": round(ed.cpu_us_per_call, 1),
        "powertools_server_us_per_first": round(pf.server_us_per_call, 1),
        "powertools_cpu_us_per_first": round(pf.cpu_us_per_call, 1),
        "done_record_bytes": done_bytes,
        "done_record_used_memory": round(done_growth, 1),
        "done_record_len": done_len,
        "roundtrips_per_first": rt["effectq_first"],
        "roundtrips_per_dup": rt["effectq_dup"],
        "powertools_roundtrips_per_first": rt["pt_first"],
        "powertools_roundtrips_per_dup": rt["pt_dup"],
        "appendfsync": APPENDFSYNC,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
