"""OpenTelemetry tracing: one trace per export, from the HTTP request through the outbox to
the worker, also across retries and recovery re-dispatch.

Configured by the standard environment variables: ``OTEL_SERVICE_NAME`` (default: the
process's name), ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``, ``none``; default
``none``), ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` and the
rest of the OTLP exporter variables, ``OTEL_TRACES_SAMPLER``, ``OTEL_SDK_DISABLED=true`` to
turn the SDK off. Without an exporter tracing is off entirely (no instrumentation, no trace
ids in the logs), because the instrumentations cost CPU even when nothing is recorded.

How the trace is joined: the submit span's context is stored (W3C ``traceparent``) with the
job and with each of its outbox events. The publisher opens its ``exports.publish`` span as
a CHILD of that stored context, and the Celery instrumentation carries the publish span's
context in the message headers, so the worker's task span is a child too. A worker's claim
can take jobs beside its message's (:mod:`exportcore.claims`): each of those gets its own
``exports.publish`` span in its own trace (a child of its stored context, with a LINK to
the task span of the message that carried the claim), and every claimed job gets its own
``exports.claim`` span, of which its ``exports.render``, ``exports.write``,
``exports.finish`` and lease renewal spans are children: one export, one trace, whatever
batch it ran in. Retries and recovery re-dispatches copy the job's stored context into
their new outbox events, so every attempt lands in the same trace; recovery actions of the
scanner are children of the job's context as well.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace import Link, Span, SpanKind

log = logging.getLogger(__name__)

TRACER_NAME = "notes-exports"
_provider: TracerProvider | None = None
_NO_SPAN: Span = trace.INVALID_SPAN  # what span() yields while tracing is off (a no-op)
_instrumented: set[str] = set()


def tracer() -> trace.Tracer:
    """The tracer of this package (a no-op tracer until :func:`setup_tracing` ran)."""
    return trace.get_tracer(TRACER_NAME)


def _exporters() -> list[SpanExporter]:
    names = [n.strip() for n in os.environ.get("OTEL_TRACES_EXPORTER", "none").split(",")]
    out: list[SpanExporter] = []
    for name in names:
        if name in ("", "none"):
            continue
        if name == "console":
            out.append(ConsoleSpanExporter())
        elif name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            out.append(OTLPSpanExporter())
        else:
            log.warning("unknown OTEL_TRACES_EXPORTER entry ignored", extra={"exporter": name})
    return out


def setup_tracing(
    service: str,
    *,
    exporter: SpanExporter | None = None,
    instrument: tuple[str, ...] = ("psycopg", "celery", "redis"),
) -> TracerProvider | None:
    """Install the tracer provider of this process (idempotent) and the instrumentations.

    ``exporter`` (tests: an in-memory exporter) is added with a simple processor; exporters
    from ``OTEL_TRACES_EXPORTER`` with a batch processor. Returns None — tracing off, no
    instrumentation, our own spans are no-ops — when ``OTEL_SDK_DISABLED`` is true or there
    is nothing to export to: measured, the instrumentations cost 14-18 % of each process's
    CPU even with every span unsampled, so they are only installed when spans go somewhere.
    """
    global _provider
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    if _provider is None:
        exporters = _exporters()
        if not exporters and exporter is None:
            return None
        name = os.environ.get("OTEL_SERVICE_NAME") or f"notes-exports-{service}"
        _provider = TracerProvider(resource=Resource.create({"service.name": name}))
        for exp in exporters:
            _provider.add_span_processor(BatchSpanProcessor(exp))
        trace.set_tracer_provider(_provider)
    if exporter is not None:
        _provider.add_span_processor(SimpleSpanProcessor(exporter))
    for name in instrument:
        _instrument(name)
    return _provider


def _instrument(name: str) -> None:
    if name in _instrumented:
        return
    if name == "psycopg":
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

        PsycopgInstrumentor().instrument(enable_commenter=False)
    elif name == "celery":
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        CeleryInstrumentor().instrument()  # type: ignore[no-untyped-call]
    elif name == "redis":
        from opentelemetry.instrumentation.redis import RedisInstrumentor

        RedisInstrumentor().instrument()
    else:
        raise ValueError(f"unknown instrumentation {name!r}")
    _instrumented.add(name)


def flush(timeout_millis: int = 5000) -> None:
    """Export every finished span now (before a process or a prefork child exits)."""
    if _provider is not None:
        _provider.force_flush(timeout_millis)


def shutdown() -> None:
    """Flush and stop the exporters (on TERM)."""
    if _provider is not None:
        _provider.shutdown()


def current_context() -> dict[str, str]:
    """The current trace context as W3C headers (``traceparent``), to store with a job."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


