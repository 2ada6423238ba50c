"""A tenant's messages (events), where each went, every attempt, and resending one.

The same queries and rules as the portal's message log (dashboards.messages,
dashboards.message_detail): every lookup starts from the tenant, so another tenant's
event, delivery or endpoint id is a 404; received credentials are left out and the
signatures we sent are masked; a shared destination is named, never its URL.
"""

from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api import paging
from api.idempotency import PARAMETER as IDEMPOTENCY_KEY
from api.idempotency import idempotent
from api.problems import Conflict
from api.routes import ENDPOINT, KEY, ULID, tenant_route
from api.schema import NO_NUL, errors
from api.scope import one, tenant_for
from dashboards import message_detail, messages
from delivery.models import Attempt, Delivery
from delivery.replays.resend import RESENDABLE, resend
from tenants import audit
from tenants.models import AuditEntry, Endpoint, Tenant
from webhooks.models import Event

API = AuditEntry.Via.API
# Crockford's base 32, either case.
EVENT_ID_PATTERN = r"^[0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{26}$"
MAX_EVENT_TYPE_CHARS = 200
MAX_ID = 2**63 - 1  # the largest id a bigint column holds: beyond it names nothing


def _iso(moment: datetime | None) -> str | None:
    return moment.astimezone(UTC).isoformat() if moment else None


def _word(status: str) -> str:
    return messages.STATUS_WORDS.get(status, status)


# --- filters ------------------------------------------------------------------------------


class MessageFilters(serializers.Serializer):
    """The list's query parameters (cursor and limit are api.paging's)."""

    event_type = serializers.CharField(
        max_length=MAX_EVENT_TYPE_CHARS, required=False, trim_whitespace=False
    )
    status = serializers.ChoiceField(choices=list(messages.STATUS_FILTERS), required=False)
    endpoint = serializers.IntegerField(min_value=1, max_value=MAX_ID, required=False)
    since = serializers.DateTimeField(required=False)
    until = serializers.DateTimeField(required=False)
    id = serializers.RegexField(
        EVENT_ID_PATTERN,
        required=False,
        trim_whitespace=False,
        error_messages={"invalid": "An event id is 26 letters and digits (a ULID)."},
    )

    def validate_id(self, value: str) -> str:
        return value.upper()

    def validate_endpoint(self, value: int) -> Endpoint:
        # A 404, as for any route naming another tenant's endpoint: the id is well formed,
        # and names nothing this token may see.
        return one(Endpoint.objects.filter(tenant=self.context["tenant"]), "endpoint", pk=value)

    # A window that ends before it starts is not refused: it holds no events.


class AttemptFilters(serializers.Serializer):
    outcome = serializers.ChoiceField(choices=Attempt.Outcome.values, required=False)


def _query(serializer_class: type[serializers.Serializer], request: Request, **context) -> dict:
    """The request's query parameters, checked: a wrong one is a 422 naming it, and so is
    an empty one (a filter is left out, not sent empty), as the document says."""
    given = serializer_class(data=request.query_params.dict(), context=context)
    given.is_valid(raise_exception=True)
    return given.validated_data


MESSAGE_ORDER = ["received_at", "pk"]  # newest first
ATTEMPT_ORDER = ["started_at", "pk"]
MESSAGE_PARAMETERS = [
    OpenApiParameter(
        "event_type",
        {"type": "string", "minLength": 1, "maxLength": MAX_EVENT_TYPE_CHARS, "pattern": NO_NUL},
        description="Only events of this type.",
    ),
    OpenApiParameter(
        "status",
        str,
        enum=list(messages.STATUS_FILTERS),
        description="Only events with a delivery in this status.",
    ),
    OpenApiParameter(
        "endpoint",
        {"type": "integer", "minimum": 1, "maximum": MAX_ID},
        description="Only events with a delivery to this endpoint of the tenant (with "
        "status: the same delivery matches both); 404 if the tenant has no such endpoint.",
    ),
    OpenApiParameter(
        "since", OpenApiTypes.DATETIME, description="Received at or after (ISO 8601)."
    ),
    OpenApiParameter(
        "until", OpenApiTypes.DATETIME, description="Received at or before (ISO 8601)."
    ),
    OpenApiParameter(
        "id",
        {"type": "string", "pattern": EVENT_ID_PATTERN},
        description="Only the event with this id (a ULID, either case).",
    ),
    *paging.parameters(Event, MESSAGE_ORDER),
]
ATTEMPT_PARAMETERS = [
    OpenApiParameter(
        "outcome", str, enum=Attempt.Outcome.values, description="Only attempts with this outcome."
    ),
    *paging.parameters(Attempt, ATTEMPT_ORDER),
]


