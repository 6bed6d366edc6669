"""``effectq_build_info{version}`` says the version ``effectq --version`` prints, on every
endpoint's exposition (tests/chart/test_chart_release.py: the tag, the chart and the labels;
tests/image: all of them in a built image)."""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from workers.cli import app
from workers.metrics import LABELS
from workers.metrics.build import BuildInfo


def test_build_info_is_one_sample_of_1_labelled_with_the_cli_version() -> None:
    registry = CollectorRegistry()
    registry.register(BuildInfo())
    families = {
        f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())
    }
    (sample,) = families["effectq_build_info"].samples
    assert sample.value == 1 and set(sample.labels) == {"version"} <= LABELS
    printed = CliRunner().invoke(app, ["--version"]).stdout
    assert printed == f"effectq {sample.labels['version']}\n"
    assert sample.labels["version"] == version("effectq")


def test_a_metrics_endpoint_serves_build_info_while_its_ledger_is_down() -> None:
    import httpx
    import redis

    from workers.dev.ports import free_port
    from workers.metrics.server import serve

    def unreachable() -> Any:
        raise redis.ConnectionError("no ledger in this test")

    server = serve(free_port(), "127.0.0.1", unreachable, multiprocess_dir="")
    assert server is not None
    try:
        body = httpx.get(server.url, timeout=10).text
    finally:
        server.close()
    assert f'effectq_build_info{{version="{version("effectq")}"}} 1.0' in body
    assert "effectq_ledger_up 0.0" in body