Parent = Mapping[str, str] | otel_context.Context | None
"""A span's parent: a stored W3C carrier (``traceparent``), an OpenTelemetry context, or
None (the current span)."""


def _as_context(parent: Parent) -> otel_context.Context | None:
    if parent is None or isinstance(parent, otel_context.Context):
        return parent
    return propagate.extract(dict(parent)) if parent else None


@contextmanager
def span(
    name: str,
    *,
    parent: Parent = None,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
    links: list[Link] | None = None,
) -> Iterator[Span]:
    """A span named ``name``, current inside the block; with ``parent`` (a stored
    ``traceparent`` carrier or a context) it joins that trace as a child, else it is a
    child of the current span. ``None`` attributes are left out."""
    if _provider is None:  # tracing is off: no span, no context, no attributes
        yield _NO_SPAN
        return
    ctx = _as_context(parent)
    token = otel_context.attach(ctx) if ctx is not None else None
    try:
        with tracer().start_as_current_span(name, kind=kind, links=links) as current:
            set_attributes(current, attributes or {})
            yield current
    finally:
        if token is not None:
            otel_context.detach(token)


def record(
    name: str,
    *,
    parent: Parent,
    start_ns: int,
    end_ns: int,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
    links: list[Link] | None = None,
) -> otel_context.Context | None:
    """Record a finished span of ``name`` that ran from ``start_ns`` to ``end_ns``
    (``time.time_ns()`` nanoseconds), a child of ``parent``: for one job's share of a step
    several jobs shared (a batch claim, a batch's artifact commit). Returns the context of
    the span, for its children (None while tracing is off)."""
    if _provider is None:
        return None
    ctx = _as_context(parent)
    current = tracer().start_span(name, context=ctx, kind=kind, links=links, start_time=start_ns)
    set_attributes(current, attributes or {})
    current.end(end_time=end_ns)
    return trace.set_span_in_context(current)


def current_link() -> list[Link]:
    """A link to the current span (``[]`` when there is none or tracing is off): what a
    job's span carries when another job's message or task served it."""
    if _provider is None:
        return []
    ctx = trace.get_current_span().get_span_context()
    return [Link(ctx)] if ctx.is_valid else []


def in_trace_of(parent: Parent) -> bool:
    """True when the current span belongs to the trace of ``parent`` (a stored carrier or
    a context): a message's own job, whose task span is already in its trace."""
    if _provider is None:
        return False
    ctx = _as_context(parent)
    if ctx is None:
        return False
    wanted = trace.get_current_span(ctx).get_span_context()
    current = trace.get_current_span().get_span_context()
    return wanted.is_valid and current.is_valid and wanted.trace_id == current.trace_id


def set_attributes(current: Span, attributes: Mapping[str, Any]) -> None:
    """Set the non-None ``attributes`` (UUIDs and other objects as strings)."""
    for key, value in attributes.items():
        if value is None:
            continue
        current.set_attribute(
            key, value if isinstance(value, bool | int | float | str) else str(value)
        )


def enabled() -> bool:
    """True when this process records spans (:func:`setup_tracing` installed a provider)."""
    return _provider is not None


def job_attributes(job: Any, message_id: Any = None) -> dict[str, Any]:
    """``job_id``, ``message_id``, ``lease_token``, ``attempt``, ``queue``, ``tenant_id`` of
    a job row (a mapping of columns or a typed ``store.jobs.JobRow``); empty when tracing
    is off (nothing would read them)."""
    if _provider is None:
        return {}

    def get(name: str) -> Any:
        return job.get(name) if isinstance(job, Mapping) else getattr(job, name, None)

    return {
        "job_id": get("id"),
        "message_id": message_id,
        "lease_token": get("lease_token"),
        "attempt": get("attempts"),
        "queue": get("queue"),
        "tenant_id": get("tenant_id"),
    }


class TraceIdFilter(logging.Filter):
    """Adds ``trace_id`` and ``span_id`` (hex) of the current span to every log record."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            record.trace_id = format(ctx.trace_id, "032x")
            record.span_id = format(ctx.span_id, "016x")
        return True
