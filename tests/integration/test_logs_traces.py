"""Logs and traces of real runs (docs/observability.md).

* A worker pool with ``EFFECTQ_LOG_FORMAT=json``: its lines are JSON objects with level,
  pid, logger and, for a line written while a message runs, the tool, the key's prefix,
  the message id and the token — never the whole key nor an argument.
* OpenTelemetry: this process submits with a tracer exporting over OTLP/HTTP, a real worker
  process exports its spans to the same receiver — an in-process OTLP/HTTP server decoding
  with the official protobuf messages (``opentelemetry-proto``) — and the spans make one
  trace: submit → process → claim, effect, commit. The reconciler's lookup span is read
  from the SDK's in-memory exporter.
* Tracing off costs the worker path a module-global check: OpenTelemetry is not even
  imported.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dedupe import State
from reconciler import Reconciler
from tests.support.stack import broker_client, wait_for, wait_states
from workers import get_tool, logs, registry, runtime, submit, submit_campaign, tracing
from workers.dev.local import LocalStack

ROOT = Path(__file__).resolve().parents[2]
ARGS = {"customer": "cus-observed-7", "amount": "12.50", "currency": "usd"}


# -- an OTLP/HTTP receiver -------------------------------------------------------------------


class Receiver:
    """Accepts OTLP/HTTP trace exports (protobuf, optionally gzipped) and keeps the spans."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver.take(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def take(self, request: ExportTraceServiceRequest) -> None:
        found = []
        for resource_spans in request.resource_spans:
            service = {
                kv.key: kv.value.string_value for kv in resource_spans.resource.attributes
            }.get("service.name")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        {
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "service": service,
                            "attributes": {
                                kv.key: getattr(kv.value, kv.value.WhichOneof("value") or "")
                                for kv in span.attributes
                            },
                        }
                    )
        with self._lock:
            self.spans.extend(found)

    def named(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [s for s in self.spans if s["name"] == name]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def sdk_enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    # tests/agents/conftest.py switches the OpenTelemetry SDK off for the whole session (so
    # that CrewAI, imported at collection, never phones home): spans need it on here, in
    # this process and in the workers these tests start.
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    yield found
    found.close()


# -- logs ------------------------------------------------------------------------------------


def test_a_worker_pool_logs_json_lines_that_name_the_effect_by_prefix(live: LocalStack) -> None:
    live.start_workers(processes=1, threads=2, EFFECTQ_LOG_FORMAT="json", EFFECTQ_LOG_LEVEL="debug")
    handle = submit("charge", scope="order-logs-1", **ARGS)
    wait_states(runtime.ledger(), [handle.key])
    record = runtime.ledger().get(handle.key)
    assert record is not None and record.state is State.DONE

    def committed() -> list[dict[str, Any]]:
        lines = [json.loads(x) for x in live.log("workers.log").splitlines() if x.startswith("{")]
        return [x for x in lines if x.get("message") == "committed"]

    wait_for(committed, timeout=30, what="the commit's log line")
    line = committed()[0]
    assert line["level"] == "DEBUG" and line["logger"] == "workers.tool"
    assert isinstance(line["process"], int) and line["time"]
    assert line["tool"] == "charge" and line["key"] == handle.key[:12]
    assert line["message_id"] == handle.message_id and line["token"] == record.token
    text = live.log("workers.log")
    started = [json.loads(x) for x in text.splitlines() if "worker 0 started" in x]
    assert started and started[0]["logger"] == "effectq.worker"  # the supervisor's own line
    assert handle.key not in text and ARGS["customer"] not in text
    # Every line is a JSON object, those of each child's `dramatiq` parent process too
    # (tests/integration/test_logs_json.py: retries, uvicorn).
    other = [x for x in text.splitlines() if x.strip() and not x.startswith("{")]
    assert other == [], other[:5]


def test_a_text_line_carries_the_effect_fields_inside_a_message() -> None:
    from workers.settings import Settings

    stream: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            stream.append(self.format(record))

    root = logging.getLogger()
    handler = Keep()
    previous = root.handlers[:], root.level
    root.handlers[:] = [handler]
    try:
        logs.setup(Settings(log_format="text", log_level="info"))
        key = "ab" * 32
        with logs.effect(tool="charge", key=key, message_id="m-1"):
            logs.annotate(token=7)
            logging.getLogger("workers.tool").info("inside")
        logging.getLogger("workers.tool").info("outside")
    finally:
        root.handlers[:], _ = previous
        root.setLevel(previous[1])
    inside, outside = stream
    assert inside.endswith(f"inside [tool=charge key={key[:12]} message_id=m-1 token=7]")
    assert f" INFO {os.getpid()} workers.tool inside" in inside
    assert outside.endswith("workers.tool outside") and key not in inside


def test_an_operator_action_is_logged_with_the_key_prefix_and_a_bounded_reason(
    live: LocalStack, caplog: pytest.LogCaptureFixture
) -> None:
    from reconciler import Operator

    ledger = runtime.ledger()
    effect = get_tool("charge").derive("order-logs-2", ARGS)
    ledger.claim(effect, lease_s=0.05, holder="a holder that died")
    taken: list[Any] = []

    def take_over() -> bool:
        taken.append(ledger.takeover(effect.key, lease_s=30, holder="a reconciler"))
        return taken[-1] is not None

    wait_for(take_over, timeout=10, what="the expired claim taken over")
    ledger.mark_unknown(effect.key, taken[-1].token, reason="lookup never answered")
    reason = "the provider's dashboard shows no charge; ticket 4711. " * 3
    with caplog.at_level(logging.INFO, logger="reconciler.operator"):
        Operator(ledger).resolve(effect.key, executed=False, actor="alice", reason=reason)
    (record,) = [r for r in caplog.records if r.name == "reconciler.operator"]
    line = record.getMessage()
    assert line.startswith(f"operator resolve_failed on {effect.key[:12]} by 'alice': ok: FAILED")
    assert effect.key not in line and len(line) < 200 and reason not in line
    assert record.key == effect.key[:12] and record.outcome.startswith("ok: FAILED")  # type: ignore[attr-defined]


# -- traces ----------------------------------------------------------------------------------


def test_a_trace_runs_from_submit_through_claim_effect_and_commit(
    live: LocalStack, receiver: Receiver
) -> None:
    live.start_workers(
        processes=1, threads=2, EFFECTQ_OTEL_ENDPOINT=receiver.url, OTEL_BSP_SCHEDULE_DELAY="100"
    )
    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{receiver.url}/v1/traces"))
    )
    tracing.install(provider)
    try:
        handle = submit("charge", scope="order-traced-1", **ARGS)
    finally:
        tracing.uninstall()
        provider.shutdown()
    wait_states(runtime.ledger(), [handle.key])
    wait_for(lambda: receiver.named("commit"), timeout=30, what="the commit span")
    (sent,) = receiver.named("submit")
    trace = [s for s in receiver.spans if s["trace_id"] == sent["trace_id"]]
    by_name = {s["name"]: s for s in trace}
    assert set(by_name) == {"submit", "process", "claim", "effect", "commit"}, trace
    assert by_name["process"]["parent_span_id"] == sent["span_id"]
    for child in ("claim", "effect", "commit"):
        assert by_name[child]["parent_span_id"] == by_name["process"]["span_id"]
        assert by_name[child]["service"] == "effectq"  # exported by the worker process
        assert by_name[child]["attributes"]["effectq.key_prefix"] == handle.key[:12]
    assert by_name["claim"]["attributes"]["effectq.claim.outcome"] == "acquired"
    assert by_name["process"]["attributes"]["messaging.message.id"] == handle.message_id
    values = [str(v) for s in trace for v in s["attributes"].values()]
    assert handle.key not in values and not any(ARGS["customer"] in v for v in values)
    # For the report: the trace as received.
    sys.stderr.write(json.dumps(sorted(trace, key=lambda s: s["name"]), indent=1) + "\n")