# --- output -------------------------------------------------------------------------------


class DeliveryOut(serializers.Serializer):
    id = serializers.CharField()
    endpoint_id = serializers.IntegerField()
    status = serializers.ChoiceField(choices=list(messages.STATUS_FILTERS))
    attempts = serializers.IntegerField(
        help_text="Attempts since it was first sent or last sent again (resend, replay)."
    )
    next_attempt_at = serializers.DateTimeField(allow_null=True)
    delivered_at = serializers.DateTimeField(allow_null=True)
    last_error = serializers.CharField()


class MessageOut(serializers.Serializer):
    id = serializers.CharField()
    event_type = serializers.CharField()
    received_at = serializers.DateTimeField()
    payload_removed = serializers.BooleanField(
        help_text="True: retention removed the payload; the event's record stays."
    )
    deliveries = DeliveryOut(many=True)


class AttemptOut(serializers.Serializer):
    number = serializers.IntegerField(help_text="Counts from the last resend or replay.")
    started_at = serializers.DateTimeField()
    duration_ms = serializers.IntegerField()
    status_code = serializers.IntegerField(allow_null=True)
    outcome = serializers.ChoiceField(choices=Attempt.Outcome.values)
    error = serializers.CharField()


class AttemptDetailOut(AttemptOut):
    response_excerpt = serializers.CharField(help_text="The start of the receiver's answer.")
    request_headers = serializers.DictField(
        child=serializers.CharField(), help_text="The headers we sent, signatures masked."
    )


class EndpointAttemptOut(AttemptOut):
    id = serializers.IntegerField()
    delivery_id = serializers.CharField()
    event_id = serializers.CharField()


class DeliveryDetailOut(DeliveryOut):
    event_id = serializers.CharField()
    endpoint = serializers.CharField(
        help_text="The endpoint's URL; a shared destination's description instead."
    )
    shared = serializers.BooleanField(help_text="True: a destination the platform shares.")
    resendable = serializers.BooleanField(
        help_text="True: delivered or dead, with its payload still kept."
    )
    attempt_log = AttemptDetailOut(many=True, help_text="Every attempt made, oldest first.")


class MessageDetailOut(serializers.Serializer):
    id = serializers.CharField()
    event_type = serializers.CharField()
    received_at = serializers.DateTimeField()
    content_type = serializers.CharField()
    headers = serializers.DictField(
        child=serializers.CharField(), help_text="Received headers, without credentials."
    )
    payload = serializers.JSONField(
        allow_null=True,
        help_text="The JSON value when the payload parses as JSON, else its text; null "
        "when retention removed it.",
    )
    payload_is_json = serializers.BooleanField()
    payload_bytes = serializers.IntegerField()
    payload_removed = serializers.BooleanField()
    payload_clipped = serializers.BooleanField(
        help_text="True: larger than the ingest limit; the text shown is its start."
    )
    deliveries = DeliveryDetailOut(many=True)


def _delivery_out(delivery: Delivery) -> dict:
    return {
        "id": delivery.id,
        "endpoint_id": delivery.endpoint_id,
        "status": _word(delivery.status),
        "attempts": delivery.attempts,
        "next_attempt_at": _iso(delivery.next_attempt_at),
        "delivered_at": _iso(delivery.delivered_at),
        "last_error": delivery.last_error,
    }


def _attempt_out(attempt: Attempt) -> dict:
    return {
        "number": attempt.number,
        "started_at": _iso(attempt.started_at),
        "duration_ms": attempt.duration_ms,
        "status_code": attempt.status_code,
        "outcome": attempt.outcome,
        "error": attempt.error,
    }


