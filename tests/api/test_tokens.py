"""API tokens: made by the command, stored hashed; publish-only tokens keep publishing;
Idempotency-Key gives the first answer again; each token has a budget per minute."""

import io
import json
import logging
import socket

import pytest
from django.core.management import CommandError, call_command

from api import throttling
from api.models import IdempotentRequest
from core import redis_connection
from core.outage_log import OutageLog
from tenants.models import Tenant
from tests.api.helpers import Api, operator_token
from tests.factories import make_endpoint, make_tenant
from webhooks.models import ApiToken, Event, hash_token

pytestmark = pytest.mark.django_db(transaction=True)


def _command(*args: str) -> str:
    out = io.StringIO()
    call_command("create_api_token", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue().strip()


def test_the_command_prints_a_token_that_is_stored_only_hashed() -> None:
    plain = _command("--operator")
    token = ApiToken.objects.get()
    assert token.token_hash == hash_token(plain) and plain not in token.token_hash
    assert (token.tenant, token.access, token.prefix) == (None, "write", plain[:8])
    assert Api(plain).get("/api/v1/tenants").status_code == 200
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_the_command_binds_a_read_only_token_to_one_tenant() -> None:
    acme = make_tenant("acme")
    plain = _command("--tenant", "acme", "--read-only")
    token = ApiToken.objects.get()
    assert (token.tenant, token.access) == (acme, "read")
    assert Api(plain).post("/api/v1/tenants/acme/endpoints", {"url": "x"}).status_code == 403
    with pytest.raises(CommandError, match="No tenant"):
        _command("--tenant", "nobody")


def _publish(token: str, tenant: str = "acme"):
    return Api(token).post(
        "/api/v1/events", {"tenant": tenant, "event_type": "order.created", "payload": {}}
    )


def test_publish_only_tokens_publish_and_manage_nothing() -> None:
    make_tenant("acme")
    plain = ApiToken.issue("publisher", access=ApiToken.Access.PUBLISH)[1]
    assert _publish(plain).status_code == 202
    refused = Api(plain).get("/api/v1/tenants")
    assert refused.status_code == 403
    assert "only publish" in refused.json()["detail"]


def test_read_only_tokens_do_not_publish() -> None:
    make_tenant("acme")
    answer = _publish(operator_token(ApiToken.Access.READ))
    assert answer.status_code == 403
    assert not Event.objects.exists()
    assert _publish(operator_token(ApiToken.Access.WRITE)).status_code == 202


def test_an_idempotency_key_answers_the_first_result_again() -> None:
    api = Api(operator_token())
    key = {"Idempotency-Key": "create-acme-1"}
    first = api.post("/api/v1/tenants", {"key": "acme"}, **key)
    again = api.post("/api/v1/tenants", {"key": "acme"}, **key)
    assert (first.status_code, again.status_code) == (201, 201)
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["key"] == first.json()["key"] == "acme"
    assert Tenant.objects.count() == 1
    other = api.post("/api/v1/tenants", {"key": "other"}, **key)
    assert other.status_code == 422
    assert other.json()["errors"][0]["field"] == "Idempotency-Key"
    # Without a key the same request is a second act: here, a conflict.
    assert api.post("/api/v1/tenants", {"key": "acme"}).status_code == 409


def test_a_refused_request_does_not_use_up_its_key(settings) -> None:
    settings.ALLOW_PRIVATE_DESTINATIONS = True
    make_tenant("acme")
    api = Api(operator_token())
    key = {"Idempotency-Key": "endpoint-1"}
    path = "/api/v1/tenants/acme/endpoints"
    assert api.post(path, {"url": "ftp://nowhere"}, **key).status_code == 422
    assert not IdempotentRequest.objects.exists()
    made = api.post(path, {"url": "http://127.0.0.1:9/hook"}, **key)
    assert made.status_code == 201
    again = api.post(path, {"url": "http://127.0.0.1:9/hook"}, **key)
    assert again.json()["id"] == made.json()["id"]
    # The secret in the kept answer is the one the first call showed, not a new one.
    assert again.json()["secret"] == made.json()["secret"]


def test_keys_are_per_token() -> None:
    key = {"Idempotency-Key": "same"}
    assert Api(operator_token()).post("/api/v1/tenants", {"key": "a"}, **key).status_code == 201
    assert Api(operator_token()).post("/api/v1/tenants", {"key": "b"}, **key).status_code == 201


def test_a_token_past_its_budget_is_told_when_to_come_back(settings) -> None:
    settings.API_RATE_LIMIT_PER_MINUTE = 3
    make_tenant("acme")
    api, other = Api(operator_token()), Api(operator_token())
    answers = [api.get("/api/v1/tenants/acme") for _ in range(4)]
    assert [answer.status_code for answer in answers] == [200, 200, 200, 429]
    refused = answers[-1]
    assert refused["Content-Type"] == "application/problem+json"
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert json.loads(refused.content)["status"] == 429
    # Another token has its own budget.
    assert other.get("/api/v1/tenants/acme").status_code == 200


def test_endpoints_made_through_the_api_deliver_like_any_other(settings) -> None:
    settings.ALLOW_PRIVATE_DESTINATIONS = True
    make_endpoint(make_tenant("acme"), "http://127.0.0.1:9/old")
    token = operator_token()
    made = Api(token).post("/api/v1/tenants/acme/endpoints", {"url": "http://127.0.0.1:9/new"})
    assert made.status_code == 201
    assert _publish(token).json()["deliveries"] == 2


def test_the_admin_makes_a_token_shown_once_and_revokes_it(client) -> None:
    from django.contrib.auth.models import User

    acme = make_tenant("acme")
    client.force_login(User.objects.create_superuser("root", "r@example.com", "pw"))
    made = client.post(
        "/admin/webhooks/apitoken/add/",
        {"name": "ci", "tenant": acme.pk, "access": "read", "is_active": "on"},
        follow=True,
    )
    shown = [str(message) for message in made.context["messages"]]
    plain = next(word for text in shown for word in text.split() if word.startswith("whp_"))
    token = ApiToken.objects.get()
    assert (token.tenant, token.access, token.token_hash) == (acme, "read", hash_token(plain))
    assert Api(plain).get("/api/v1/tenants/acme").status_code == 200
    client.post(
        "/admin/webhooks/apitoken/",
        {"action": "revoke", "_selected_action": [token.pk]},
    )
    assert Api(plain).get("/api/v1/tenants/acme").status_code == 401


def test_without_redis_the_budget_is_not_enforced_and_the_outage_is_logged_once(
    settings, caplog, monkeypatch
) -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
    settings.API_RATE_LIMIT_PER_MINUTE = 1
    monkeypatch.setattr(throttling, "_redis_down", OutageLog(throttling.logger))
    redis_connection.forget()
    try:
        api = Api(operator_token())
        with caplog.at_level(logging.WARNING, logger="api.throttling"):
            answers = [api.get("/api/v1/event-types").status_code for _ in range(3)]
    finally:
        redis_connection.forget()
    assert answers == [200, 200, 200]
    warned = [r for r in caplog.records if r.name == "api.throttling"]
    assert len(warned) == 1
    assert "not enforced" in warned[0].getMessage()
