"""Traces: one trace id from the API call through the scheduler to each worker's step and its
model or tool call (docs/operations.md#traces).

The trace id travels with the work: in the W3C `traceparent` header of an HTTP request and of
every Celery message the engine sends (`orchestrator.engine.dispatch`), so a step run by a worker
joins the trace of the request (or the earlier step) that queued it, and every log line names it
(`orchestrator.operations.logcontext`). OpenTelemetry spans are made only when STEPWISE_TRACING is
on (off by default): `configure` installs the SDK's tracer provider with the exporter the settings
name; with tracing off `span` costs nothing and only the ids travel.
"""
from collections.abc import Iterator
from contextlib import contextmanager
from secrets import token_hex

from django.conf import settings
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from .logcontext import bind, current, reset

_TRACER = "stepwise"


def enabled() -> bool:
    return bool(getattr(settings, "STEPWISE_TRACING", False))


def configure(exporter=None) -> None:
    """Install the SDK's tracer provider (once per process; called again, it adds the exporter
    to the provider installed) — a test passes its own exporter.

    The exporter is OTLP over HTTP when STEPWISE_OTLP_ENDPOINT is set (the package
    opentelemetry-exporter-otlp-proto-http must be installed), else the console.
    """
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    current = trace.get_tracer_provider()
    provider = current if isinstance(current, TracerProvider) else TracerProvider(
        resource=Resource.create({"service.name": "stepwise"}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif getattr(settings, "STEPWISE_OTLP_ENDPOINT", ""):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=settings.STEPWISE_OTLP_ENDPOINT)))
    else:
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    if provider is not current:  # OpenTelemetry takes a process's provider once
        trace.set_tracer_provider(provider)


def _parse(traceparent: str) -> str:
    parts = (traceparent or "").split("-")
    if len(parts) == 4 and len(parts[1]) == 32 and parts[1] != "0" * 32:
        return parts[1]
    return ""


def headers_out() -> dict:
    """The `traceparent` to send with a message or a request: the current span's, or (tracing
    off) the trace id bound for the logs under a fresh parent id."""
    carrier: dict = {}
    if enabled():
        propagate.inject(carrier)
    if "traceparent" not in carrier and current().get("trace_id"):
        carrier["traceparent"] = f"00-{current()['trace_id']}-{token_hex(8)}-01"
    return carrier


@contextmanager
def continued(name: str, headers: dict | None, *, kind=trace.SpanKind.CONSUMER,
              **attributes) -> Iterator[None]:
    """Continue the trace named in `headers` (a request's or a message's) for a span `name`,
    or start one; bind its id for the logs meanwhile."""
    headers = {k.lower(): v for k, v in (headers or {}).items() if isinstance(v, str)}
    token = None
    if enabled():
        token = otel_context.attach(propagate.extract(headers))
    try:
        with span(name, kind=kind, **attributes) as active:
            trace_id = (format(active.get_span_context().trace_id, "032x")
                        if active is not None and active.get_span_context().is_valid
                        else _parse(headers.get("traceparent", "")) or token_hex(16))
            ids = bind(trace_id=trace_id)
            try:
                yield
            finally:
                reset(ids)
    finally:
        if token is not None:
            otel_context.detach(token)


@contextmanager
def span(name: str, *, kind=trace.SpanKind.INTERNAL, **attributes):
    """A span around a piece of work, a child of the current one; nothing when tracing is off."""
    if not enabled():
        yield None
        return
    attrs = {f"stepwise.{k}": str(v) for k, v in attributes.items() if v is not None}
    with trace.get_tracer(_TRACER).start_as_current_span(name, kind=kind, attributes=attrs) as s:
        yield s
