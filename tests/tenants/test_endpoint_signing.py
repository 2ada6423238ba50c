"""Every endpoint signs unless told not to: a secret is generated on creation, shown once
to whoever made it, and revealed again only by a permitted, logged action."""

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from core.signatures import standard_webhooks_key
from tenants.models import AuditEntry, Endpoint, EndpointSecret
from tests.factories import make_endpoint, make_tenant

pytestmark = pytest.mark.django_db

ENDPOINT_FORM = {
    "url": "http://127.0.0.1:9/hook",
    "max_in_flight": 2,
    "retry_max_in_flight": 1,
    "timeout_seconds": 30,
    "enabled": "on",
    "sign_requests": "on",
}


def secret_rows(*rows: dict[str, str], initial: int = 0) -> dict[str, object]:
    """The secrets inline of the endpoint form, with `rows` added by the operator."""
    data: dict[str, object] = {"secrets-TOTAL_FORMS": len(rows), "secrets-INITIAL_FORMS": initial}
    for index, row in enumerate(rows):
        data.update({f"secrets-{index}-{name}": value for name, value in row.items()})
    return data


@pytest.fixture
def root_client(staff_client, settings):
    settings.ALLOW_PRIVATE_DESTINATIONS = True  # the endpoints point at 127.0.0.1
    return staff_client


def test_an_endpoint_made_in_code_gets_a_usable_secret() -> None:
    endpoint = make_endpoint(make_tenant("acme"))

    [row] = EndpointSecret.objects.filter(endpoint=endpoint)
    assert endpoint.generated_secret == row.secret
    assert len(standard_webhooks_key(row.secret)) == 24
    # Saving it again makes no second one.
    endpoint.description = "changed"
    endpoint.save()
    assert endpoint.secrets.count() == 1 and endpoint.generated_secret is None


def test_endpoints_made_in_bulk_get_their_secrets_too() -> None:
    tenant = make_tenant("acme")
    made = Endpoint.objects.bulk_create(
        [
            Endpoint(tenant=tenant, url="http://127.0.0.1:9/a"),
            Endpoint(tenant=tenant, url="http://127.0.0.1:9/b", sign_requests=False),
            Endpoint(tenant=tenant, url="http://127.0.0.1:9/c"),
        ]
    )

    per_endpoint = {e.url[-1]: list(e.secrets.values_list("secret", flat=True)) for e in made}
    assert [len(per_endpoint[name]) for name in "abc"] == [1, 0, 1]
    assert made[0].generated_secret == per_endpoint["a"][0]


def test_an_endpoint_that_opts_out_gets_no_secret() -> None:
    endpoint = make_endpoint(make_tenant("acme"), sign_requests=False)
    assert not endpoint.secrets.exists() and endpoint.generated_secret is None


def test_the_admin_add_form_without_a_secret_generates_one_and_shows_it_once(root_client) -> None:
    response = root_client.post(
        reverse("admin:tenants_endpoint_add"), {**ENDPOINT_FORM, **secret_rows()}, follow=True
    )

    [row] = EndpointSecret.objects.all()
    shown = [str(message) for message in response.context["messages"]]
    assert any(row.secret in message for message in shown), shown
    # Once: the change page afterwards shows it masked only.
    page = root_client.get(reverse("admin:tenants_endpoint_change", args=[row.endpoint_id]))
    assert row.secret not in page.content.decode()


def test_a_secret_typed_on_the_add_form_is_the_only_one(root_client) -> None:
    typed = "whsec_" + "A" * 32
    root_client.post(
        reverse("admin:tenants_endpoint_add"),
        {**ENDPOINT_FORM, **secret_rows({"secret": typed})},
    )
    assert list(EndpointSecret.objects.values_list("secret", flat=True)) == [typed]


