"""Tenants through the API: operators create and change them, the status is the
dashboards', a tenant's token sees its own tenant alone, and every change is audited."""

import pytest

from tenants.models import AuditEntry, Tenant
from tests.api.helpers import Api, operator_token, tenant_token
from tests.factories import make_tenant
from webhooks.models import ApiToken

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def operator() -> Api:
    return Api(operator_token())


def test_an_operator_creates_a_tenant_and_reads_its_status(operator) -> None:
    made = operator.post("/api/v1/tenants", {"key": "acme", "name": "Acme", "weight": 2})
    assert made.status_code == 201, made.json()
    assert made.json()["key"] == "acme"
    assert made.json()["status"]["code"] == "on_pace"
    tenant = Tenant.objects.get(key="acme")
    assert (tenant.name, tenant.weight, tenant.is_active) == ("Acme", 2, True)
    entry = AuditEntry.objects.get(tenant=tenant)
    assert (entry.action, entry.via) == (AuditEntry.Action.TENANT_CREATED, "api")
    assert entry.actor_name.startswith("API token operator (whp_")


def test_a_taken_key_is_a_conflict_and_a_bad_one_names_the_field(operator) -> None:
    make_tenant("acme")
    taken = operator.post("/api/v1/tenants", {"key": "acme"})
    assert taken.status_code == 409
    assert taken["Content-Type"] == "application/problem+json"
    bad = operator.post("/api/v1/tenants", {"key": "a/b", "weight": 3})
    assert bad.status_code == 422
    fields = {error["field"] for error in bad.json()["errors"]}
    assert fields == {"key", "weight"}
    assert Tenant.objects.count() == 1


def test_an_unknown_field_is_refused_not_ignored(operator) -> None:
    make_tenant("acme")
    answer = operator.patch("/api/v1/tenants/acme", {"wieght": 4})
    assert answer.status_code == 422
    assert answer.json()["errors"] == [
        {"field": "wieght", "detail": "Not a field this operation takes."}
    ]


def test_pausing_and_weight_changes_are_saved_and_audited(operator) -> None:
    tenant = make_tenant("acme")
    answer = operator.patch(
        "/api/v1/tenants/acme", {"paused": True, "weight": 4, "rate_limit_per_second": 2.5}
    )
    assert answer.status_code == 200, answer.json()
    body = answer.json()
    assert (body["paused"], body["weight"], body["rate_limit_per_second"]) == (True, 4, 2.5)
    assert body["status"]["code"] == "paused"
    tenant.refresh_from_db()
    assert (tenant.is_active, tenant.weight, float(tenant.rate_limit_per_second)) == (
        False,
        4,
        2.5,
    )
    actions = set(AuditEntry.objects.filter(tenant=tenant).values_list("action", flat=True))
    assert actions == {AuditEntry.Action.TENANT_PAUSED, AuditEntry.Action.TENANT_CHANGED}


def test_a_tenant_token_sees_its_own_tenant_and_no_other() -> None:
    acme, other = make_tenant("acme"), make_tenant("other")
    api = Api(tenant_token(acme))
    listed = api.get("/api/v1/tenants").json()
    assert [tenant["key"] for tenant in listed["data"]] == ["acme"]
    assert api.get("/api/v1/tenants/acme").status_code == 200
    assert api.get("/api/v1/tenants/other").status_code == 404
    assert (
        api.get("/api/v1/tenants/nobody").json()["detail"]
        == (api.get("/api/v1/tenants/other").json()["detail"])
    )
    # Its own weight and pause are the operator's to set; creating tenants too.
    assert api.patch("/api/v1/tenants/acme", {"weight": 8}).status_code == 403
    assert api.post("/api/v1/tenants", {"key": "new"}).status_code == 403
    assert api.patch("/api/v1/tenants/other", {"weight": 8}).status_code == 404
    other.refresh_from_db()
    acme.refresh_from_db()
    assert (acme.weight, other.weight) == (1, 1)
    assert not Tenant.objects.filter(key="new").exists()


def test_tenants_are_paged_by_key_without_gaps_or_repeats(operator) -> None:
    for index in range(7):
        make_tenant(f"shop-{index}")
    seen, cursor = [], ""
    while True:
        page = operator.get(f"/api/v1/tenants?limit=3&cursor={cursor}").json()
        seen += [tenant["key"] for tenant in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [f"shop-{index}" for index in range(7)]
    bad = operator.get("/api/v1/tenants?cursor=nul%00")
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["field"] == "cursor"


@pytest.mark.parametrize("access", [ApiToken.Access.READ, ApiToken.Access.PUBLISH])
def test_tokens_that_may_not_write_change_nothing(access) -> None:
    make_tenant("acme")
    api = Api(operator_token(access))
    assert api.post("/api/v1/tenants", {"key": "new"}).status_code == 403
    assert api.patch("/api/v1/tenants/acme", {"weight": 2}).status_code == 403
    expected = 200 if access == ApiToken.Access.READ else 403
    assert api.get("/api/v1/tenants").status_code == expected
    assert not Tenant.objects.filter(key="new").exists()
    assert Tenant.objects.get(key="acme").weight == 1


def test_no_token_or_a_revoked_one_is_401_with_a_challenge() -> None:
    assert Api(None).get("/api/v1/tenants").status_code == 401
    token, plain = ApiToken.issue("old")
    ApiToken.objects.filter(pk=token.pk).update(is_active=False)
    answer = Api(plain).get("/api/v1/tenants")
    assert answer.status_code == 401
    assert answer["WWW-Authenticate"].startswith("Bearer")
    assert answer.json()["status"] == 401


def test_an_unknown_path_under_the_api_is_a_problem_not_a_page(operator) -> None:
    answer = operator.get("/api/v1/no-such-thing")
    assert answer.status_code == 404
    assert answer["Content-Type"] == "application/problem+json"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ('{"key": "acme", "key": "other"}', "'key' appears twice"),
        ('{"key": "acme", "weight": NaN}', "NaN"),
        ("[" * 100_000, "nested too deeply"),
        ('{"key": ', "not valid JSON"),
    ],
    ids=["duplicate-key", "nan", "deep", "cut-short"],
)
def test_a_body_is_read_as_strictly_as_the_publish_api_reads_one(operator, raw, reason) -> None:
    answer = operator.client.generic(
        "POST",
        "/api/v1/tenants",
        data=raw,
        content_type="application/json",
        headers=operator.headers,
    )
    assert answer.status_code == 400
    assert answer["Content-Type"] == "application/problem+json"
    assert reason in answer.json()["detail"]
    assert not Tenant.objects.exists()
