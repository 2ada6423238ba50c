"""OpenTelemetry traces: off unless the environment names an exporter.

Configured by the SDK's own variables (OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_*,
OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER, OTEL_BSP_*, ...), read
by the SDK itself. Tracing is on when OTEL_TRACES_EXPORTER names an exporter other than
`none`, or an OTLP endpoint is set (the exporter is then `otlp`), and OTEL_SDK_DISABLED is
not true. Off, nothing of the SDK is loaded and each hook below costs one global read: the
hot paths (ingest, the delivery engine) call them per event and per delivery.

On, the well-kept instrumentations trace what they know (Django's requests, psycopg's
statements, redis-py's commands) and the platform adds its own spans: ingest's steps and,
per delivery attempt, one span that is a child of the span that accepted the event (its
W3C traceparent is stored with the event), so an event's trace runs from the provider's
POST to each attempt across the queue (docs/DEPLOY.md, "Traces").
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

logger = logging.getLogger(__name__)
_OFF: AbstractContextManager[None] = nullcontext()
_TRACEPARENT_LENGTH = 55  # "00-" 32 hex "-" 16 hex "-" 2 hex

_tracer: Tracer | None = None
_provider: TracerProvider | None = None


def enabled() -> bool:
    return _tracer is not None


def tracer() -> Tracer | None:
    """The platform's tracer while tracing is on, else None."""
    return _tracer


def exporter_names(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The exporters the environment asks for; empty when tracing is off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    named = environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if not named and (
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        named = "otlp"
    names = [name.strip() for name in named.split(",") if name.strip()]
    return [] if not names or "none" in names else names


def _exporter(name: str) -> Any:
    from importlib.metadata import entry_points

    # We ship OTLP over HTTP (opentelemetry-exporter-otlp-proto-http); `otlp` means that
    # one unless an OTLP/gRPC exporter is installed under the name itself.
    wanted = [name, "otlp_proto_http"] if name == "otlp" else [name]
    for candidate in wanted:
        found = entry_points(group="opentelemetry_traces_exporter", name=candidate)
        for entry in found:
            return entry.load()()
    raise ValueError(
        f"OTEL_TRACES_EXPORTER names {name!r}, which no installed package provides "
        "(installed: otlp, console)"
    )


def configure_from_environment(environ: Mapping[str, str] = os.environ) -> bool:
    """Start tracing if the environment asks for it; True if it is on. Call once per
    process, after Django's settings are importable and before the WSGI handler loads
    its middleware (the Django instrumentation adds one)."""
    names = exporter_names(environ)
    if not names or enabled():
        return enabled()
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # Resource.create() reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the
    # provider reads OTEL_TRACES_SAMPLER, the processor OTEL_BSP_*.
    provider = TracerProvider(resource=Resource.create({"service.name": "fairhooks"}))
    for name in names:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
    start(provider)
    logger.info("tracing on: exporting to %s", ", ".join(names))
    return True


def start(provider: TracerProvider) -> None:
    """Trace into `provider` (the tests' in-memory one, or the environment's)."""
    global _tracer, _provider
    from opentelemetry import trace
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    if _provider is None:
        # The global one is for third-party code that asks for it; set once per process.
        trace.set_tracer_provider(provider)
    # Probes (/healthz, /readyz) never reach Django's middleware, so they make no spans.
    DjangoInstrumentor().instrument(tracer_provider=provider)
    PsycopgInstrumentor().instrument(tracer_provider=provider, skip_dep_check=True)
    RedisInstrumentor().instrument(tracer_provider=provider)
    _provider = provider
    _tracer = provider.get_tracer("fairhooks")


def stop() -> None:
    """Stop tracing (the tests turn it on and off); spans already made are flushed."""
    global _tracer
    if _tracer is None:
        return
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    for instrumentor in (DjangoInstrumentor(), PsycopgInstrumentor(), RedisInstrumentor()):
        instrumentor.uninstrument()
    if _provider is not None:
        _provider.force_flush()
    _tracer = None


def span(name: str, attributes: Mapping[str, Any] | None = None) -> AbstractContextManager[Any]:
    """A span around a block while tracing is on (a child of the current one); else a
    context that does nothing."""
    if _tracer is None:
        return _OFF
    return _tracer.start_as_current_span(name, attributes=attributes)


def current_traceparent() -> str:
    """The current span's W3C traceparent, or "" (tracing off, or no span)."""
    if _tracer is None:
        return ""
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return ""
    return traceparent_of(context)


def traceparent_of(context: Any) -> str:
    """A SpanContext as a W3C traceparent header value."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def parent_from(traceparent: str) -> Any:
    """An OpenTelemetry Context whose parent is the span `traceparent` names, or None
    when it names none (empty, or not a valid traceparent)."""
    if len(traceparent) != _TRACEPARENT_LENGTH:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    context = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    from opentelemetry import trace

    return context if trace.get_current_span(context).get_span_context().is_valid else None


def untraced(target: Callable[[], None]) -> Callable[[], None]:
    """`target`, run with the instrumentations silent while tracing is on: a delivery
    worker's threads pick, load, record and acknowledge for many events at once, so no
    one event's trace is theirs; each attempt shows those steps as spans of its own
    (delivery.pipeline.attempt_trace) instead of a root trace per Redis call."""

    def run() -> None:
        if _tracer is None:
            target()
            return
        from opentelemetry.instrumentation.utils import suppress_instrumentation

        with suppress_instrumentation():
            target()

    return run
