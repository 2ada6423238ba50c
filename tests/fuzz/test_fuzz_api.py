"""The management API's doors under random input: publish bodies of any JSON (and not
JSON), and the message log's filters and cursors as any text. Every answer is below 500;
a refusal is problem details naming what was wrong; an accepted publish stored what it
says it did."""

import json

import pytest
from django.test import Client
from hypothesis import event as note_case
from hypothesis import given
from hypothesis import strategies as st

from tests.api.helpers import operator_token
from tests.factories import make_endpoint, make_tenant
from tests.fuzz.strategies import FUZZ, json_bodies, json_values
from webhooks.models import Event

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(settings) -> dict:
    settings.API_RATE_LIMIT_PER_MINUTE = 0  # thousands of requests a minute, by design
    tenant = make_tenant("shop-1")
    make_endpoint(tenant, "http://127.0.0.1:9/hook")
    return {"token": operator_token(), "tenant": tenant}


events = st.fixed_dictionaries(
    {},
    optional={
        "tenant": st.sampled_from(["shop-1", "", " shop-1 ", "nobody"]) | json_values,
        "event_type": st.text(max_size=300) | json_values,
        "payload": json_values,
        "idempotency_key": st.text(max_size=300) | json_values,
        "extra": json_values,
    },
)
# Nearly right: the required fields present, their values odd but often acceptable.
likely_events = st.fixed_dictionaries(
    {
        "tenant": st.sampled_from(["shop-1", " shop-1 ", "nobody"]),
        "event_type": st.text(
            st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=60
        ),
        "payload": json_values,
    },
    optional={"idempotency_key": st.text(max_size=80) | st.integers()},
)
publish_bodies = st.one_of(
    json_bodies,
    likely_events.map(lambda one: json.dumps(one).encode()),
    st.lists(likely_events, min_size=1, max_size=4).map(
        lambda many: json.dumps({"events": many}).encode()
    ),
    events.map(lambda one: json.dumps(one).encode()),
    st.lists(events, max_size=4).map(lambda many: json.dumps({"events": many}).encode()),
)


@FUZZ
@given(body=publish_bodies)
def test_any_publish_body_is_answered_below_500(api, body: bytes) -> None:
    before = Event.objects.count()
    answer = Client().generic(
        "POST",
        "/api/v1/events",
        body,
        content_type="application/json",
        headers={"Authorization": f"Bearer {api['token']}"},
    )
    assert answer.status_code < 500, answer.content[:300]
    reply = json.loads(answer.content)
    note_case(f"{answer.status_code} {reply.get('field', '')}")  # --hypothesis-show-statistics
    if answer.status_code in (200, 202):
        results = reply.get("events") or [reply]
        created = [one for one in results if not one["duplicate"]]
        assert Event.objects.count() == before + len(created)
    else:
        assert reply["error"] and Event.objects.count() == before
        field = reply.get("field", "")
        assert not field.endswith("."), field  # a field named whole


filters = st.dictionaries(
    st.sampled_from(["cursor", "limit", "since", "until", "event_type", "status", "endpoint", "id"])
    | st.text(max_size=6),
    st.text(max_size=40)
    | st.sampled_from(["2026-01-01T00:00:00Z", "0", "-1", "99999999999", "1700000000000000-x"]),
    max_size=4,
)


@FUZZ
@given(query=filters)
def test_any_message_log_query_is_answered_below_500(api, query: dict) -> None:
    answer = Client().get(
        "/api/v1/tenants/shop-1/messages",
        query,
        headers={"Authorization": f"Bearer {api['token']}"},
    )
    assert answer.status_code < 500, answer.content[:300]
    note_case(str(answer.status_code))
    if answer.status_code >= 400:
        problem = json.loads(answer.content)
        assert problem["status"] == answer.status_code and problem["detail"]