def test_an_empty_secret_row_added_later_generates_a_secret(root_client) -> None:
    endpoint = make_endpoint(make_tenant("acme"))
    [first] = endpoint.secrets.all()
    change = reverse("admin:tenants_endpoint_change", args=[endpoint.pk])
    form = {
        **ENDPOINT_FORM,
        "tenant": endpoint.tenant_id,
        **secret_rows({"id": first.pk, "endpoint": endpoint.pk}, {"secret": ""}, initial=1),
    }

    response = root_client.post(change, form, follow=True)

    assert response.status_code == 200
    added = endpoint.secrets.exclude(pk=first.pk).get()
    assert added.secret.startswith("whsec_") and added.secret != first.secret
    assert EndpointSecret.objects.get(pk=first.pk).secret == first.secret  # kept as it was
    assert any(added.secret in str(m) for m in response.context["messages"])


def test_unsigned_is_a_visible_choice_in_the_list(root_client) -> None:
    make_endpoint(make_tenant("acme"), url="http://127.0.0.1:9/plain", sign_requests=False)
    page = root_client.get(reverse("admin:tenants_endpoint_changelist") + "?sign_requests__exact=0")
    assert "http://127.0.0.1:9/plain" in page.content.decode()
    assert "Sign requests" in page.content.decode()


def reveal(client, endpoint: Endpoint):
    return client.post(
        reverse("admin:tenants_endpoint_changelist"),
        {"action": "reveal_signing_secrets", "_selected_action": [endpoint.pk]},
        follow=True,
    )


def test_reveal_shows_the_secret_to_a_permitted_user_and_is_logged(root_client) -> None:
    endpoint = make_endpoint(make_tenant("acme"))
    secret = endpoint.secrets.get().secret

    response = reveal(root_client, endpoint)

    assert any(secret in str(m) for m in response.context["messages"])
    entry = LogEntry.objects.get(object_id=str(endpoint.pk))
    assert "Revealed" in entry.get_change_message()
    assert entry.user.username == "root"
    trail = AuditEntry.objects.get()
    assert (trail.actor_name, trail.action, trail.via) == ("root", "secret.revealed", "admin")
    assert (trail.tenant, trail.target) == (endpoint.tenant, f"endpoint {endpoint.pk}")
    assert secret not in str(trail.detail)
    trail_page = root_client.get(reverse("admin:tenants_auditentry_changelist"))
    assert f"endpoint {endpoint.pk}" in trail_page.content.decode()


def test_reveal_is_refused_without_the_permission(client) -> None:
    endpoint = make_endpoint(make_tenant("acme"))
    secret = endpoint.secrets.get().secret
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_endpoint", "change_endpoint"])
    )
    client.force_login(user)

    response = reveal(client, endpoint)

    assert secret not in response.content.decode()
    assert not any(secret in str(m) for m in response.context["messages"])
    assert not LogEntry.objects.exists()
    assert not AuditEntry.objects.exists()
    user.user_permissions.add(Permission.objects.get(codename="reveal_endpoint_secret"))
    user = User.objects.get(pk=user.pk)  # a fresh permission cache
    client.force_login(user)
    assert any(secret in str(m) for m in reveal(client, endpoint).context["messages"])


def test_operators_endpoint_changes_are_on_the_tenants_audit_trail(root_client) -> None:
    tenant = make_tenant("acme")
    form = {**ENDPOINT_FORM, "tenant": tenant.pk}
    response = root_client.post(
        reverse("admin:tenants_endpoint_add"), {**form, **secret_rows()}, follow=True
    )
    assert response.status_code == 200
    endpoint = Endpoint.objects.get(tenant=tenant)
    created = AuditEntry.objects.get(action="endpoint.created")
    assert (created.tenant, created.via, created.target) == (
        tenant,
        "admin",
        f"endpoint {endpoint.pk}",
    )
    assert created.detail["new"]["url"] == "http://127.0.0.1:9/hook"
    assert created.detail["new"]["tenant"] == tenant.pk

    changed = {**form, "url": "http://127.0.0.1:9/moved", "max_in_flight": 5}
    root_client.post(
        reverse("admin:tenants_endpoint_change", args=[endpoint.pk]),
        {**changed, **secret_rows()},
    )
    entry = AuditEntry.objects.get(action="endpoint.changed")
    assert entry.detail["old"] == {"url": "http://127.0.0.1:9/hook", "max_in_flight": 2}
    assert entry.detail["new"] == {"url": "http://127.0.0.1:9/moved", "max_in_flight": 5}
    assert endpoint.secrets.get().secret not in str(entry.detail)
