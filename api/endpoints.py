"""/api/v1/tenants/{key}/endpoints: a tenant's endpoints, their signing secrets and their
health. The same rules as the portal and the admin: the URL passes the SSRF check
(core.netguard), every change is audited (dashboards.endpoint_actions), disabling holds
deliveries and enabling resumes them. A tenant's own token sets caps and rates only up
to what the operator allows tenants (API_TENANT_*); an operator token up to the model's
bounds."""

from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import redis
from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import Throttled
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api import paging
from api.idempotency import PARAMETER as IDEMPOTENCY_KEY
from api.idempotency import idempotent
from api.problems import Conflict
from api.schema import errors
from api.scope import one, tenant_for
from api.strict import RoundedDecimalField, StrictSerializer, query_flag
from core import operational
from core.netguard import is_uri, validate_destination_url
from dashboards import endpoint_actions
from dashboards.endpoint_forms import (
    DISABLE_REASON_CHARS,
    MAX_EVENT_TYPE_CHARS,
    MAX_EVENT_TYPES,
    MAX_OVERLAP_HOURS,
    MIN_OVERLAP_HOURS,
)
from dashboards.endpoint_health import WindowHealth, endpoint_health
from delivery.models import Delivery
from delivery.scheduler import get_scheduler
from tenants import audit
from tenants.models import AuditEntry, Endpoint, EndpointSecret, mask_secret

API = AuditEntry.Via.API
SETTINGS = (
    "max_in_flight",
    "fixed_max_in_flight",
    "retry_max_in_flight",
    "rate_limit_per_second",
    "timeout_seconds",
    "sign_requests",
    "send_trace_context",
    "operational_events",
)
CHANGEABLE = ("url", "description", "event_types", *SETTINGS)
CAP_HELP = (
    "Requests open to it at once at most, fixed; null: a limit that adapts to how it "
    "answers under the platform's ceiling (or the platform's fixed cap where limits do not "
    "adapt). Where the platform adapts every endpoint, a number here is the ceiling."
)
FIXED_HELP = (
    "True: its limit never adapts to how it answers; max_in_flight, or when null the "
    "platform's fixed cap, is its limit."
)


class EndpointOut(serializers.Serializer):
    id = serializers.IntegerField()
    url = serializers.CharField()
    description = serializers.CharField()
    event_types = serializers.ListField(
        child=serializers.CharField(), help_text="Types delivered; empty: every type."
    )
    max_in_flight = serializers.IntegerField(allow_null=True, help_text=CAP_HELP)
    in_flight_cap = serializers.IntegerField(
        help_text="The cap that applies: max_in_flight, or when null the platform's."
    )
    fixed_max_in_flight = serializers.BooleanField(help_text=FIXED_HELP)
    adapts_concurrency = serializers.BooleanField(
        help_text="Whether its in-flight limit adapts to how it answers, under in_flight_cap "
        "(its stats' concurrency shows the limit now)."
    )
    retry_max_in_flight = serializers.IntegerField()
    rate_limit_per_second = serializers.FloatField(allow_null=True)
    timeout_seconds = serializers.IntegerField()
    sign_requests = serializers.BooleanField()
    send_trace_context = serializers.BooleanField(
        help_text="Requests carry the W3C traceparent of the delivery's trace (when traced)."
    )
    operational_events = serializers.ListField(
        child=serializers.CharField(),
        help_text="Operational events this endpoint receives instead of its tenant's "
        "events (docs/OPERATIONAL_EVENTS.md); empty: none.",
    )
    enabled = serializers.BooleanField()
    disabled_reason = serializers.CharField()
    disabled_at = serializers.DateTimeField(allow_null=True)
    consecutive_failures = serializers.IntegerField()
    failing_since = serializers.DateTimeField(allow_null=True)
    last_success_at = serializers.DateTimeField(allow_null=True)
    last_failure_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()


class EndpointCreated(EndpointOut):
    secret = serializers.CharField(
        allow_null=True, help_text="The signing secret, shown this once; null when unsigned."
    )


def _iso(moment) -> str | None:
    return moment.isoformat() if moment else None


