"""Benchmark: ledger claims+commits per second on a 1-master vs a 3-master Redis Cluster.

    python tests/bench/cluster_bench.py [--seconds S] [--rounds R] [--procs P] [--threads T]

One run starts both clusters (every node its own redis-server: AOF on with
``appendfsync everysec``, no replicas) and alternates them round by round, so drift on
the machine hits both alike. Each round runs P client processes x T threads for S seconds;
every effect is a fresh key: derive, claim, commit (two script calls, the worker's path
without the provider). The ledger, the client and the cluster wiring are the product's own
(``Ledger.from_url`` on a cluster node URL).

On one 2-core machine the servers and the clients share the same cores, so this measures
how the ledger's per-call cost splits across masters, not a cluster's capacity; the ratio
is the figure to quote, with the core count. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from dedupe import Ledger  # noqa: E402
from tests.bench._common import commandstats, pick_binary  # noqa: E402
from tests.support.cluster import LocalCluster  # noqa: E402
from tests.support.ledgers import charge  # noqa: E402

SUBMITS = 20_000  # the submit pass before the claim rounds


def _client(url: str, seconds: float, threads: int, start: Any, out: Any) -> None:
    ledger = Ledger.from_url(url, namespace="bench")
    done = [0] * threads

    def loop(i: int) -> None:
        holder = f"bench/{os.getpid()}/{i}"
        start.wait()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            effect = charge(f"o-{uuid.uuid4().hex}")
            claim = ledger.claim(effect, lease_s=30, holder=holder)
            ledger.commit(effect.key, claim.token, {"id": "r"}, retention_s=600)
            done[i] += 1

    pool = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out.put(sum(done))


def one_round(url: str, seconds: float, procs: int, threads: int) -> float:
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(procs * threads + 1)
    out = ctx.Queue()
    clients = [
        ctx.Process(target=_client, args=(url, seconds, threads, start, out)) for _ in range(procs)
    ]
    for p in clients:
        p.start()
    start.wait(timeout=60)
    began = time.monotonic()
    total = sum(out.get(timeout=seconds + 60) for _ in clients)
    elapsed = time.monotonic() - began
    for p in clients:
        p.join(timeout=30)
    return total / elapsed


def submit_cost(cluster: LocalCluster, n: int = SUBMITS) -> float:
    """Script time of one producer submit (the third script call of an effect), measured
    on its own before the claim rounds, in pipelined batches as campaigns submit."""
    ledger = Ledger.from_url(cluster.url, namespace="bench-submit")
    [node] = cluster.nodes
    _, before = commandstats(node.client()).get("evalsha", (0, 0))
    for start in range(0, n, 500):
        batch = [(charge(f"s-{i}"), f"m-{i}") for i in range(start, start + 500)]
        ledger.submit_many(batch, pending_s=600)
    _, after = commandstats(node.client()).get("evalsha", (0, 0))
    return (after - before) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--binary", choices=["system", "embedded"], default=None)
    args = ap.parse_args()
    binary = pick_binary(args.binary)
    root = Path(tempfile.mkdtemp(prefix="effectq-cluster-bench-"))
    clusters = {n: LocalCluster(binary, root / f"m{n}", masters=n) for n in (1, 3)}
    for cluster in clusters.values():
        for node in cluster.nodes:
            node.extra_args = (*node.extra_args, "--appendfsync", "everysec")
        cluster.start()
    rates: dict[int, list[float]] = {1: [], 3: []}
    try:
        submit_usec = submit_cost(clusters[1])
        for r in range(args.rounds):
            for n, cluster in clusters.items():
                rate = one_round(cluster.url, args.seconds, args.procs, args.threads)
                rates[n].append(rate)
                print(f"round {r + 1}: {n} master(s): {rate:8.0f} effects/s (claim + commit)")
        # Server cost per effect, from the 1-master cluster (every effect went through it):
        # script CPU time from INFO commandstats, memory per stored DONE record.
        [node] = clusters[1].nodes
        client = node.client()
        stats = commandstats(client)
        calls, usec = stats.get("evalsha", (0, 0))
        calls -= SUBMITS  # the submits above
        usec -= round(submit_usec * SUBMITS)
        stored = sum(1 for _ in client.scan_iter(match="{bench:*}:r:*", count=1000))
        # Pending markers of the submit pass hold memory too: drop them before measuring.
        for name in client.scan_iter(match="{bench-submit:*", count=1000):
            client.delete(name)
        memory = client.info("memory")
        per_record = (int(memory["used_memory"]) - int(memory["used_memory_startup"])) / stored
        usec_per_effect = usec / stored
    finally:
        for cluster in clusters.values():
            cluster.stop()
    print(
        f"1-master server cost: {calls / stored:.2f} script calls and {usec_per_effect:.0f} "
        f"us of script time per effect (claim + commit), {submit_usec:.0f} us per submit, "
        f"{per_record:.0f} bytes of memory per DONE record"
    )
    best = {n: max(v) for n, v in rates.items()}
    print(
        f"best of {args.rounds}: 1 master {best[1]:.0f}/s, 3 masters {best[3]:.0f}/s, "
        f"ratio {best[3] / best[1]:.2f} ({os.cpu_count()} cores, {args.procs} client processes "
        f"x {args.threads} threads)"
    )
    print(json.dumps({
        "bench": "cluster_claims",
        "effects_per_s_1_master": round(best[1]),
        "effects_per_s_3_masters": round(best[3]),
        "ratio_3_to_1": round(best[3] / best[1], 2),
        "client_processes": args.procs,
        "threads": args.threads,
        "cores": os.cpu_count(),
        "server_usec_per_effect": round(usec_per_effect, 1),
        "server_usec_per_submit": round(submit_usec, 1),
        "bytes_per_done_record": round(per_record),
        "seconds": args.seconds,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
