"""/api/v1/event-types: the event type catalogue, platform-wide (webhooks.models.EventType).

Any management token lists and reads it, since publishers of every tenant send these
types; only operator tokens change it. A type may carry a JSON Schema (checked when
saved, with its example: webhooks.event_schemas) that publishing enforces when
enforce_schema is on (ingest.publish). Types are archived, never deleted, so that the
catalogue still says what old events meant.

Names may hold a slash (Shopify-style "orders/create"), so the name is the rest of the
path: a client sends it percent-encoded, which arrives here decoded.
"""

import json

from django.db import IntegrityError, transaction
from django.urls import re_path
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api import paging
from api.auth import require_operator
from api.idempotency import PARAMETER as IDEMPOTENCY_KEY
from api.idempotency import idempotent
from api.problems import Conflict
from api.schema import errors
from api.strict import StrictSerializer, query_flag
from tenants import audit
from tenants.models import AuditEntry
from webhooks.models import EventType, validate_event_type_name

MAX_NAME_CHARS = EventType._meta.get_field("name").max_length
MAX_DESCRIPTION_CHARS = 10_000
CHANGEABLE = ("description", "schema", "example", "enforce_schema", "archived")
NOT_FOUND = "No event type has this name."
INCLUDE_ARCHIVED = OpenApiParameter(
    "include_archived", bool, description="List archived types too (default false)."
)