def endpoint_out(endpoint: Endpoint) -> dict:
    rate = endpoint.rate_limit_per_second
    return {
        "id": endpoint.pk,
        "url": endpoint.url,
        "description": endpoint.description,
        "event_types": endpoint.event_type_filter(),
        "max_in_flight": endpoint.max_in_flight,
        "in_flight_cap": endpoint.in_flight_cap,
        "fixed_max_in_flight": endpoint.fixed_max_in_flight,
        "adapts_concurrency": endpoint.adapts_concurrency,
        "retry_max_in_flight": endpoint.retry_max_in_flight,
        "rate_limit_per_second": float(rate) if rate else None,
        "timeout_seconds": endpoint.timeout_seconds,
        "sign_requests": endpoint.sign_requests,
        "send_trace_context": endpoint.send_trace_context,
        "operational_events": endpoint.operational_filter(),
        "enabled": endpoint.enabled,
        "disabled_reason": endpoint.disabled_reason,
        "disabled_at": _iso(endpoint.disabled_at),
        "consecutive_failures": endpoint.consecutive_failures,
        "failing_since": _iso(endpoint.failing_since),
        "last_success_at": _iso(endpoint.last_success_at),
        "last_failure_at": _iso(endpoint.last_failure_at),
        "created_at": endpoint.created_at.isoformat(),
    }


class EndpointChange(StrictSerializer):
    url = serializers.URLField(max_length=2000, required=False)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)
    event_types = serializers.ListField(
        child=serializers.CharField(max_length=MAX_EVENT_TYPE_CHARS),
        max_length=MAX_EVENT_TYPES,
        required=False,
        help_text="Types to deliver; empty: every type.",
    )
    max_in_flight = serializers.IntegerField(
        min_value=1, max_value=1000, allow_null=True, required=False, help_text=CAP_HELP
    )
    fixed_max_in_flight = serializers.BooleanField(required=False, help_text=FIXED_HELP)
    retry_max_in_flight = serializers.IntegerField(min_value=1, max_value=1000, required=False)
    rate_limit_per_second = RoundedDecimalField(
        max_digits=9,
        decimal_places=3,
        min_value=Decimal("0.001"),
        max_value=Decimal(10_000),
        allow_null=True,
        required=False,
        help_text="Requests started per second at most; null: no rate limit.",
    )
    timeout_seconds = serializers.IntegerField(min_value=1, max_value=120, required=False)
    sign_requests = serializers.BooleanField(required=False)
    send_trace_context = serializers.BooleanField(required=False)
    operational_events = serializers.ListField(
        child=serializers.ChoiceField(choices=["*", *operational.TYPES]),
        max_length=len(operational.TYPES) + 1,
        required=False,
        help_text="Operational events to receive instead of the tenant's own events "
        "(`*`: all); empty: none.",
    )

    def validate_operational_events(self, value: list[str]) -> str:
        return ",".join(dict.fromkeys(value))

    def validate_url(self, value: str) -> str:
        if not is_uri(value):
            raise serializers.ValidationError(
                "Not a URI as RFC 3986 writes one: percent-encode spaces, non-ASCII text "
                'and the characters " < > \\ ^ ` { | }, and [ ] outside an IPv6 host.'
            )
        try:
            validate_destination_url(value, allow_private=settings.ALLOW_PRIVATE_DESTINATIONS)
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.messages) from exc
        return value

    def validate_event_types(self, value: list[str]) -> str:
        types = [item.strip() for item in value if item.strip()]
        if any(not item.isprintable() or "," in item for item in types):
            raise serializers.ValidationError("Printable names without commas.")
        return ", ".join(dict.fromkeys(types))

    def validate(self, data: dict) -> dict:
        operator = self.context["operator"]
        limits = {
            "max_in_flight": settings.API_TENANT_MAX_IN_FLIGHT,
            "retry_max_in_flight": settings.API_TENANT_MAX_IN_FLIGHT,
            "rate_limit_per_second": settings.API_TENANT_MAX_RATE_PER_SECOND,
            "timeout_seconds": settings.API_TENANT_MAX_TIMEOUT_SECONDS,
        }
        problems = {}
        if not operator:
            for name, limit in limits.items():
                value = data.get(name)
                if value is not None and value > limit:
                    problems[name] = [f"At most {limit:g} for a tenant's token."]
                if name == "rate_limit_per_second" and name in data and value is None:
                    # No limit at all is above any limit.
                    problems[name] = [f"At most {limit:g} for a tenant's token; not null."]
        current = self.context.get("endpoint")
        error = Endpoint.retry_cap_error(
            data.get("retry_max_in_flight", current.retry_max_in_flight if current else 1),
            data.get("max_in_flight", current.max_in_flight if current else None),
            fixed=data.get(
                "fixed_max_in_flight", current.fixed_max_in_flight if current else False
            ),
        )
        if error:
            problems["retry_max_in_flight"] = [error]
        if problems:
            raise serializers.ValidationError(problems)
        return data


class EndpointCreate(EndpointChange):
    url = serializers.URLField(max_length=2000)


