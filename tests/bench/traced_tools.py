"""``bench_tools`` with this process's tracing set up from ``EFFECTQ_OTEL_ENDPOINT``, as
``workers.entry`` does it: the pools of ``tracing_bench.py`` import this module."""

from __future__ import annotations

from tests.bench.bench_tools import BARE_QUEUE, bench_bare, bench_noop
from workers import tracing
from workers.settings import Settings

__all__ = ["BARE_QUEUE", "bench_bare", "bench_noop"]

tracing.configure(Settings())