def _attempt_detail(attempt: Attempt) -> dict:
    return {
        **_attempt_out(attempt),
        "response_excerpt": attempt.response_excerpt,
        "request_headers": dict(message_detail.sent_headers(attempt)),
    }


def _delivery_detail(delivery: Delivery, attempts: list[Attempt], payload_removed: bool) -> dict:
    return {
        **_delivery_out(delivery),
        "event_id": delivery.event_id,
        "endpoint": message_detail.endpoint_label(delivery.endpoint),
        "shared": delivery.endpoint.tenant_id is None,
        "resendable": delivery.status in RESENDABLE and not payload_removed,
        "attempt_log": [_attempt_detail(attempt) for attempt in attempts],
    }


def _payload(event: Event) -> dict[str, Any]:
    """The whole payload (message_detail.payload clips for a page; an API client wants
    all of it), bounded by the ingest limit in case that limit was lowered since."""
    raw = bytes(event.payload or b"")
    removed = event.payload_pruned_at is not None
    clipped = len(raw) > settings.INGEST_MAX_BODY_BYTES
    value: Any = None
    is_json = False
    if not removed:
        try:
            if clipped:
                raise ValueError
            value, is_json = message_detail.parsed_payload(raw), True
        except ValueError:
            value = raw[: settings.INGEST_MAX_BODY_BYTES].decode("utf-8", errors="replace")
    return {
        "payload": value,
        "payload_is_json": is_json,
        "payload_bytes": len(raw),
        "payload_removed": removed,
        "payload_clipped": clipped,
    }


def _message_detail(tenant: Tenant, event: Event) -> dict:
    removed = event.payload_pruned_at is not None
    return {
        "id": event.pk,
        "event_type": event.event_type,
        "received_at": _iso(event.received_at),
        "content_type": event.content_type,
        "headers": dict(message_detail.received_headers(event)),
        **_payload(event),
        "deliveries": [
            _delivery_detail(row["delivery"], [a["attempt"] for a in row["attempts"]], removed)
            for row in message_detail.deliveries(tenant, event)
        ],
    }


def _tenant_delivery(tenant: Tenant, delivery_id: str) -> Delivery:
    return one(
        Delivery.objects.filter(tenant=tenant)
        .select_related("endpoint", "event")
        .defer("event__payload", "event__headers"),
        "delivery",
        pk=delivery_id,
    )


def _delivery_answer(delivery: Delivery) -> dict:
    attempts = list(
        Attempt.objects.filter(delivery=delivery).order_by("started_at", "number", "pk")
    )
    return _delivery_detail(delivery, attempts, delivery.event.payload_pruned_at is not None)


# --- views --------------------------------------------------------------------------------


class MessageList(APIView):
    @extend_schema(
        operation_id="messages_list",
        parameters=MESSAGE_PARAMETERS,
        responses={200: paging.page_of(MessageOut, "Message"), **errors(404, 422)},
    )
    def get(self, request: Request, key: str) -> Response:
        """The tenant's events, newest first, each with its deliveries."""
        tenant = tenant_for(request, key)
        given = _query(MessageFilters, request, tenant=tenant)
        filters = {**given, "event_id": given.get("id", "")}
        # Payloads and headers stay in the database: a list shows neither.
        events = messages.filtered_events(tenant, filters).defer("payload", "headers")
        shown = paging.page(events, request, MESSAGE_ORDER)
        found = messages.Page(shown.rows)
        messages.attach_deliveries(tenant, found)
        return Response(
            shown.answer(
                lambda event: {
                    "id": event.pk,
                    "event_type": event.event_type,
                    "received_at": _iso(event.received_at),
                    "payload_removed": event.payload_pruned_at is not None,
                    "deliveries": [_delivery_out(d) for d in found.deliveries.get(event.pk, [])],
                }
            )
        )