class DisableIn(StrictSerializer):
    reason = serializers.CharField(max_length=DISABLE_REASON_CHARS)


class EnabledOut(serializers.Serializer):
    endpoint = EndpointOut()
    resumed = serializers.IntegerField(help_text="Held deliveries put back in the lane.")


class SecretOut(serializers.Serializer):
    id = serializers.IntegerField()
    secret = serializers.CharField(help_text="Masked, except when revealed or just rotated.")
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(allow_null=True)


class RotateIn(StrictSerializer):
    overlap_hours = serializers.IntegerField(
        min_value=MIN_OVERLAP_HOURS,
        max_value=MAX_OVERLAP_HOURS,
        default=24,
        help_text="How long the secrets active now keep signing beside the new one.",
    )


class HealthWindowOut(serializers.Serializer):
    attempts = serializers.IntegerField()
    delivered = serializers.IntegerField()
    success_rate = serializers.FloatField(allow_null=True)
    p50_ms = serializers.IntegerField(allow_null=True)
    p95_ms = serializers.IntegerField(allow_null=True)
    capped = serializers.BooleanField(help_text="True: only the latest attempts were read.")


class ConcurrencyOut(serializers.Serializer):
    in_flight = serializers.IntegerField(help_text="Requests open to it now.")
    max_in_flight = serializers.IntegerField(
        help_text="Its cap; with an adaptive limit, the limit's ceiling."
    )
    retry_budget = serializers.FloatField(
        help_text="Retries it may be sent now before one more is accepted (the whole part): "
        "each retry takes one, each accepted delivery earns a fifth, an accepted retry its "
        "own back, and one more comes each second."
    )
    retry_budget_cap = serializers.FloatField(help_text="The most the retry budget holds.")
    adaptive_limit = serializers.FloatField(
        allow_null=True,
        help_text="Requests it may have open at once now (the whole part), found from how "
        "it answers; null when its cap alone is the limit.",
    )
    latency_ms = serializers.FloatField(
        allow_null=True, help_text="Its answers' recent latency, which the limit follows."
    )
    baseline_ms = serializers.FloatField(
        allow_null=True, help_text="The latency it answers with when not queueing."
    )
    backed_off_at = serializers.DateTimeField(
        allow_null=True, help_text="When the limit last went down (an overload or slow answers)."
    )
    backed_off_from = serializers.FloatField(
        allow_null=True, help_text="The limit before it last went down."
    )
    backed_off_latency_ms = serializers.FloatField(
        allow_null=True,
        help_text="Why it last went down: the recent latency that was too slow against the "
        "baseline; null when an overload answer (429, 503, a timeout, a refused connection) was.",
    )


class MinuteOut(serializers.Serializer):
    attempts = serializers.IntegerField(help_text="Attempts started in the last minute.")
    answered_429 = serializers.IntegerField()
    answered_503 = serializers.IntegerField()
    no_answer = serializers.IntegerField(
        help_text="Attempts that got no answer: a timeout or a failed connection."
    )
    capped = serializers.BooleanField(help_text="True: only the latest attempts were read.")


class StatsOut(serializers.Serializer):
    hour = HealthWindowOut()
    day = HealthWindowOut()
    last_minute = MinuteOut(
        help_text="The answers that say it is past its capacity, which its adaptive limit "
        "backs off on."
    )
    concurrency = ConcurrencyOut(
        allow_null=True, help_text="Null when the schedule holds nothing for it now."
    )


class TestEventOut(serializers.Serializer):
    event_id = serializers.CharField()


def _secret_out(secret: EndpointSecret, *, plain: bool) -> dict:
    return {
        "id": secret.pk,
        "secret": secret.secret if plain else mask_secret(secret.secret),
        "created_at": secret.created_at.isoformat(),
        "expires_at": _iso(secret.expires_at),
    }


def _window_out(window: WindowHealth) -> dict:
    return {
        "attempts": window.attempts,
        "delivered": window.delivered,
        "success_rate": window.success_rate,
        "p50_ms": window.p50_ms,
        "p95_ms": window.p95_ms,
        "capped": window.capped,
    }


