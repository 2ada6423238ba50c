"""Every admin changelist and add page answers 200 for staff; secrets never render in full."""

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.urls import reverse

from delivery.models import Delivery
from tenants.models import EndpointSecret
from tests.factories import make_backlog, make_endpoint, make_source, make_tenant

pytestmark = pytest.mark.django_db


def registered_models():
    return [model for model in admin.site._registry if model._meta.app_label != "auth"]


@pytest.mark.parametrize("model", registered_models(), ids=lambda m: m._meta.label)
def test_changelist_and_add_pages_answer_200(staff_client, model) -> None:
    opts = model._meta
    changelist = staff_client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))
    assert changelist.status_code == 200
    model_admin = admin.site._registry[model]
    if model_admin.has_add_permission(type("R", (), {"user": User(is_superuser=True)})()):
        add = staff_client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_add"))
        assert add.status_code == 200


def test_change_pages_never_show_secrets_in_full(staff_client) -> None:
    endpoint = make_endpoint(make_tenant())
    secret = EndpointSecret.objects.create(endpoint=endpoint)
    source = make_source(secret="provider-secret-value-123")
    page = staff_client.get(reverse("admin:tenants_endpoint_change", args=[endpoint.pk]))
    assert page.status_code == 200
    assert secret.secret not in page.content.decode()
    page = staff_client.get(reverse("admin:webhooks_source_change", args=[source.pk]))
    assert page.status_code == 200
    assert "provider-secret-value-123" not in page.content.decode()


def test_anonymous_users_are_sent_to_login(client) -> None:
    response = client.get(reverse("admin:tenants_tenant_changelist"))
    assert response.status_code == 302
    assert "/login/" in response["Location"]


def test_migrations_are_complete() -> None:
    from django.core.management import call_command

    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


@pytest.mark.parametrize(
    ("flagged", "words"), [(False, "no"), (True, "yes: saved while Redis was unreachable")]
)
def test_needs_schedule_is_words_not_a_red_icon(staff_client, flagged, words) -> None:
    delivery = make_backlog(1)[0]
    Delivery.objects.filter(pk=delivery.pk).update(needs_schedule=flagged)
    page = staff_client.get(reverse("admin:delivery_delivery_change", args=[delivery.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    row = html[html.index('class="form-row field-schedule_state"') :]
    assert "<label>Needs schedule:</label>" in row
    assert row.split('<div class="readonly">', 1)[1].startswith(words)
    # Delivery has no other boolean: no yes/no icon anywhere on its page.
    assert "icon-no" not in html and "icon-yes" not in html
