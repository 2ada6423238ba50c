"""One delivery attempt's spans, while tracing is on (core.tracing).

An attempt is one span, `webhook.deliver`, a child of the span that accepted its event
(the traceparent stored with the event), so each event's trace runs from the provider's
POST through every attempt, across the queue. Under it: `scheduler.pick` (the pick and
the load that handed it to this worker), the request (`POST`, a client span whose
traceparent the receiver gets when its endpoint opts in) and `webhook.record` (the
group's transaction and acknowledgement it was part of).

The engine's threads each own one stage of an attempt, so the spans are started and
ended with explicit times rather than made current: nothing here touches a thread's
context, and a worker's libcurl loop drives hundreds of attempts on one thread.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from core import tracing
from delivery.pipeline.policy import Action

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from delivery.models import Delivery
    from delivery.pipeline.sending import Finished
    from delivery.scheduler import Lease

logger = logging.getLogger(__name__)
_Method = TypeVar("_Method", bound=Callable[..., Any])


def _never_raises(method: _Method) -> _Method:
    """A trace is no delivery's business: whatever making a span raises (an odd URL, an
    exporter's bug) is logged, and the delivery goes on untraced."""

    @functools.wraps(method)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except Exception:
            logger.exception("tracing %s failed; the delivery goes on", method.__name__)
            return None

    return guarded  # type: ignore[return-value]


@_never_raises
def begin(
    tracer: Tracer, lease: Lease, delivery: Delivery, picked_ns: int, loaded_ns: int
) -> AttemptTrace | None:
    """The attempt's spans, or None if they cannot be made (it goes on untraced)."""
    return AttemptTrace(tracer, lease, delivery, picked_ns, loaded_ns)


class AttemptTrace:
    """The spans of one attempt: started at its pick, ended once it is recorded."""

    __slots__ = ("_context", "_send_header", "_tracer", "attempt", "request")

    def __init__(
        self, tracer: Tracer, lease: Lease, delivery: Delivery, picked_ns: int, loaded_ns: int
    ) -> None:
        event, endpoint = delivery.event, delivery.endpoint
        self._tracer = tracer
        self._send_header = endpoint.send_trace_context
        self.attempt: Span = tracer.start_span(
            "webhook.deliver",
            context=tracing.parent_from(event.trace_parent),
            kind=SpanKind.CONSUMER,
            start_time=picked_ns,
            attributes={
                "webhook.id": event.id,
                "webhook.delivery_id": delivery.pk,
                "webhook.endpoint_id": endpoint.pk,
                "webhook.tenant_id": lease.tenant_id if lease.tenant_id is not None else -1,
                "webhook.lane": lease.lane,
                "webhook.attempt": delivery.attempts + 1,
            },
        )
        self._context = trace.set_span_in_context(self.attempt)
        tracer.start_span("scheduler.pick", context=self._context, start_time=picked_ns).end(
            end_time=loaded_ns
        )
        self.request: Span | None = None

    @_never_raises
    def request_started(self, url: str) -> str | None:
        """Start the request's span; its traceparent for the request's headers when the
        endpoint wants one, else None."""
        target = urlsplit(url)
        try:
            port = target.port or (443 if target.scheme == "https" else 80)
        except ValueError:  # not a port: the transport says so as the attempt's error
            port = 0
        self.request = self._tracer.start_span(
            "POST",
            context=self._context,
            kind=SpanKind.CLIENT,
            attributes={
                "http.request.method": "POST",
                # Host and path only: a URL's query may carry the receiver's secret.
                "server.address": target.hostname or "",
                "server.port": port,
                "url.scheme": target.scheme,
                "url.path": target.path or "/",
            },
        )
        if not self._send_header:
            return None
        return tracing.traceparent_of(self.request.get_span_context())

    @_never_raises
    def answered(self, finished: Finished) -> None:
        """The request is over (or never started: a failure before it, recorded as such)."""
        if self.request is None:
            return
        if finished.sent is not None:
            result = finished.sent.result
            if result.status_code is not None:
                self.request.set_attribute("http.response.status_code", result.status_code)
            if result.error_kind:
                self.request.set_attribute("error.type", result.error_kind)
            if result.error or (result.status_code or 0) >= 400:
                self.request.set_status(Status(StatusCode.ERROR, result.error or None))
        self.request.end()

    @_never_raises
    def recorded(self, finished: Finished, started_ns: int, ended_ns: int, stored: bool) -> None:
        """Recorded (`stored`) or not, the attempt is over for this worker."""
        span = self._tracer.start_span(
            "webhook.record", context=self._context, start_time=started_ns
        )
        if not stored:
            span.set_status(Status(StatusCode.ERROR, "not recorded; its lease brings it back"))
        span.end(end_time=ended_ns)
        sent = finished.sent
        if sent is not None:
            action = sent.decision.action
            self.attempt.set_attribute("webhook.outcome", str(action))
            if action != Action.DELIVERED:
                self.attempt.set_status(Status(StatusCode.ERROR, sent.decision.reason))
        elif finished.held is not None:
            self.attempt.set_attribute("webhook.outcome", "held")
        self.attempt.end(end_time=ended_ns)
