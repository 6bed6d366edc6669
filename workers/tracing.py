"""Optional OpenTelemetry traces (extra ``[otel]``; off unless EFFECTQ_OTEL_ENDPOINT is set).

When on, ``submit`` opens a ``submit`` span and carries its W3C ``traceparent`` in the
Dramatiq message's options; the worker continues that trace with a ``process`` span and,
under it, ``claim``, ``effect`` (the tool body) and ``commit``; the reconciler's provider
``lookup`` is a span of its own. Spans carry the tool, the key's first 12 hex digits, the
fencing token and the message id: never a whole key, never an argument or a receipt.

Off (no endpoint, or the extra missing), every function here is a check of one module
global and returns a shared no-op context: the worker path pays nothing measurable, and
OpenTelemetry is never imported.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from .logs import key_prefix

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

    from .settings import Settings

__all__ = [
    "TRACEPARENT",
    "Spans",
    "configure",
    "enabled",
    "install",
    "note",
    "process",
    "span",
    "spans",
    "traceparent",
    "uninstall",
]

log = logging.getLogger(__name__)

#: The message option that carries the producer's trace context.
TRACEPARENT = "traceparent"

_OFF: AbstractContextManager[None] = contextlib.nullcontext()
_tracer: Tracer | None = None
_provider: TracerProvider | None = None


def enabled() -> bool:
    return _tracer is not None


def configure(settings: Settings) -> bool:
    """Export this process's spans to ``settings.otel_endpoint`` over OTLP/HTTP; whether
    tracing is on. Without an endpoint, off; with one but without the ``[otel]`` extra, off
    with a warning (a process never fails to start for want of traces)."""
    endpoint = settings.otel_endpoint.strip()
    if not endpoint:
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("EFFECTQ_OTEL_ENDPOINT is set but the [otel] extra is not installed: no traces")
        return False
    resource = Resource.create({"service.name": settings.otel_service_name})
    provider = TracerProvider(resource=resource)
    exporter = OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")
    provider.add_span_processor(BatchSpanProcessor(exporter))
    install(provider)
    # Spans still batched at exit (a drained worker, a CLI submit) are sent, not dropped.
    atexit.register(provider.shutdown)
    return True


def install(provider: TracerProvider) -> None:
    """Trace with ``provider`` (tests: one with an in-memory exporter). Kept apart from
    OpenTelemetry's global provider, which can be set once per process."""
    global _tracer, _provider
    _provider, _tracer = provider, provider.get_tracer("effectq")


def uninstall() -> None:
    """Tracing off again (tests)."""
    global _tracer, _provider
    _provider, _tracer = None, None


def _attributes(
    tool: str | None, key: str | None, token: int | None, message_id: str | None
) -> dict[str, str | int]:
    found: dict[str, str | int] = {}
    if tool is not None:
        found["effectq.tool"] = tool
    if key is not None:
        found["effectq.key_prefix"] = key_prefix(key)
    if token is not None:
        found["effectq.token"] = token
    if message_id is not None:
        found["messaging.message.id"] = message_id
    return found


def span(
    name: str,
    *,
    tool: str | None = None,
    key: str | None = None,
    token: int | None = None,
    message_id: str | None = None,
    producer: bool = False,
) -> AbstractContextManager[Span | None]:
    """A span named ``name``, child of the current one; the span (None when off)."""
    tracer = _tracer
    if tracer is None:
        return _OFF
    from opentelemetry.trace import SpanKind

    return tracer.start_as_current_span(
        name,
        kind=SpanKind.PRODUCER if producer else SpanKind.INTERNAL,
        attributes=_attributes(tool, key, token, message_id),
    )


def process(
    options: Mapping[str, Any], *, tool: str, message_id: str
) -> AbstractContextManager[Span | None]:
    """The worker's span for one message, continuing the trace its ``traceparent`` option
    names (a new trace without one)."""
    tracer = _tracer
    if tracer is None:
        return _OFF
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carried = options.get(TRACEPARENT)
    parent = (
        TraceContextTextMapPropagator().extract({TRACEPARENT: carried})
        if isinstance(carried, str)
        else None
    )
    return tracer.start_as_current_span(
        "process",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=_attributes(tool, None, None, message_id),
    )


def traceparent() -> str | None:
    """The current span's W3C ``traceparent``, to carry in a message (None when off)."""
    if _tracer is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get(TRACEPARENT)


def note(current: Span | None, name: str, value: str | int) -> None:
    """Set one attribute on ``current`` (a no-op when tracing is off)."""
    if current is not None:
        current.set_attribute(name, value)


class Spans:
    """The reconciler's tracer (``reconciler.reconciler.Tracer``): its package does not
    import workers, so it is handed this."""

    def span(self, name: str, *, tool: str, key: str, token: int) -> AbstractContextManager[object]:
        return span(name, tool=tool, key=key, token=token)


def spans() -> Spans:
    return Spans()
