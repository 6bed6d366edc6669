"""``effectq_build_info{version}`` = 1: which release a target runs, beside the chart's
``app.kubernetes.io/version`` label and ``effectq --version`` (docs/release.md).

The version is the installed package's (``importlib.metadata``), which setuptools-scm took
from the repository's tag at build time. A collector, not a Gauge: it is the same in every
process, so a worker pool's endpoint yields it once beside the multiprocess sum instead of
writing a gauge file per process."""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from importlib.metadata import PackageNotFoundError, version

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

__all__ = ["BuildInfo", "package_version"]


@cache
def package_version() -> str:
    """This installation's version; "unknown" for a source tree run without installing."""
    try:
        return version("effectq")
    except PackageNotFoundError:
        return "unknown"


class BuildInfo:
    """Yields ``effectq_build_info{version="…"} 1``."""

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "effectq_build_info",
            "Always 1; the version label is the effectq release this process runs.",
            labels=["version"],
        )
        family.add_metric([package_version()], 1)
        yield family
