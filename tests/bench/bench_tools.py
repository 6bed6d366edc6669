"""The two actors of ``worker_bench.py``, for ``python -m dramatiq tests.bench.bench_tools``
(run from the repository root: ``tests`` and ``tests.bench`` are namespace packages).

* ``bench_noop`` — an ``@effect_tool`` whose body returns a tiny receipt and calls nothing:
  what a worker spends on it is the guard (envelope check, key derivation, claim, lease
  keeper, commit) plus Dramatiq's own fetch / ack. Queue: the default ``effectq``.
* ``bench_bare`` — a plain ``@dramatiq.actor`` no-op on the same broker (same middleware,
  same Redis), in its own queue ``bare`` so each phase of the bench drains one queue. The
  bench sends it the same envelope-shaped payload, so message size and decoding match.

Both bind to ``workers.runtime.broker()``, built from ``EFFECTQ_BROKER_URL`` at import.
"""

from __future__ import annotations

from typing import Any

import dramatiq

from workers import runtime
from workers.tool import EffectCall, effect_tool

__all__ = ["BARE_QUEUE", "bench_bare", "bench_noop"]

BARE_QUEUE = "bare"


@effect_tool(identity=("n",), bound=("n",), name="bench_noop")
def bench_noop(call: EffectCall, n: int) -> dict[str, Any]:
    return {"n": n, "ok": True}


@dramatiq.actor(queue_name=BARE_QUEUE, actor_name="bench_bare", broker=runtime.broker())
def bench_bare(envelope: dict[str, Any]) -> None:
    return None
