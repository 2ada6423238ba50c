"""Security: CSRF on every session-authenticated form, secrets never in logs, production checks."""

import logging
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from tenants.models import EndpointSecret
from tests import signing
from tests.factories import make_endpoint, make_source, make_tenant
from webhooks.models import ApiToken, Source

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "model",
    [m for m in admin.site._registry if m._meta.app_label != "auth"],
    ids=lambda m: m._meta.label,
)
def test_admin_forms_refuse_posts_without_a_csrf_token(model) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    opts = model._meta
    changelist = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
    assert (
        client.post(
            changelist, {"action": "delete_selected", "_selected_action": ["1"]}
        ).status_code
        == 403
    )
    assert (
        client.post(reverse(f"admin:{opts.app_label}_{opts.model_name}_add"), {}).status_code == 403
    )


@pytest.mark.django_db
def test_login_form_needs_a_csrf_token() -> None:
    client = Client(enforce_csrf_checks=True)
    assert (
        client.post(reverse("admin:login"), {"username": "x", "password": "y"}).status_code == 403
    )


@pytest.mark.django_db(transaction=True)
def test_secrets_never_reach_the_logs(client, caplog, settings) -> None:
    from delivery.pipeline.engine import DeliveryEngine
    from ingest.publish import publish
    from tests.delivery_helpers import statuses, wait_until
    from tests.http_receivers import Recorder

    settings.ALLOW_PRIVATE_DESTINATIONS = True
    source_secret = "source-secret-" + secrets.token_hex(8)
    caplog.set_level(logging.DEBUG)
    with Recorder() as receiver:
        tenant = make_tenant("acme")
        endpoint = make_endpoint(tenant, receiver.url)
        signing_secret = EndpointSecret.objects.create(endpoint=endpoint).secret
        source = make_source(
            "shop", secret=source_secret, scheme=Source.SHOPIFY, fairness_key="body.shop"
        )
        source.destinations.add(endpoint)
        _, token = ApiToken.issue("t")
        # A forged request, a good one, a publish, and a delivery signed with the endpoint secret.
        client.post(
            "/ingest/shop/",
            data=b"{}",
            content_type="application/json",
            HTTP_X_SHOPIFY_HMAC_SHA256=signing.shopify("wrong", b"{}"),
        )
        body = b'{"shop": "acme"}'
        client.post(
            "/ingest/shop/",
            data=body,
            content_type="application/json",
            HTTP_X_SHOPIFY_HMAC_SHA256=signing.shopify(source_secret, body),
        )
        client.post(
            "/api/v1/events",
            data=b"{",
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
        publish(tenant, "x", {})
        engine = DeliveryEngine(concurrency=2)
        engine.start()
        try:
            assert wait_until(lambda: statuses().get("delivered") == 2)
        finally:
            engine.stop(graceful=True, timeout=10)
    logged = "\n".join(record.getMessage() for record in caplog.records)
    for secret in (source_secret, signing_secret, signing_secret.removeprefix("whsec_"), token):
        assert secret not in logged


def readme_production_settings() -> dict[str, str]:
    """The README's "Production settings" block, as the environment it describes."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- production-settings -->")[1].split("<!-- /production-settings -->")[
        0
    ]
    settings = {}
    for line in block.strip().strip("`").removeprefix("sh").splitlines():
        line = line.strip()
        # Whole-line comments only: an environment file (systemd's) has no others.
        if line and not line.startswith("#"):
            name, value = line.split("=", 1)
            assert "#" not in value and " " not in value, line
            settings[name] = value
    return settings


def test_deploy_checks_pass_with_the_readmes_production_settings(tmp_path: Path) -> None:
    documented = readme_production_settings()
    assert documented["DEBUG"] == "false" and documented["ADMIN_REQUIRE_2FA"] == "true"
    env = {**os.environ, **documented}
    # The secrets the block points at, made for the run.
    for name in [name for name in documented if name.endswith("_FILE")]:
        path = tmp_path / name.lower()
        path.write_text(secrets.token_urlsafe(60))
        env[name] = str(path)
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_deploy_checks_flag_development_leftovers() -> None:
    env = {**os.environ, "DEBUG": "false", "ALLOW_PRIVATE_DESTINATIONS": "true"}
    env.pop("SECRET_KEY", None)
    env.pop("METRICS_TOKEN", None)
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = result.stdout + result.stderr
    for check_id in ("webhooks.W001", "webhooks.W002", "webhooks.W003"):
        assert check_id in output


@pytest.mark.django_db
def test_a_form_refused_for_csrf_says_why_in_the_sites_style() -> None:
    """Django's own page styles itself inline, which the CSP refuses: ours does not."""
    answer = Client(enforce_csrf_checks=True).post(
        reverse("tenants:login"), {"username": "a", "password": "b"}
    )
    assert answer.status_code == 403
    page = answer.content.decode()
    assert "This form could not be checked" in page and "Nothing was changed" in page
    assert "<style" not in page and "style=" not in page
    assert "default-src 'none'" in answer["Content-Security-Policy"]