def _concurrency_out(endpoint_id: int) -> dict | None:
    """What the schedule holds of the endpoint now; None also when Redis cannot say (the
    rest of the page's figures come from the database and stand)."""
    try:
        state = get_scheduler().endpoint_state(endpoint_id)
    except redis.RedisError:
        return None
    if state is None:
        return None
    backed_off = state.backed_off_at
    return {
        "in_flight": state.in_flight,
        "max_in_flight": state.max_in_flight,
        "retry_budget": state.retry_budget,
        "retry_budget_cap": state.retry_budget_cap,
        "adaptive_limit": state.adaptive_limit,
        "latency_ms": state.latency_ms,
        "baseline_ms": state.baseline_ms,
        "backed_off_at": datetime.fromtimestamp(backed_off, UTC).isoformat()
        if backed_off
        else None,
        "backed_off_from": state.backed_off_from,
        "backed_off_latency_ms": state.backed_off_latency_ms,
    }


def _endpoint(request: Request, key: str, endpoint_id: int) -> Endpoint:
    tenant = tenant_for(request, key)
    return one(Endpoint.objects.filter(tenant=tenant), "endpoint", pk=endpoint_id)


def _as_audited(value: object) -> object:
    """A rate as the audit trail can store it: its detail is JSON, which has no decimals
    (and a Decimal there fails the save). The field takes the text back as it was."""
    return str(value) if isinstance(value, Decimal) else value


def _valid(serializer_class, request: Request, endpoint: Endpoint | None = None) -> dict:
    given = serializer_class(
        data=request.data,
        context={"operator": request.auth.is_operator, "endpoint": endpoint},
    )
    given.is_valid(raise_exception=True)
    return given.validated_data


class EndpointList(APIView):
    @extend_schema(
        operation_id="endpoints_list",
        parameters=paging.parameters(Endpoint, ["pk"]),
        responses={200: paging.page_of(EndpointOut, "Endpoint"), **errors(404, 422)},
    )
    def get(self, request: Request, key: str) -> Response:
        tenant = tenant_for(request, key)
        shown = paging.page(
            Endpoint.objects.filter(tenant=tenant), request, ["pk"], descending=False
        )
        return Response(shown.answer(endpoint_out))

    @extend_schema(
        operation_id="endpoints_create",
        request=EndpointCreate,
        parameters=[IDEMPOTENCY_KEY],
        responses={201: EndpointCreated, **errors(404, 409, 422)},
    )
    @idempotent
    def post(self, request: Request, key: str) -> Response:
        """Create an endpoint; a signing one answers with its secret, this once."""
        tenant = tenant_for(request, key)
        data = _valid(EndpointCreate, request)
        endpoint = Endpoint(tenant=tenant, **data)
        secret = endpoint_actions.create_endpoint(endpoint, request.auth, via=API)
        return Response({**endpoint_out(endpoint), "secret": secret}, status=201)


class EndpointDetail(APIView):
    @extend_schema(operation_id="endpoints_get", responses={200: EndpointOut, **errors(404)})
    def get(self, request: Request, key: str, endpoint_id: int) -> Response:
        return Response(endpoint_out(_endpoint(request, key, endpoint_id)))

    @extend_schema(
        operation_id="endpoints_update",
        request=EndpointChange,
        responses={200: EndpointOut, **errors(404, 422)},
    )
    def patch(self, request: Request, key: str, endpoint_id: int) -> Response:
        endpoint = _endpoint(request, key, endpoint_id)
        data = _valid(EndpointChange, request, endpoint)
        for name in CHANGEABLE:  # as compared and audited: old and new alike
            setattr(endpoint, name, _as_audited(getattr(endpoint, name)))
        before = {name: getattr(endpoint, name) for name in CHANGEABLE}
        for name, value in data.items():
            setattr(endpoint, name, _as_audited(value))
        endpoint_actions.change_endpoint(endpoint, before, request.auth, via=API, fields=CHANGEABLE)
        return Response(endpoint_out(endpoint))

    @extend_schema(
        operation_id="endpoints_delete",
        parameters=[
            OpenApiParameter(
                "discard_waiting",
                bool,
                description="Delete even though deliveries still wait for it (they are "
                "dropped). Without it such a delete is a 409.",
            )
        ],
        responses={204: None, **errors(404, 409)},
    )
    def delete(self, request: Request, key: str, endpoint_id: int) -> Response:
        """Delete the endpoint and its delivery history. Refused (409) while deliveries
        wait for it, unless discard_waiting=true: disable it instead to keep them."""
        endpoint = _endpoint(request, key, endpoint_id)
        discard_waiting = query_flag(request, "discard_waiting")
        waiting = Delivery.objects.filter(
            endpoint=endpoint,
            status__in=[*Delivery.OPEN_STATUSES, Delivery.Status.HELD],
        ).count()
        if waiting and not discard_waiting:
            raise Conflict(
                f"{waiting} deliveries still wait for this endpoint. Disable it to keep "
                "them, or delete with ?discard_waiting=true to drop them."
            )
        with transaction.atomic():
            audit.record(
                actor=request.auth,
                action=AuditEntry.Action.ENDPOINT_DELETED,
                via=API,
                tenant=endpoint.tenant,
                target=f"endpoint {endpoint.pk}",
                old={"url": endpoint.url},
                discarded_waiting=waiting,
            )
            endpoint.delete()
        return Response(status=204)


