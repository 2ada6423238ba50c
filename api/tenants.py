"""/api/v1/tenants: create (operators), list, read and change tenants, with the status
every dashboard shows (dashboards.status, the one status model)."""

from decimal import Decimal

from django.db import IntegrityError, transaction
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api import paging
from api.auth import require_operator
from api.idempotency import PARAMETER as IDEMPOTENCY_KEY
from api.idempotency import idempotent
from api.problems import Conflict
from api.schema import errors
from api.scope import tenant_for, tenants_visible
from api.strict import RoundedDecimalField, StrictSerializer
from dashboards import status
from tenants import audit, operations
from tenants.models import WEIGHT_CHOICES, AuditEntry, Tenant

API = AuditEntry.Via.API
WEIGHTS = [weight for weight, _ in WEIGHT_CHOICES]


class StatusOut(serializers.Serializer):
    code = serializers.CharField(
        help_text="paused, disabled, endpoint_wait, failing, at_cap, "
        "rate_limited, paced or on_pace (docs/DASHBOARDS.md)."
    )
    label = serializers.CharField()
    headline = serializers.CharField()
    reasons = serializers.ListField(child=serializers.CharField())
    backlog_age_seconds = serializers.FloatField()
    queued = serializers.IntegerField()
    in_flight = serializers.IntegerField()
    retries_due_later = serializers.IntegerField()
    held = serializers.IntegerField()
    dead = serializers.IntegerField()
    live = serializers.BooleanField(help_text="False: Redis did not answer; counts may be 0.")


class TenantOut(serializers.Serializer):
    key = serializers.CharField()
    name = serializers.CharField()
    weight = serializers.IntegerField()
    rate_limit_per_second = serializers.FloatField(allow_null=True)
    paused = serializers.BooleanField()
    auto_registered = serializers.BooleanField()
    created_at = serializers.DateTimeField()
    status = StatusOut()


class TenantChange(StrictSerializer):
    name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    weight = serializers.ChoiceField(choices=WEIGHTS, required=False)
    rate_limit_per_second = RoundedDecimalField(
        max_digits=9,
        decimal_places=3,
        min_value=Decimal(0),
        max_value=Decimal(10_000),
        allow_null=True,
        required=False,
        help_text="Deliveries per second for this tenant; null: the platform default; 0: none.",
    )
    paused = serializers.BooleanField(required=False)


class TenantCreate(TenantChange):
    key = serializers.CharField(
        max_length=255,
        help_text="The fairness-key value that names this tenant in traffic (no slash).",
    )

    def validate_key(self, value: str) -> str:
        value = value.strip()
        if not value or "/" in value or not value.isprintable():
            raise serializers.ValidationError("Printable text without a slash.")
        return value


def _status_of(tenants: list[Tenant]) -> dict[int, dict]:
    snapshot = status.take_snapshot()
    found = status.read(tenants, snapshot)
    out = {}
    for tenant in tenants:
        one = found[tenant.pk]
        facts, assessed = one.facts, one.assessed
        out[tenant.pk] = {
            "code": one.code,
            "label": assessed.label,
            "headline": assessed.headline,
            "reasons": [str(reason) for reason in assessed.reasons],
            "backlog_age_seconds": round(facts.oldest_age_seconds, 1),
            "queued": facts.queued,
            "in_flight": facts.in_flight,
            "retries_due_later": facts.delayed,
            "held": facts.held,
            "dead": facts.dead,
            "live": snapshot is not None,
        }
    return out


def _out(tenant: Tenant, state: dict) -> dict:
    rate = tenant.rate_limit_per_second
    return {
        "key": tenant.key,
        "name": tenant.name,
        "weight": tenant.weight,
        "rate_limit_per_second": float(rate) if rate is not None else None,
        "paused": not tenant.is_active,
        "auto_registered": tenant.auto_registered,
        "created_at": tenant.created_at.isoformat(),
        "status": state,
    }


def _apply(tenant: Tenant, changes: dict, actor) -> None:
    """Save what changed, with the audit entries the admin writes for the same acts."""
    if "paused" in changes and changes["paused"] == tenant.is_active:
        operations.set_active(tenant, not changes["paused"], actor=actor, via=API)
    old = {name: getattr(tenant, name) for name in ("name", "weight", "rate_limit_per_second")}
    new = {name: changes[name] for name in old if name in changes and changes[name] != old[name]}
    if not new:
        return
    with transaction.atomic():
        for name, value in new.items():
            setattr(tenant, name, value)
        tenant.save(update_fields=list(new))  # save(), so the scheduler hears of it
        audit.record(
            actor=actor,
            action=AuditEntry.Action.TENANT_WEIGHT_CHANGED
            if set(new) == {"weight"}
            else AuditEntry.Action.TENANT_CHANGED,
            via=API,
            tenant=tenant,
            target=f"tenant {tenant.key}",
            old={name: str(old[name]) if old[name] is not None else None for name in new},
            new={name: str(value) if value is not None else None for name, value in new.items()},
        )


class TenantList(APIView):
    @extend_schema(
        operation_id="tenants_list",
        parameters=paging.parameters(Tenant, ["key"]),
        responses={200: paging.page_of(TenantOut, "Tenant"), **errors(422)},
    )
    def get(self, request: Request) -> Response:
        """Tenants by key; a tenant's token sees its own alone."""
        shown = paging.page(tenants_visible(request), request, ["key"], descending=False)
        states = _status_of(shown.rows)
        return Response(shown.answer(lambda tenant: _out(tenant, states[tenant.pk])))

    @extend_schema(
        operation_id="tenants_create",
        request=TenantCreate,
        parameters=[IDEMPOTENCY_KEY],
        responses={201: TenantOut, **errors(409, 422)},
    )
    @idempotent
    def post(self, request: Request) -> Response:
        """Create a tenant (operator tokens only). 409 if the key is taken."""
        require_operator(request)
        given = TenantCreate(data=request.data)
        given.is_valid(raise_exception=True)
        data = given.validated_data
        try:
            with transaction.atomic():
                tenant = Tenant.objects.create(
                    key=data["key"],
                    name=data.get("name", ""),
                    weight=data.get("weight", 1),
                    rate_limit_per_second=data.get("rate_limit_per_second"),
                    is_active=not data.get("paused", False),
                )
                audit.record(
                    actor=request.auth,
                    action=AuditEntry.Action.TENANT_CREATED,
                    via=API,
                    tenant=tenant,
                    target=f"tenant {tenant.key}",
                )
        except IntegrityError as exc:
            raise Conflict("A tenant with this key exists already.") from exc
        return Response(_out(tenant, _status_of([tenant])[tenant.pk]), status=201)


class TenantDetail(APIView):
    @extend_schema(operation_id="tenants_get", responses={200: TenantOut, **errors(404)})
    def get(self, request: Request, key: str) -> Response:
        tenant = tenant_for(request, key)
        return Response(_out(tenant, _status_of([tenant])[tenant.pk]))

    @extend_schema(
        operation_id="tenants_update",
        request=TenantChange,
        responses={200: TenantOut, **errors(404, 422)},
    )
    def patch(self, request: Request, key: str) -> Response:
        """Change the name, weight, rate or pause (operator tokens only)."""
        tenant = tenant_for(request, key)
        require_operator(request)
        given = TenantChange(data=request.data)
        given.is_valid(raise_exception=True)
        _apply(tenant, given.validated_data, request.auth)
        tenant.refresh_from_db()
        return Response(_out(tenant, _status_of([tenant])[tenant.pk]))