class EventTypeOut(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField()
    schema = serializers.JSONField(
        allow_null=True, help_text="The JSON Schema of the payloads; null: none."
    )
    example = serializers.JSONField(allow_null=True, help_text="An example payload; null: none.")
    enforce_schema = serializers.BooleanField(
        help_text="Publishing refuses (422) a payload that does not match the schema."
    )
    archived = serializers.BooleanField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class EventTypeChange(StrictSerializer):
    description = serializers.CharField(
        max_length=MAX_DESCRIPTION_CHARS, required=False, allow_blank=True
    )
    schema = serializers.JSONField(
        required=False,
        allow_null=True,
        help_text="A JSON Schema (Draft 2020-12 unless its $schema names another draft); "
        "its $refs must resolve within it. null: no schema.",
    )
    example = serializers.JSONField(
        required=False, allow_null=True, help_text="It must match the schema, if there is one."
    )
    enforce_schema = serializers.BooleanField(
        required=False, help_text="Needs a schema. Default false."
    )
    archived = serializers.BooleanField(required=False)


class EventTypeCreate(EventTypeChange):
    name = serializers.CharField(
        max_length=MAX_NAME_CHARS,
        validators=[validate_event_type_name],
        help_text="What publishers send as event_type: printable, no commas.",
    )


def _out(event_type: EventType) -> dict:
    return {
        "name": event_type.name,
        "description": event_type.description,
        "schema": event_type.schema,
        "example": event_type.example,
        "enforce_schema": event_type.enforce_schema,
        "archived": event_type.archived,
        "created_at": event_type.created_at.isoformat(),
        "updated_at": event_type.updated_at.isoformat(),
    }


def _same(old: object, new: object) -> bool:
    """Equal as JSON: in Python 1 == 1.0 == True, which are three different examples."""
    return json.dumps(old, sort_keys=True) == json.dumps(new, sort_keys=True)


def _named(name: str, *, for_update: bool = False) -> EventType:
    rows = EventType.objects.select_for_update() if for_update else EventType.objects
    found = rows.filter(name=name).first() if name.isprintable() else None
    if found is None:
        raise NotFound(NOT_FOUND)
    return found


class EventTypeList(APIView):
    @extend_schema(
        operation_id="event_types_list",
        parameters=[*paging.parameters(EventType, ["name"]), INCLUDE_ARCHIVED],
        responses={200: paging.page_of(EventTypeOut, "EventType"), **errors(422)},
    )
    def get(self, request: Request) -> Response:
        """The catalogue by name; archived types only with include_archived=true."""
        types = EventType.objects.all()
        if not query_flag(request, "include_archived"):
            types = types.filter(archived=False)
        shown = paging.page(types, request, ["name"], descending=False)
        return Response(shown.answer(_out))

    @extend_schema(
        operation_id="event_types_create",
        request=EventTypeCreate,
        parameters=[IDEMPOTENCY_KEY],
        responses={201: EventTypeOut, **errors(409, 422)},
    )
    @idempotent
    def post(self, request: Request) -> Response:
        """Add a type to the catalogue (operator tokens only). 409 if the name is taken;
        422 naming `schema` for a schema that is not usable, `example` for an example
        that does not match it."""
        require_operator(request)
        given = EventTypeCreate(data=request.data)
        given.is_valid(raise_exception=True)
        event_type = EventType(**given.validated_data)
        event_type.full_clean(validate_unique=False)  # the schema and example: 422
        try:
            with transaction.atomic():
                event_type.save()
                _audit(request, AuditEntry.Action.EVENT_TYPE_CREATED, event_type)
        except IntegrityError as exc:
            raise Conflict("An event type with this name exists already.") from exc
        return Response(_out(event_type), status=201)


def _audit(request: Request, action: str, event_type: EventType, **detail: object) -> None:
    audit.record(
        actor=request.auth,
        action=action,
        via=AuditEntry.Via.API,
        tenant=None,  # the catalogue is the platform's
        target=f"event type {event_type.name}",
        **detail,
    )


class EventTypeDetail(APIView):
    @extend_schema(operation_id="event_types_get", responses={200: EventTypeOut, **errors(404)})
    def get(self, request: Request, name: str) -> Response:
        """One type, archived or not."""
        return Response(_out(_named(name)))

    @extend_schema(
        operation_id="event_types_update",
        request=EventTypeChange,
        responses={200: EventTypeOut, **errors(404, 422)},
    )
    def patch(self, request: Request, name: str) -> Response:
        """Change the description, schema, example, enforce_schema or archived (operator
        tokens only). The type's name does not change: publishers send it."""
        _named(name)
        require_operator(request)
        given = EventTypeChange(data=request.data)
        given.is_valid(raise_exception=True)
        with transaction.atomic():
            event_type = _named(name, for_update=True)  # the checks see what is saved
            changed = [
                field
                for field, value in given.validated_data.items()
                if not _same(getattr(event_type, field), value)
            ]
            for field in changed:
                setattr(event_type, field, given.validated_data[field])
            if changed:
                event_type.full_clean(validate_unique=False)
                event_type.save(update_fields=[*changed, "updated_at"])
                # Names of what changed, not the values: a schema can be long.
                _audit(request, AuditEntry.Action.EVENT_TYPE_CHANGED, event_type, fields=changed)
        return Response(_out(event_type))

    @extend_schema(
        operation_id="event_types_delete",
        request=None,
        responses={204: None, **errors(404)},
    )
    def delete(self, request: Request, name: str) -> Response:
        """Archive the type (operator tokens only): it is never deleted, so that the
        catalogue still says what old events meant. 204, also when it was archived
        already; PATCH archived=false brings it back. With EVENT_TYPES_REQUIRE_CATALOGUE,
        an archived type can no longer be published."""
        _named(name)
        require_operator(request)
        with transaction.atomic():
            event_type = _named(name, for_update=True)
            if not event_type.archived:
                event_type.archived = True
                event_type.save(update_fields=["archived", "updated_at"])
                _audit(request, AuditEntry.Action.EVENT_TYPE_ARCHIVED, event_type)
        return Response(status=204)


urlpatterns = [
    re_path(r"^api/v1/event-types$", EventTypeList.as_view(), name="api-event-types"),
    re_path(r"^api/v1/event-types/(?P<name>.+)$", EventTypeDetail.as_view(), name="api-event-type"),
]
