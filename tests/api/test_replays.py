"""Window replays through the API: previewed, started, fed through the tenant's lane a
chunk at a time by the sweep (as the portal's are), cancelled once, audited; another
tenant's replays and endpoints are out of reach."""

from datetime import timedelta

import pytest
from django.utils import timezone

from delivery.models import Delivery, ReplayJob
from delivery.replays.window import feed_replays
from delivery.scheduler import get_scheduler
from tenants.models import AuditEntry
from tests.api.helpers import Api, operator_token, tenant_token
from tests.delivery.test_replay_window import drain, finished_deliveries
from tests.factories import make_endpoint, make_tenant
from webhooks.models import ApiToken

pytestmark = pytest.mark.django_db(transaction=True)
CHUNK = 2


@pytest.fixture(autouse=True)
def small_chunks(settings) -> None:
    settings.REPLAY_CHUNK_SIZE = CHUNK
    get_scheduler().start_epoch()


def window(**extra) -> dict:
    now = timezone.now()
    return {
        "since": (now - timedelta(hours=1)).isoformat(),
        "until": (now + timedelta(minutes=1)).isoformat(),
        **extra,
    }


class Shops:
    def __init__(self) -> None:
        self.mine = make_tenant("mine.example")
        self.endpoint = make_endpoint(self.mine, "http://127.0.0.1:9/mine", max_in_flight=100)
        self.second = make_endpoint(self.mine, "http://127.0.0.1:9/second")
        self.other = make_tenant("other.example")
        self.other_endpoint = make_endpoint(self.other, "http://127.0.0.1:9/other")
        finished_deliveries(self.mine, self.endpoint, 5)
        finished_deliveries(self.mine, self.endpoint, 3, Delivery.Status.DELIVERED)
        finished_deliveries(self.mine, self.second, 2, kind="refund")
        finished_deliveries(self.other, self.other_endpoint, 4)
        self.api = Api(tenant_token(self.mine))
        self.base = "/api/v1/tenants/mine.example/replays"


@pytest.fixture
def shops() -> Shops:
    return Shops()


def test_a_preview_counts_the_window_and_starts_nothing(shops) -> None:
    dead = shops.api.post(f"{shops.base}/preview", window())
    assert dead.status_code == 200, dead.json()
    assert dead.json() == {"count": 7, "capped": False}  # dead only, by default
    both = shops.api.post(f"{shops.base}/preview", window(statuses=["dead", "delivered"]))
    assert both.json()["count"] == 10
    narrow = shops.api.post(
        f"{shops.base}/preview", window(endpoint_id=shops.second.pk, event_type="refund")
    )
    assert narrow.json()["count"] == 2
    earlier = timezone.now() - timedelta(hours=3)
    empty = shops.api.post(
        f"{shops.base}/preview",
        {"since": earlier.isoformat(), "until": (earlier + timedelta(hours=1)).isoformat()},
    )
    assert empty.json() == {"count": 0, "capped": False}
    assert not ReplayJob.objects.exists()


def test_the_count_stops_at_its_limit(shops, settings) -> None:
    settings.REPLAY_COUNT_LIMIT = 3
    answer = shops.api.post(f"{shops.base}/preview", window())
    assert answer.json() == {"count": 3, "capped": True}


def test_a_replay_is_fed_a_chunk_at_a_time_and_progress_rises(shops) -> None:
    made = shops.api.post(shops.base, window(endpoint_id=shops.endpoint.pk))
    assert made.status_code == 201, made.json()
    job = made.json()
    assert (job["state"], job["matched"], job["fed"], job["progress"]) == ("running", 5, 0, 0.0)
    assert job["window"]["statuses"] == ["dead"]
    assert job["window"]["endpoint_id"] == shops.endpoint.pk
    assert job["created_by"].startswith("API token mine.example token (whp_")
    assert job["finished_at"] is None and job["cancelled_by"] is None
    detail = f"{shops.base}/{job['id']}"
    started = AuditEntry.objects.get(action=AuditEntry.Action.REPLAY_STARTED)
    assert (started.via, started.tenant, started.detail["matched"]) == ("api", shops.mine, 5)

    feed_replays()
    first = shops.api.get(detail).json()
    assert (first["fed"], first["progress"]) == (CHUNK, 0.4)
    feed_replays()  # the first chunk is still in the lane: nothing more is fed
    assert shops.api.get(detail).json()["fed"] == CHUNK

    assert len(drain()) == CHUNK
    feed_replays()
    assert shops.api.get(detail).json()["progress"] == 0.8
    for _ in range(3):
        drain()
        feed_replays()
    done = shops.api.get(detail).json()
    assert (done["state"], done["fed"], done["progress"]) == ("finished", 5, 1.0)
    assert done["finished_at"] is not None
    # Only the window was sent again: the other endpoint's and tenant's stay dead.
    assert Delivery.objects.filter(tenant=shops.mine, endpoint=shops.second, status="dead").count()
    assert Delivery.objects.filter(tenant=shops.other, status="dead").count() == 4


