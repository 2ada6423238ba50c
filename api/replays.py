"""/api/v1/tenants/{key}/replays: send a window of a tenant's finished deliveries again,
paced through the tenant's lane exactly as the portal's replays are
(delivery.replays.window): the maintenance sweep feeds a running job one chunk at a time,
so the tenant's fresh events never wait behind the whole window. Starting and cancelling
are audited; every lookup starts from the tenant, so another tenant's job is a 404.
"""

from datetime import UTC, datetime

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api import paging
from api.idempotency import PARAMETER as IDEMPOTENCY_KEY
from api.idempotency import idempotent
from api.problems import Conflict
from api.routes import KEY, tenant_route
from api.schema import errors
from api.scope import one, tenant_for
from api.strict import StrictSerializer
from delivery.models import Delivery, ReplayJob
from delivery.replays import window as replay_window
from delivery.replays.forms import WindowForm
from delivery.replays.window import STATUSES, Window
from tenants.models import AuditEntry, Endpoint, Tenant

API = AuditEntry.Via.API
REPLAY = rf"{KEY}/replays/(?P<replay_id>[0-9]{{1,18}})"
EVENT_TYPE_CHARS = WindowForm.base_fields["event_type"].max_length
# Delivery ids carry their time since the Unix epoch (core.ids): nothing is older.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class ReplayWindowIn(StrictSerializer):
    since = serializers.DateTimeField(help_text="Deliveries made at or after this time.")
    until = serializers.DateTimeField(
        help_text="Deliveries made before this time; a time to come means now."
    )
    statuses = serializers.ListField(
        child=serializers.ChoiceField(choices=list(STATUSES)),
        min_length=1,
        default=[str(Delivery.Status.DEAD)],
        help_text="What to send again: dead (default) and/or delivered. Pending, retrying "
        "and held deliveries are still on their way and are never replayed.",
    )
    endpoint_id = serializers.IntegerField(
        min_value=1,
        required=False,
        allow_null=True,
        help_text="One of the tenant's endpoints; empty: all of them.",
    )
    event_type = serializers.CharField(
        max_length=EVENT_TYPE_CHARS,
        required=False,
        allow_blank=True,
        default="",
        help_text="Only events of this type; empty: every type.",
    )

    def validate(self, data: dict) -> dict:
        problems = {}
        if data["since"] < EPOCH:
            problems["since"] = ["No delivery is older than 1970-01-01T00:00:00Z."]
        elif data["since"] >= timezone.now():
            # The window ends when the replay starts: one starting later holds nothing.
            problems["since"] = ["In the future: no delivery was made then yet."]
        if data["until"] <= data["since"]:
            problems["until"] = ["Must be after since."]
        tenant: Tenant = self.context["tenant"]
        endpoint = data.get("endpoint_id")
        # Checked against the database rather than the portal form's list of choices,
        # which stops at a few hundred endpoints.
        if (
            endpoint is not None
            and not Endpoint.objects.filter(pk=endpoint, tenant=tenant).exists()
        ):
            problems["endpoint_id"] = ["This tenant has no endpoint with this id."]
        if problems:
            raise serializers.ValidationError(problems)
        return data


class PreviewOut(serializers.Serializer):
    count = serializers.IntegerField(help_text="Deliveries the window would send again.")
    capped = serializers.BooleanField(
        help_text="The count stopped at REPLAY_COUNT_LIMIT: more than count match."
    )


