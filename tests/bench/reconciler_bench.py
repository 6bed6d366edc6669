"""Benchmark: the reconciler resolving expired claims in a small and in a large ledger.

    python tests/bench/reconciler_bench.py [--records N] [--claims C] [--rounds R]
                                           [--lookup-keys K] [--binary system|embedded]

One run starts a sandbox provider (lookup lag 0, provider idempotency on) and two durable
redis-servers of the same binary and config (AOF on, ``appendfsync everysec``, automatic AOF
rewrite off) in a temp dir:

* "small": its ledger holds exactly C records (default 1,000), all expired CLAIMED;
* "large": its ledger holds N records (default 1,000,000): N - C DONE records bulk-loaded
  through the ledger's own Lua script (claim + commit, pipelined EVALSHA in batches of 1,000,
  so they are real records, readable by ``Ledger.get``), plus C expired CLAIMED.

Every round makes C fresh claims on each server (lease 0.05 s, holder gone), lets the provider
execute every other one (POST /v1/effects with the claim's idempotency key and token), waits
until all C leases have expired on the server's clock, then times one in-process Reconciler
(single thread, HttpLookup against the sandbox, settle_s=0) calling ``run_once()`` until all
C are resolved: DONE where the provider has the effect, FAILED where it does not. The round's
records are deleted afterwards, so each ledger holds exactly its record count in every round.
Rounds alternate which server goes first; the reported time is the median over rounds. The
timed part is only the resolving; the bulk load is reported on its own.

Then lookups/s: ``HttpLookup.lookup()`` against the sandbox for K keys (half of them exist)
versus raw ``httpx.Client.get`` of the same URLs with the same headers, alternating in slices
of 100 keys over 4 passes.

The table comes first; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import redis
import redis.utils

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from dedupe import Found, Ledger, LookupResult, NotFound, State, ToolSpec, derive  # noqa: E402
from reconciler import HttpLookup, Reconciler  # noqa: E402
from tests.bench._common import Stats, commandstats, compact, pick_binary  # noqa: E402
from workers.dev.redis_server import (  # noqa: E402
    RedisServer,
)
from workers.dev.sandbox import SandboxConfig, SandboxProcess  # noqa: E402

TOOL = "charge"
CLAIM_LEASE_S = 0.05
DEAD_HOLDER = "dead/1"
RECONCILER_HOLDER = "bench-reconciler"
RETENTION_S = 7 * 86400.0
LOAD_BATCH = 1000
WARMUP_CLAIMS = 100
LOOKUP_ROUNDS = 4
LOOKUP_WARMUP = 200
LOOKUP_SLICE = 100
MAX_PASSES = 50
APPENDFSYNC = "everysec"
REDIS_ARGS = ["--appendfsync", APPENDFSYNC, "--auto-aof-rewrite-percentage", "0"]


def _spec(lookup: Any = None) -> ToolSpec:
    return ToolSpec(
        name=TOOL,
        identity=("customer",),
        bound=("customer", "amount", "currency"),
        normalizers={"customer": "id", "amount": "money", "currency": "upper"},
        settle_s=0.0,
        lookup=lookup,
    )


SPEC = _spec()  # for deriving effects; the reconciler's copy carries the lookup


def _args(i: int) -> dict[str, str]:
    return {"customer": f"cus_{i}", "amount": "10.50", "currency": "usd"}


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- instrumentation ----------------------------------------------------------------------


class Spent:
    """Wall time and calls per operation, summed until reset."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()

    def timed(self, op: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.seconds[op] += time.perf_counter() - start
            self.calls[op] += 1

    def add(self, other: Spent) -> None:
        for op, seconds in other.seconds.items():
            self.seconds[op] += seconds
        self.calls.update(other.calls)


class TimedLedger(Ledger):
    """A Ledger that times the calls the reconciler makes (~1 us of overhead per call)."""

    def __init__(self, client: redis.Redis, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self.spent = Spent()

    def expired(
        self, buckets: Iterable[int] | None = None, *, limit: int = 100, now_ms: int | None = None
    ) -> list[str]:
        found: list[str] = self.spent.timed(
            "scan", super().expired, buckets, limit=limit, now_ms=now_ms
        )
        return found

    def takeover(self, key: str, *, lease_s: float, holder: str) -> Any:
        return self.spent.timed("takeover", super().takeover, key, lease_s=lease_s, holder=holder)

    def commit(self, key: str, token: int, receipt: Mapping[str, Any], **kwargs: Any) -> Any:
        return self.spent.timed("commit", super().commit, key, token, receipt, **kwargs)

    def fail(self, key: str, token: int, **kwargs: Any) -> Any:
        return self.spent.timed("fail", super().fail, key, token, **kwargs)

    def heartbeat(self, key: str, token: int, **kwargs: Any) -> Any:
        return self.spent.timed("heartbeat", super().heartbeat, key, token, **kwargs)

    def mark_unknown(self, key: str, token: int, **kwargs: Any) -> Any:
        return self.spent.timed("unknown", super().mark_unknown, key, token, **kwargs)


class TimedLookup:
    """Wraps a Lookup and times its calls (one HTTP GET each)."""

    def __init__(self, inner: HttpLookup) -> None:
        self.inner = inner
        self.spent = Spent()

    def lookup(self, idempotency_key: str, token: int | None = None) -> LookupResult:
        result: LookupResult = self.spent.timed("lookup", self.inner.lookup, idempotency_key, token)
        return result


def sent_usec(before: Stats, after: Stats, commands: Iterable[str]) -> tuple[int, int]:
    """(calls, usec) of the commands the client sends (a script's usec covers its inner
    commands, which commandstats also counts separately: those are left out here)."""
    calls = usec = 0
    for name in commands:
        c1, u1 = after.get(name, (0, 0))
        c0, u0 = before.get(name, (0, 0))
        calls, usec = calls + c1 - c0, usec + u1 - u0
    return calls, usec


# -- scenarios ----------------------------------------------------------------------------


@dataclass
class Scenario:
    name: str
    records: int
    claims: int
    server: RedisServer
    client: redis.Redis
    ledger: TimedLedger
    provider: httpx.Client
    lookup: TimedLookup
    reconciler: Reconciler
    times: list[float] = field(default_factory=list)
    passes: list[int] = field(default_factory=list)
    spent: Spent = field(default_factory=Spent)
    evalsha: tuple[int, int] = (0, 0)
    scan_cmds: tuple[int, int] = (0, 0)
    resolved: int = 0
    record_count: int | None = None
    dbsize: int | None = None
    sample_bytes: dict[str, int] = field(default_factory=dict)
    posted: int = 0
    _keys: list[str] = field(default_factory=list)

    def prepare(self, tag: str, n: int) -> None:
        """``n`` fresh claims whose holder died; every other one executed at the provider."""
        self._keys = []
        for i in range(n):
            effect = derive(SPEC, f"{self.name}-{tag}-{i}", _args(i))
            claim = self.ledger.claim(effect, lease_s=CLAIM_LEASE_S, holder=DEAD_HOLDER)
            if not claim.acquired:
                raise RuntimeError(f"{self.name} {tag}-{i}: claim {claim.outcome}")
            if i % 2:
                headers = {
                    "Idempotency-Key": claim.idempotency_key,
                    "Fencing-Token": str(claim.token),
                }
                body = {"tool": TOOL, **_args(i)}
                self.provider.post("/v1/effects", json=body, headers=headers).raise_for_status()
                self.posted += 1
            self._keys.append(effect.key)
        deadline = time.monotonic() + 10.0
        while len(self.ledger.expired(limit=n)) < n:  # the server's clock decides
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: leases did not expire")
            time.sleep(0.005)

    def resolve(self, n: int) -> tuple[float, int, Spent, Stats, Stats]:
        gc.collect()
        self.ledger.spent.reset()
        self.lookup.spent.reset()
        before = commandstats(self.client)
        outcomes: Counter[str] = Counter()
        passes = 0
        start = time.perf_counter()
        while outcomes["done"] + outcomes["failed"] < n:
            outcomes.update(self.reconciler.run_once())
            passes += 1
            if bad := {k: v for k, v in outcomes.items() if k not in ("done", "failed")}:
                raise RuntimeError(f"{self.name}: unexpected outcomes {bad}")
            if passes >= MAX_PASSES:
                raise RuntimeError(f"{self.name}: {outcomes} after {passes} passes")
        elapsed = time.perf_counter() - start
        after = commandstats(self.client)
        if outcomes != Counter(done=n // 2, failed=n - n // 2):
            raise RuntimeError(f"{self.name}: outcomes {dict(outcomes)}")
        spent = Spent()
        spent.add(self.ledger.spent)
        spent.add(self.lookup.spent)
        return elapsed, passes, spent, before, after

    def verify(self, *, sample: bool = False) -> None:
        records = self.ledger.get_many(self._keys)
        for i, key in enumerate(self._keys):
            record = records[key]
            want = State.DONE if i % 2 else State.FAILED
            if record is None or record.state is not want:
                got = record and (record.state, record.reason)
                raise RuntimeError(f"{self.name} {key[:12]}: {got}, expected {want}")
            if want is State.DONE and (record.receipt or {}).get("key") != key:
                raise RuntimeError(f"{self.name} {key[:12]}: receipt {record.receipt}")
        if self.ledger.expired(limit=self.claims):
            raise RuntimeError(f"{self.name}: expired claims left over")
        held = {k: v for k, v in self.ledger.counts().items() if k[0] != "fenced" and v}
        if held:
            raise RuntimeError(f"{self.name}: records still held: {held}")
        if sample:
            for i, label in ((1, "DONE (reconciled)"), (0, "FAILED (reconciled)")):
                rkey = self.ledger._keys(self._keys[i])[0]
                self.sample_bytes[label] = int(cast(int, self.client.memory_usage(rkey, 0)))

    def cleanup(self) -> None:
        """Delete the round's records: the ledger holds its record count again."""
        if self._keys:
            self.client.delete(*(self.ledger._keys(k)[0] for k in self._keys))
        self._keys = []

    def count_records(self) -> int:
        pattern = f"{{{self.ledger.namespace}:*}}:r:*"
        return sum(1 for _ in self.client.scan_iter(match=pattern, count=10_000))

    def run_round(self, tag: str, *, first: bool) -> None:
        self.prepare(tag, self.claims)
        if first:
            self.record_count = self.count_records()
            self.dbsize = int(self.client.dbsize())
            if self.record_count != self.records:
                raise RuntimeError(f"{self.name}: {self.record_count} records, not {self.records}")
        elapsed, passes, spent, before, after = self.resolve(self.claims)
        self.verify(sample=first)
        self.cleanup()
        self.times.append(elapsed)
        self.passes.append(passes)
        self.spent.add(spent)
        calls, usec = sent_usec(before, after, ("evalsha",))
        self.evalsha = (self.evalsha[0] + calls, self.evalsha[1] + usec)
        # Not TIME: every script run calls it too, so its stats mix the client's with the
        # scripts' (whose usec is already inside EVALSHA's); one per pass, a microsecond.
        calls, usec = sent_usec(before, after, ("zrangebyscore",))
        self.scan_cmds = (self.scan_cmds[0] + calls, self.scan_cmds[1] + usec)
        self.resolved += self.claims

    @property
    def median_s(self) -> float:
        return statistics.median(self.times)

    def us(self, op: str) -> tuple[float, float]:
        """(us per call, calls per resolution) of ``op``."""
        calls = self.spent.calls[op]
        per_call = self.spent.seconds[op] / calls * 1e6 if calls else 0.0
        return per_call, calls / self.resolved


def bulk_load(ledger: Ledger, client: redis.Redis, n: int) -> dict[str, float]:
    """``n`` DONE records through the ledger's script: claim + commit per effect, pipelined
    EVALSHA, LOAD_BATCH effects per round trip. Each reply is checked."""
    derive_s = redis_s = 0.0
    lease_ms = 30_000
    retention_ms = int(RETENTION_S * 1000)
    start = time.perf_counter()
    for lo in range(0, n, LOAD_BATCH):
        t0 = time.perf_counter()
        effects = [
            derive(SPEC, f"loaded-{i}", _args(i)) for i in range(lo, min(lo + LOAD_BATCH, n))
        ]
        t1 = time.perf_counter()
        pipe = client.pipeline(transaction=False)
        for effect in effects:
            request = compact(
                {"scope": effect.scope, "action": effect.action, "args": dict(effect.args)}
            )
            # The arguments Ledger.claim / Ledger.commit send, in the same order.
            claim: list[str | int | bytes] = [
                "claim",
                effect.key,
                bytes.fromhex(effect.fingerprint),
                effect.tool,
                lease_ms,
                "loader/1",
            ]
            args = [*claim, request, "", 0]  # no campaign, generation 0
            ledger._script.queue(pipe, ledger._keys(effect.key), args)
        # A fresh record's first token is its bucket's floor + 1 (tokens outlive expired
        # records): commit under the token each claim was granted.
        claimed = pipe.execute()
        for effect, reply in zip(effects, claimed, strict=True):
            token = int(reply[1])
            receipt = compact({"id": f"eff_{effect.key[:12]}", "key": effect.key, "token": token})
            commit = ["commit", effect.key, token, receipt, "", retention_ms, "commit"]
            ledger._script.queue(pipe, ledger._keys(effect.key), commit)
        committed = pipe.execute()
        redis_s += time.perf_counter() - t1
        derive_s += t1 - t0
        for one, done in zip(claimed, committed, strict=True):
            if list(one)[::2] != ["acquired", 0] or list(done)[:2] != ["ok", "DONE"]:
                raise RuntimeError(f"bulk load: {one} / {done}")
        if (lo // LOAD_BATCH) % 100 == 99:
            _progress(
                f"  loaded {lo + LOAD_BATCH:,} of {n:,} ({time.perf_counter() - start:.0f} s)"
            )
    return {"total_s": time.perf_counter() - start, "derive_s": derive_s, "redis_s": redis_s}


def settle_aof(client: redis.Redis, timeout_s: float = 60.0) -> float:
    """Wait until no AOF fsync is pending, so the load's write-back stays out of the rounds."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        info: dict[str, Any] = client.info("persistence")
        if int(info.get("aof_pending_bio_fsync", 0)) == 0:
            break
        time.sleep(0.1)
    time.sleep(1.5)  # one more everysec fsync of whatever is still buffered
    return time.monotonic() - start


# -- lookups/s ----------------------------------------------------------------------------


@dataclass
class LookupRates:
    lookup_per_s: float
    raw_per_s: float
    lookup_cpu_us: float
    raw_cpu_us: float
    median_slice_ratio: float
    passes: list[str]


def lookup_bench(url: str, keys: list[str], found: set[str]) -> LookupRates:
    """HttpLookup.lookup vs raw httpx GET of the same URLs and headers: LOOKUP_ROUNDS passes
    over ``keys``, in slices of LOOKUP_SLICE keys that alternate between the two (and which
    goes first), so drift on a busy box hits both alike."""
    lookup = HttpLookup(url)
    raw = httpx.Client(base_url=url, timeout=lookup.timeout_s)
    token = 1
    headers = {"Fencing-Token": str(token)}

    def via_lookup(batch: list[str]) -> None:
        for key in batch:
            result = lookup.lookup(key, token)
            ok = isinstance(result, Found) if key in found else isinstance(result, NotFound)
            if not ok:
                raise RuntimeError(f"lookup {key[:12]}: {result}")

    def via_raw(batch: list[str]) -> None:
        for key in batch:
            status = raw.get(f"/v1/effects/{key}", headers=headers).status_code
            if status != (200 if key in found else 404):
                raise RuntimeError(f"GET {key[:12]}: HTTP {status}")

    bodies = {"lookup": via_lookup, "raw": via_raw}
    for body in bodies.values():
        body(keys[:LOOKUP_WARMUP])
    seconds = {"lookup": 0.0, "raw": 0.0}
    cpu = {"lookup": 0.0, "raw": 0.0}
    slice_ratios: list[float] = []
    passes: list[str] = []
    flip = False
    for r in range(LOOKUP_ROUNDS):
        gc.collect()
        in_pass = {"lookup": 0.0, "raw": 0.0}
        for lo in range(0, len(keys), LOOKUP_SLICE):
            batch = keys[lo : lo + LOOKUP_SLICE]
            took: dict[str, float] = {}
            for name in ("raw", "lookup") if flip else ("lookup", "raw"):
                cpu0, start = time.process_time(), time.perf_counter()
                bodies[name](batch)
                took[name] = time.perf_counter() - start
                cpu[name] += time.process_time() - cpu0
                in_pass[name] += took[name]
            flip = not flip
            slice_ratios.append(took["raw"] / took["lookup"])
        for name, spent in in_pass.items():
            seconds[name] += spent
        passes.append(
            f"pass {r + 1}: lookup {len(keys) / in_pass['lookup']:,.0f}/s, "
            f"raw {len(keys) / in_pass['raw']:,.0f}/s"
        )
    raw.close()
    calls = LOOKUP_ROUNDS * len(keys)
    return LookupRates(
        lookup_per_s=calls / seconds["lookup"],
        raw_per_s=calls / seconds["raw"],
        lookup_cpu_us=cpu["lookup"] / calls * 1e6,
        raw_cpu_us=cpu["raw"] / calls * 1e6,
        median_slice_ratio=statistics.median(slice_ratios),
        passes=passes,
    )


# -- main ---------------------------------------------------------------------------------


def _mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=1_000_000, help="records, large ledger")
    parser.add_argument("--claims", type=int, default=1000, help="expired claims to resolve")
    parser.add_argument("--rounds", type=int, default=6, help="timed rounds per ledger")
    parser.add_argument("--lookup-keys", type=int, default=2000)
    parser.add_argument("--binary", choices=("system", "embedded"), default=None)
    opts = parser.parse_args(argv)
    claims, records, rounds = opts.claims, opts.records, opts.rounds
    if claims < 2 or records < claims or rounds < 1 or opts.lookup_keys < LOOKUP_WARMUP:
        parser.error("need claims >= 2, records >= claims, rounds >= 1, lookup-keys >= 200")
    binary = pick_binary(opts.binary)
    wall = time.perf_counter()
    load_avg = os.getloadavg()

    with (
        tempfile.TemporaryDirectory(prefix="effectq-rbench-") as tmp,
        SandboxProcess(SandboxConfig()) as sandbox,
        RedisServer(binary, Path(tmp) / "small", extra_args=REDIS_ARGS) as small_server,
        RedisServer(binary, Path(tmp) / "large", extra_args=REDIS_ARGS) as large_server,
        httpx.Client(base_url=sandbox.url, timeout=5.0) as provider,
    ):
        lookup = TimedLookup(HttpLookup(sandbox.url))
        specs = {TOOL: _spec(lookup)}
        scenarios: dict[str, Scenario] = {}
        for name, server, size in (
            ("small", small_server, claims),
            ("large", large_server, records),
        ):
            client = redis.Redis(host="127.0.0.1", port=server.port, decode_responses=True)
            persistence = cast(dict[str, Any], client.config_get("append*"))
            if (
                persistence.get("appendonly") != "yes"
                or persistence.get("appendfsync") != APPENDFSYNC
            ):
                raise RuntimeError(f"unexpected persistence config: {persistence}")
            ledger = TimedLedger(client, namespace=name, allow_volatile=False)
            reconciler = Reconciler(ledger, specs, holder=RECONCILER_HOLDER)
            scenarios[name] = Scenario(
                name, size, claims, server, client, ledger, provider, lookup, reconciler
            )
        small, large = scenarios["small"], scenarios["large"]

        mem_empty = int(large.client.info("memory")["used_memory"])
        _progress(f"bulk-loading {records - claims:,} DONE records into the large ledger ...")
        load = bulk_load(large.ledger, large.client, records - claims)
        mem_loaded = int(large.client.info("memory")["used_memory"])
        settle_s = settle_aof(large.client)
        loaded_bytes = 0
        for i in {0, (records - claims) // 2, records - claims - 1} if records > claims else ():
            loaded_key = derive(SPEC, f"loaded-{i}", _args(i)).key
            loaded_record = large.ledger.get(loaded_key)  # a real record, read the usual way
            if loaded_record is None or loaded_record.state is not State.DONE:
                raise RuntimeError(f"loaded record {i} unreadable: {loaded_record}")
            loaded_bytes = int(
                cast(int, large.client.memory_usage(large.ledger._keys(loaded_key)[0], 0))
            )
        _progress(f"loaded in {load['total_s']:.1f} s; warm-up round, then {rounds} rounds ...")

        for scenario in scenarios.values():  # warm-up: connections, script cache, code paths
            scenario.prepare("warmup", WARMUP_CLAIMS)
            scenario.resolve(WARMUP_CLAIMS)
            scenario.verify()
            scenario.cleanup()
        order_log: list[str] = []
        for r in range(rounds):
            order = [small, large] if r % 2 == 0 else [large, small]
            for scenario in order:
                scenario.run_round(f"r{r}", first=r == 0)
            order_log.append(
                f"round {r + 1}: {order[0].name} first; small {small.times[-1]:.3f} s, "
                f"large {large.times[-1]:.3f} s"
            )
            _progress("  " + order_log[-1])
        mem_info: dict[str, Any] = large.client.info("memory")
        persistence_info: dict[str, Any] = large.client.info("persistence")
        dbsize_end = int(large.client.dbsize())

        _progress(f"lookups: {opts.lookup_keys:,} keys x {LOOKUP_ROUNDS} passes x 2 ...")
        lookup_keys: list[str] = []
        found: set[str] = set()
        for i in range(opts.lookup_keys):
            key = derive(SPEC, f"lookup-{i}", _args(i)).key
            lookup_keys.append(key)
            if i % 2:
                headers = {"Idempotency-Key": key, "Fencing-Token": "1"}
                provider.post("/v1/effects", json={"i": i}, headers=headers).raise_for_status()
                found.add(key)
        rates = lookup_bench(sandbox.url, lookup_keys, found)

        executions = sandbox.stats()["total"]
        expected = small.posted + large.posted + len(found)
        if executions != expected:
            raise RuntimeError(f"provider executed {executions} effects, expected {expected}")
        version = large.server.version

    ratio = large.median_s / small.median_s
    paired = statistics.median(b / a for a, b in zip(small.times, large.times, strict=True))
    lookups_per_s, raw_per_s = rates.lookup_per_s, rates.raw_per_s
    lookup_ratio = lookups_per_s / raw_per_s
    wall_s = time.perf_counter() - wall

    print(
        f"effectq reconciler bench: {claims:,} expired claims among {claims:,} and among "
        f"{records:,} records; redis-server {version} ({binary}), appendonly yes, "
        f"appendfsync {APPENDFSYNC}, auto-aof-rewrite off (args: {' '.join(REDIS_ARGS)})"
    )
    print(
        f"python {platform.python_version()}, redis-py {redis.__version__}, "
        f"hiredis={'yes' if redis.utils.HIREDIS_AVAILABLE else 'no'}, httpx {httpx.__version__}; "
        f"sandbox at {sandbox.url} (lookup lag 0, provider idempotency on); one Reconciler "
        f"in-process, single thread, batch {small.reconciler.batch}/bucket, "
        f"{small.ledger.buckets} buckets"
    )
    print(
        f"two redis-servers, same binary and args: small holds {claims:,} records, large "
        f"{records:,}; warm-up {WARMUP_CLAIMS} claims each, then {rounds} rounds alternating "
        "which goes first; median over rounds"
    )
    print()
    print(
        f"bulk load of {records - claims:,} DONE records (pipelined EVALSHA claim+commit, "
        f"{LOAD_BATCH} effects per pipeline): {load['total_s']:.1f} s "
        f"({(records - claims) / load['total_s']:,.0f} records/s; derive {load['derive_s']:.1f} s, "
        f"redis {load['redis_s']:.1f} s); AOF settle {settle_s:.1f} s"
    )
    print()
    header = f"{'ledger':<8} {'records':>10} {'resolve (median)':>18} {'per round (s)':<32} passes"
    print(header)
    print("-" * len(header))
    for s in scenarios.values():
        per_round = " ".join(f"{t:.3f}" for t in s.times)
        passes = ",".join(str(p) for p in s.passes)
        print(f"{s.name:<8} {s.records:>10,} {s.median_s:>16.3f} s {per_round:<32} {passes}")
    print()
    for line in order_log:
        print(f"  {line}")
    print()
    print(
        f"ratio large/small: {ratio:.3f}   (goal <= 1.2; median of per-round ratios {paired:.3f})"
    )
    print()
    print("where a resolution's time goes (us; summed over all timed rounds):")
    cols = ("scan", "takeover", "lookup", "commit", "fail")
    header = (
        f"{'ledger':<8} {'us/resolve':>10} "
        + " ".join(f"{c:>14}" for c in cols)
        + f" {'python/other':>13} {'redis us/evalsha':>17} {'redis us/resolve':>17}"
    )
    print(header)
    print("-" * len(header))
    for s in scenarios.values():
        total_us = sum(s.times) / s.resolved * 1e6
        cells, accounted = [], 0.0
        for op in cols:
            per_call, per_resolve = s.us(op)
            accounted += per_call * per_resolve
            cells.append(f"{per_call:>7.0f} x{per_resolve:<5.3g}")
        evalsha_us = s.evalsha[1] / s.evalsha[0] if s.evalsha[0] else 0.0
        server_us = (s.evalsha[1] + s.scan_cmds[1]) / s.resolved
        print(
            f"{s.name:<8} {total_us:>10.0f} "
            + " ".join(f"{c:>14}" for c in cells)
            + f" {total_us - accounted:>13.0f} {evalsha_us:>17.1f} {server_us:>17.1f}"
        )
    print("cells: us per call x calls per resolution (client wall time). scan = Ledger.expired:")
    print(f"       TIME + one pipeline of {small.ledger.buckets} ZRANGEBYSCORE, once per pass;")
    print("       takeover, commit, fail = one EVALSHA round trip each; lookup = one HTTP GET.")
    print("       redis us: commandstats usec of the commands the client sent (EVALSHA,")
    print("       ZRANGEBYSCORE; a script's usec covers its inner commands), per EVALSHA and")
    print("       per resolution.")
    print()
    print(
        f"large ledger: dbsize {large.dbsize:,} with the claims in place ({large.record_count:,} "
        f"records by SCAN; the rest are per-bucket stats hashes and lease zsets), "
        f"{dbsize_end:,} at the end"
    )
    print(
        f"  used_memory empty {_mb(mem_empty)}, after load {_mb(mem_loaded)} "
        f"({(mem_loaded - mem_empty) / max(records - claims, 1):.0f} B per loaded record), "
        f"at the end {_mb(int(mem_info['used_memory']))} "
        f"(rss {_mb(int(mem_info['used_memory_rss']))})"
    )
    print(
        f"  AOF {_mb(int(persistence_info['aof_current_size']))}, "
        f"aof_delayed_fsync {persistence_info.get('aof_delayed_fsync', '?')}"
    )
    samples = ", ".join(f"{k} {v} B" for k, v in large.sample_bytes.items())
    print(f"  MEMORY USAGE: loaded DONE record {loaded_bytes} B, {samples}")
    print(
        f"small ledger: dbsize {small.dbsize:,} with the claims in place "
        f"({small.record_count:,} records by SCAN)"
    )
    print()
    print(
        f"lookups: {opts.lookup_keys:,} keys (half exist, same Fencing-Token header both ways), "
        f"{LOOKUP_ROUNDS} passes, alternating in slices of {LOOKUP_SLICE}; "
        f"warm-up {LOOKUP_WARMUP} each"
    )
    print(
        f"  HttpLookup.lookup()  {lookups_per_s:>8,.0f}/s   client cpu {rates.lookup_cpu_us:.0f} us"
    )
    print(f"  raw httpx GET        {raw_per_s:>8,.0f}/s   client cpu {rates.raw_cpu_us:.0f} us")
    print(
        f"  ratio lookup/raw     {lookup_ratio:>8.3f}   (median over slice pairs: "
        f"{rates.median_slice_ratio:.3f})"
    )
    for line in rates.passes:
        print(f"  {line}")
    print(f"provider executions: {executions} (the POSTs only; the reconciler never executes)")
    print(
        f"wall time: {wall_s:.0f} s; load average at start {load_avg[0]:.2f} "
        f"(1 min), {os.cpu_count()} CPUs: anything else running skews every number here"
    )

    result = {
        "bench": "reconciler",
        "claims": claims,
        "records_small": claims,
        "records_large": records,
        "resolve_small_s": round(small.median_s, 4),
        "resolve_large_s": round(large.median_s, 4),
        "ratio": round(ratio, 3),
        "lookups_per_s": round(lookups_per_s, 1),
        "raw_gets_per_s": round(raw_per_s, 1),
        "lookup_ratio": round(lookup_ratio, 3),
        "lookup_ratio_median_slice": round(rates.median_slice_ratio, 3),
        "ratio_median_round": round(paired, 3),
        "rounds": rounds,
        "load_s": round(load["total_s"], 1),
        "dbsize_large": large.dbsize,
        "used_memory_large": int(mem_info["used_memory"]),
        "redis": version,
        "appendfsync": APPENDFSYNC,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