def test_cancel_stops_feeding_and_a_second_cancel_is_a_conflict(shops) -> None:
    job = shops.api.post(shops.base, window()).json()
    feed_replays()
    cancelled = shops.api.post(f"{shops.base}/{job['id']}/cancel")
    assert cancelled.status_code == 200, cancelled.json()
    body = cancelled.json()
    assert body["state"] == "cancelled" and body["fed"] == CHUNK
    assert body["cancelled_by"].startswith("API token mine.example token")
    drain()
    feed_replays()
    assert ReplayJob.objects.get().fed == CHUNK
    assert Delivery.objects.filter(tenant=shops.mine, status="dead").count() == 7 - CHUNK
    again = shops.api.post(f"{shops.base}/{job['id']}/cancel")
    assert again.status_code == 409
    assert again["Content-Type"] == "application/problem+json"
    entries = AuditEntry.objects.filter(action=AuditEntry.Action.REPLAY_CANCELLED)
    assert [(entry.via, entry.detail["fed"]) for entry in entries] == [("api", CHUNK)]


def test_the_list_is_newest_first_and_pages(shops) -> None:
    ids = [shops.api.post(shops.base, window()).json()["id"] for _ in range(3)]
    first = shops.api.get(f"{shops.base}?limit=2").json()
    assert [job["id"] for job in first["data"]] == ids[::-1][:2]
    rest = shops.api.get(f"{shops.base}?limit=2&cursor={first['next_cursor']}").json()
    assert [job["id"] for job in rest["data"]] == [ids[0]]
    assert rest["next_cursor"] is None


def test_another_tenants_replays_are_not_found(shops) -> None:
    theirs = Api(tenant_token(shops.other)).post("/api/v1/tenants/other.example/replays", window())
    assert theirs.status_code == 201
    other_id = theirs.json()["id"]
    assert shops.api.get(f"{shops.base}/{other_id}").status_code == 404
    assert shops.api.post(f"{shops.base}/{other_id}/cancel").status_code == 404
    assert ReplayJob.objects.get(pk=other_id).state == "running"
    assert shops.api.get(f"{shops.base}/999999999999999999").status_code == 404
    listed = shops.api.get(shops.base).json()["data"]
    assert listed == []
    # Nor may a tenant's token reach the other tenant's list at all.
    assert shops.api.get("/api/v1/tenants/other.example/replays").status_code == 404
    assert shops.api.post("/api/v1/tenants/other.example/replays", window()).status_code == 404


def test_an_operator_token_reaches_every_tenant(shops) -> None:
    operator = Api(operator_token())
    made = operator.post("/api/v1/tenants/other.example/replays", window())
    assert made.status_code == 201 and made.json()["matched"] == 4


def test_a_read_only_token_reads_but_cannot_start_or_cancel(shops) -> None:
    job = shops.api.post(shops.base, window()).json()
    reader = Api(tenant_token(shops.mine, access=ApiToken.Access.READ))
    assert reader.get(shops.base).status_code == 200
    assert reader.get(f"{shops.base}/{job['id']}").status_code == 200
    assert reader.post(shops.base, window()).status_code == 403
    assert reader.post(f"{shops.base}/{job['id']}/cancel").status_code == 403
    assert ReplayJob.objects.count() == 1
    assert ReplayJob.objects.get().state == "running"


def test_a_foreign_endpoint_is_unprocessable_and_names_the_field(shops) -> None:
    answer = shops.api.post(shops.base, window(endpoint_id=shops.other_endpoint.pk))
    assert answer.status_code == 422
    assert [error["field"] for error in answer.json()["errors"]] == ["endpoint_id"]
    preview = shops.api.post(f"{shops.base}/preview", window(endpoint_id=shops.other_endpoint.pk))
    assert preview.status_code == 422
    assert not ReplayJob.objects.exists()


@pytest.mark.parametrize(
    "change, field",
    [
        ({"until": "2001-01-01T00:00:00Z"}, "until"),
        ({"since": "not a date"}, "since"),
        ({"since": "0001-01-01T00:00:00Z"}, "since"),
        ({"since": "9999-12-31T23:59:58Z", "until": "9999-12-31T23:59:59Z"}, "since"),
        ({"statuses": []}, "statuses"),
        ({"statuses": ["held"]}, "statuses"),
        ({"event_type": "x" * 201}, "event_type"),
        ({"endpoint_id": "abc"}, "endpoint_id"),
        ({"wiendow": 1}, "wiendow"),
    ],
)
def test_bad_windows_are_unprocessable(shops, change, field) -> None:
    answer = shops.api.post(shops.base, {**window(), **change})
    assert answer.status_code == 422, answer.content
    named = {error["field"].split("[")[0].split(".")[0] for error in answer.json()["errors"]}
    assert field in named
    assert not ReplayJob.objects.exists()


def test_an_idempotency_key_starts_one_replay(shops) -> None:
    body = window()
    first = shops.api.post(shops.base, body, **{"Idempotency-Key": "replay-1"})
    again = shops.api.post(shops.base, body, **{"Idempotency-Key": "replay-1"})
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert ReplayJob.objects.count() == 1