class MessageDetail(APIView):
    @extend_schema(operation_id="messages_get", responses={200: MessageDetailOut, **errors(404)})
    def get(self, request: Request, key: str, event_id: str) -> Response:
        """One event: its payload, the headers received, every delivery and attempt."""
        tenant = tenant_for(request, key)
        event = one(Event.objects.filter(tenant=tenant), "event", pk=event_id)
        return Response(_message_detail(tenant, event))


class EndpointAttempts(APIView):
    @extend_schema(
        operation_id="endpoints_attempts_list",
        parameters=ATTEMPT_PARAMETERS,
        responses={200: paging.page_of(EndpointAttemptOut, "EndpointAttempt"), **errors(404, 422)},
    )
    def get(self, request: Request, key: str, endpoint_id: int) -> Response:
        """The endpoint's attempts, newest first."""
        tenant = tenant_for(request, key)
        endpoint = one(Endpoint.objects.filter(tenant=tenant), "endpoint", pk=endpoint_id)
        outcome = _query(AttemptFilters, request).get("outcome")
        attempts = (
            Attempt.objects.filter(endpoint=endpoint)
            .annotate(event_id=F("delivery__event_id"))
            .defer("response_excerpt", "request_headers")
        )
        if outcome:
            attempts = attempts.filter(outcome=outcome)
        shown = paging.page(attempts, request, ATTEMPT_ORDER)
        return Response(
            shown.answer(
                lambda attempt: {
                    "id": attempt.pk,
                    "delivery_id": attempt.delivery_id,
                    "event_id": attempt.event_id,
                    **_attempt_out(attempt),
                }
            )
        )


class DeliveryDetail(APIView):
    @extend_schema(operation_id="deliveries_get", responses={200: DeliveryDetailOut, **errors(404)})
    def get(self, request: Request, key: str, delivery_id: str) -> Response:
        """One delivery with every attempt made."""
        tenant = tenant_for(request, key)
        return Response(_delivery_answer(_tenant_delivery(tenant, delivery_id)))


class DeliveryResend(APIView):
    @extend_schema(
        operation_id="deliveries_resend",
        request=None,
        parameters=[IDEMPOTENCY_KEY],
        responses={202: DeliveryDetailOut, **errors(404, 409, 422)},
    )
    @idempotent
    def post(self, request: Request, key: str, delivery_id: str) -> Response:
        """Send a dead or delivered delivery again, in the tenant's lane and turns, with
        the same webhook-id. 409 while it is on its way (pending, retrying, held) or
        once retention removed its payload."""
        tenant = tenant_for(request, key)
        delivery = _tenant_delivery(tenant, delivery_id)
        if delivery.status not in RESENDABLE:
            raise Conflict(
                f"Delivery {delivery.id} is {_word(delivery.status)}: only delivered or dead "
                "deliveries can be resent."
            )
        if delivery.event.payload_pruned_at is not None:
            raise Conflict(
                f"Delivery {delivery.id} cannot be resent: its event's payload was removed "
                "after the retention period."
            )
        with transaction.atomic():
            if not resend([delivery]):
                # Changed between the read above and the update (a worker, another resend).
                raise Conflict(f"Delivery {delivery.id} changed meanwhile; read it again.")
            audit.record(
                actor=request.auth,
                action=AuditEntry.Action.DELIVERY_RESENT,
                via=API,
                tenant=tenant,
                target=f"delivery {delivery.id}",
                event_id=delivery.event_id,
                endpoint_id=delivery.endpoint_id,
                previous_status=delivery.status,
            )
        delivery.refresh_from_db()
        return Response(_delivery_answer(delivery), status=202)


EVENT = rf"{KEY}/messages/(?P<event_id>{ULID})"
DELIVERY = rf"{KEY}/deliveries/(?P<delivery_id>{ULID})"

urlpatterns = [
    tenant_route(rf"{KEY}/messages", MessageList, "api-messages"),
    tenant_route(EVENT, MessageDetail, "api-message"),
    tenant_route(rf"{ENDPOINT}/attempts", EndpointAttempts, "api-endpoint-attempts"),
    tenant_route(DELIVERY, DeliveryDetail, "api-delivery"),
    tenant_route(rf"{DELIVERY}/resend", DeliveryResend, "api-delivery-resend"),
]