class ReplayWindowOut(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField(help_text="At most the moment the replay started.")
    statuses = serializers.ListField(child=serializers.CharField())
    endpoint_id = serializers.IntegerField(allow_null=True)
    event_type = serializers.CharField()


class ReplayOut(serializers.Serializer):
    id = serializers.IntegerField()
    state = serializers.ChoiceField(choices=ReplayJob.State.choices)
    window = ReplayWindowOut()
    matched = serializers.IntegerField(help_text="Deliveries counted when it started.")
    matched_capped = serializers.BooleanField(help_text="More than matched: the count stopped.")
    fed = serializers.IntegerField(help_text="Sent again so far.")
    progress = serializers.FloatField(help_text="fed / matched, from 0 to 1.")
    created_at = serializers.DateTimeField()
    created_by = serializers.CharField(help_text="The user's name or the API token's.")
    finished_at = serializers.DateTimeField(allow_null=True)
    cancelled_by = serializers.CharField(allow_null=True)


def _window(request: Request, tenant: Tenant) -> Window:
    given = ReplayWindowIn(data=request.data, context={"tenant": tenant})
    given.is_valid(raise_exception=True)
    data = given.validated_data
    return Window(
        start=data["since"],
        end=data["until"],
        statuses=tuple(dict.fromkeys(data["statuses"])),
        endpoint_id=data.get("endpoint_id"),
        event_type=data["event_type"].strip(),
    )


def _progress(job: ReplayJob) -> float:
    # As the portal shows it: a window that matched nothing has nothing left to send.
    if job.state == ReplayJob.State.FINISHED or not job.matched:
        return 1.0
    return round(min(1.0, job.fed / job.matched), 4)


def replay_out(job: ReplayJob) -> dict:
    window = Window.from_json(job.filters)
    return {
        "id": job.pk,
        "state": job.state,
        "window": {
            "since": window.start.isoformat(),
            "until": window.end.isoformat(),
            "statuses": list(window.statuses),
            "endpoint_id": window.endpoint_id,
            "event_type": window.event_type,
        },
        "matched": job.matched,
        "matched_capped": job.matched_capped,
        "fed": job.fed,
        "progress": _progress(job),
        "created_at": job.created_at.isoformat(),
        "created_by": job.created_by_name,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
        "cancelled_by": job.cancelled_by_name or None,
    }


def _job(request: Request, key: str, replay_id: str) -> ReplayJob:
    tenant = tenant_for(request, key)
    return one(ReplayJob.objects.filter(tenant=tenant), "replay", pk=int(replay_id))


class ReplayPreview(APIView):
    @extend_schema(
        operation_id="replays_preview",
        request=ReplayWindowIn,
        responses={200: PreviewOut, **errors(404, 422)},
    )
    def post(self, request: Request, key: str) -> Response:
        """How many deliveries a window would send again; nothing is started."""
        tenant = tenant_for(request, key)
        count, capped = replay_window.count_bounded(tenant, _window(request, tenant))
        return Response({"count": count, "capped": capped})


class ReplayList(APIView):
    @extend_schema(
        operation_id="replays_list",
        parameters=paging.parameters(ReplayJob, ["pk"]),
        responses={200: paging.page_of(ReplayOut, "Replay"), **errors(404, 422)},
    )
    def get(self, request: Request, key: str) -> Response:
        """The tenant's replays, newest first."""
        tenant = tenant_for(request, key)
        shown = paging.page(ReplayJob.objects.filter(tenant=tenant), request, ["pk"])
        return Response(shown.answer(replay_out))

    @extend_schema(
        operation_id="replays_create",
        request=ReplayWindowIn,
        parameters=[IDEMPOTENCY_KEY],
        responses={201: ReplayOut, **errors(404, 409, 422)},
    )
    @idempotent
    def post(self, request: Request, key: str) -> Response:
        """Start a replay: the maintenance sweep feeds it into the tenant's lane a chunk
        (REPLAY_CHUNK_SIZE) at a time, the next once the last has left the lane."""
        tenant = tenant_for(request, key)
        job = replay_window.start(tenant, _window(request, tenant), user=request.auth, via=API)
        return Response(replay_out(job), status=201)


class ReplayDetail(APIView):
    @extend_schema(operation_id="replays_get", responses={200: ReplayOut, **errors(404)})
    def get(self, request: Request, key: str, replay_id: str) -> Response:
        return Response(replay_out(_job(request, key, replay_id)))


class ReplayCancel(APIView):
    @extend_schema(
        operation_id="replays_cancel",
        request=None,
        responses={200: ReplayOut, **errors(404, 409)},
    )
    def post(self, request: Request, key: str, replay_id: str) -> Response:
        """Stop feeding; the chunk already in the lane still goes out. 409 once the
        replay has finished or was cancelled."""
        job = _job(request, key, replay_id)
        if not replay_window.cancel(job, user=request.auth, via=API):
            raise Conflict(f"This replay is {job.state} already; only a running one cancels.")
        return Response(replay_out(job))


urlpatterns = [
    tenant_route(rf"{KEY}/replays", ReplayList, "api-replays"),
    tenant_route(rf"{KEY}/replays/preview", ReplayPreview, "api-replays-preview"),
    tenant_route(REPLAY, ReplayDetail, "api-replay"),
    tenant_route(rf"{REPLAY}/cancel", ReplayCancel, "api-replay-cancel"),
]