def test_every_message_of_a_campaign_fan_out_continues_its_trace(live: LocalStack) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        people = [f"person-{i}@example.com" for i in range(5)]
        report = submit_campaign("traced-1", "send_email", people, {"subject": "s", "body": "b"})
    finally:
        tracing.uninstall()
    assert report.sent == 5
    (fan_out,) = [s for s in exporter.get_finished_spans() if s.name == "fan_out"]
    trace_id = f"{fan_out.context.trace_id:032x}"
    queued = broker_client(live).hvals("dramatiq:effectq.msgs")
    carried = [json.loads(m)["options"].get(tracing.TRACEPARENT, "") for m in queued]
    assert len(carried) == 5 and all(tp.split("-")[1] == trace_id for tp in carried), carried


def test_the_reconcilers_lookup_is_a_span_with_the_key_prefix_only(live: LocalStack) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    ledger = runtime.ledger()
    effect = get_tool("charge").derive("order-traced-2", ARGS)
    ledger.claim(effect, lease_s=0.05, holder="a holder that died")
    wait_for(lambda: ledger.expired(None, limit=10), timeout=10, what="the lease expiring")
    tracing.install(provider)
    try:
        Reconciler(ledger, registry.specs(), tracer=tracing.spans()).run_once()
    finally:
        tracing.uninstall()
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "lookup"]
    assert span.attributes is not None
    assert dict(span.attributes) == {
        "effectq.tool": "charge",
        "effectq.key_prefix": effect.key[:12],
        "effectq.token": 2,
    }


def test_with_tracing_off_the_worker_path_never_imports_opentelemetry() -> None:
    # redis-py imports OpenTelemetry's metrics SDK where it is installed; effectq's code
    # must add nothing of OpenTelemetry's to that.
    probe = (
        "import sys, redis, dramatiq\n"
        "before = set(sys.modules)\n"
        "import workers.producer, workers.tool\n"
        "from workers import tracing\n"
        "assert tracing.span('claim', tool='t') is tracing.span('effect', tool='t')\n"
        "assert tracing.traceparent() is None\n"
        "print(sorted(m for m in set(sys.modules) - before if m.startswith('opentelemetry')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": str(ROOT), "EFFECTQ_OTEL_ENDPOINT": ""},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_a_span_costs_nothing_measurable_with_tracing_off() -> None:
    # The worker path enters four of these per message; a claim is a Redis round trip
    # (~100 µs). Measured against an empty `with nullcontext()` in the same run.
    from contextlib import nullcontext

    def per_call(enter: Any, n: int = 200_000) -> float:
        started = time.perf_counter()
        for _ in range(n):
            with enter():
                pass
        return (time.perf_counter() - started) / n

    bare = min(per_call(nullcontext) for _ in range(3))
    traced = min(per_call(lambda: tracing.span("claim", tool="t", key="k")) for _ in range(3))
    assert traced < 2e-6, f"{traced * 1e9:.0f} ns a span (bare with: {bare * 1e9:.0f} ns)"