class EndpointDisable(APIView):
    @extend_schema(
        operation_id="endpoints_disable",
        request=DisableIn,
        responses={200: EndpointOut, **errors(404, 422)},
    )
    def post(self, request: Request, key: str, endpoint_id: int) -> Response:
        """Disable: its deliveries are held, not lost, until it is enabled."""
        endpoint = _endpoint(request, key, endpoint_id)
        given = DisableIn(data=request.data)
        given.is_valid(raise_exception=True)
        endpoint_actions.disable_endpoint(
            endpoint, given.validated_data["reason"], request.auth, via=API
        )
        endpoint.refresh_from_db()
        return Response(endpoint_out(endpoint))


class EndpointEnable(APIView):
    @extend_schema(
        operation_id="endpoints_enable", request=None, responses={200: EnabledOut, **errors(404)}
    )
    def post(self, request: Request, key: str, endpoint_id: int) -> Response:
        """Enable: held deliveries resume, in order."""
        endpoint = _endpoint(request, key, endpoint_id)
        resumed = endpoint_actions.enable_endpoint(endpoint, request.auth, via=API)
        return Response({"endpoint": endpoint_out(endpoint), "resumed": resumed})


class SecretList(APIView):
    @extend_schema(
        operation_id="endpoints_secrets_list",
        responses={200: SecretOut(many=True), **errors(404)},
    )
    def get(self, request: Request, key: str, endpoint_id: int) -> Response:
        """The active signing secrets, masked."""
        endpoint = _endpoint(request, key, endpoint_id)
        return Response(
            [_secret_out(s, plain=False) for s in endpoint_actions.active_secrets(endpoint)]
        )


class SecretReveal(APIView):
    @extend_schema(
        operation_id="endpoints_secrets_reveal",
        request=None,
        responses={200: SecretOut(many=True), **errors(404)},
    )
    def post(self, request: Request, key: str, endpoint_id: int) -> Response:
        """The active signing secrets in full (read-write tokens; audited)."""
        endpoint = _endpoint(request, key, endpoint_id)
        shown = endpoint_actions.reveal_secrets(endpoint, request.auth, via=API)
        return Response([_secret_out(s, plain=True) for s in shown])


class SecretRotate(APIView):
    @extend_schema(
        operation_id="endpoints_secrets_rotate",
        request=RotateIn,
        responses={201: SecretOut, **errors(404, 422)},
    )
    def post(self, request: Request, key: str, endpoint_id: int) -> Response:
        """A new secret signs from now on, shown this once; the old ones keep signing
        beside it for overlap_hours."""
        endpoint = _endpoint(request, key, endpoint_id)
        given = RotateIn(data=request.data)
        given.is_valid(raise_exception=True)
        overlap = timedelta(hours=given.validated_data["overlap_hours"])
        new = endpoint_actions.rotate_secret(endpoint, overlap, request.auth, via=API)
        return Response(_secret_out(new, plain=True), status=201)


class EndpointStats(APIView):
    @extend_schema(operation_id="endpoints_stats", responses={200: StatsOut, **errors(404)})
    def get(self, request: Request, key: str, endpoint_id: int) -> Response:
        """Success rate and attempt latency over the last hour and day."""
        endpoint = _endpoint(request, key, endpoint_id)
        health = endpoint_health(endpoint.pk)
        return Response(
            {
                "hour": _window_out(health.hour),
                "day": _window_out(health.day),
                "last_minute": asdict(health.minute),
                "concurrency": _concurrency_out(endpoint.pk),
            }
        )


class TestEvent(APIView):
    @extend_schema(
        operation_id="endpoints_test",
        request=None,
        responses={202: TestEventOut, **errors(404)},
    )
    def post(self, request: Request, key: str, endpoint_id: int) -> Response:
        """Send one small webhook.test event to this endpoint alone."""
        endpoint = _endpoint(request, key, endpoint_id)
        try:
            accepted = endpoint_actions.send_test_event(endpoint, request.auth, via=API)
        except endpoint_actions.TooManyTestEvents as exc:
            raise Throttled(wait=60, detail=exc.message) from exc
        return Response({"event_id": accepted.event.id}, status=202)
