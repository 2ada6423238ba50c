"""Demo data for `make run`: tenants, endpoints on the local demo receiver, a signed source."""

import secrets

from django.conf import settings
from django.contrib.auth.models import User

from tenants.models import Endpoint, EndpointSecret, Membership, Tenant
from webhooks.models import Source, SourceSecret

DEMO_SOURCE_SLUG = "shop"
DEMO_SOURCE_SECRET = "demo-shopify-secret"  # noqa: S105 (development only; printed so you can sign requests)
DEMO_RECEIVER = "http://127.0.0.1:8001"
QUIET_TENANTS = ["alpha-shop.example", "bravo-shop.example", "charlie-shop.example"]
LOUD_TENANT = "big-shop.example"


def admin_password() -> str:
    """Generated once into var/ so it is stable across runs but never a known default."""
    path = settings.VAR_DIR / "demo_admin_password"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(9))
        path.chmod(0o600)
    return path.read_text().strip()


def seed(receiver: str = DEMO_RECEIVER) -> dict[str, str]:
    """Idempotent: running it again changes nothing that exists."""
    password = admin_password()
    admin, created = User.objects.get_or_create(
        username="admin",
        defaults={"is_staff": True, "is_superuser": True, "email": "admin@example.com"},
    )
    if created:
        admin.set_password(password)
        admin.save()
    shared, _ = Endpoint.objects.get_or_create(
        tenant=None,
        url=f"{receiver}/shared",
        defaults={
            "description": "The demo app behind the gateway",
            "max_in_flight": 8,
            "retry_max_in_flight": 2,
        },
    )
    for index, key in enumerate([*QUIET_TENANTS, LOUD_TENANT]):
        tenant, _ = Tenant.objects.get_or_create(
            key=key,
            defaults={
                "name": key.split(".")[0].replace("-", " ").title(),
                "weight": 2 if index == 2 else 1,
            },
        )
        own_path = "flaky" if key == "bravo-shop.example" else f"t/{key}"
        endpoint, made = Endpoint.objects.get_or_create(
            tenant=tenant, url=f"{receiver}/{own_path}", defaults={"description": "Demo endpoint"}
        )
        if made:
            EndpointSecret.objects.create(endpoint=endpoint)
    viewer, made = User.objects.get_or_create(username="alpha")
    if made:
        viewer.set_password(password)
        viewer.save()
        Membership.objects.get_or_create(
            user=viewer, tenant=Tenant.objects.get(key=QUIET_TENANTS[0])
        )
    source, made = Source.objects.get_or_create(
        slug=DEMO_SOURCE_SLUG,
        defaults={
            "name": "Demo Shopify-style source",
            "scheme": Source.SHOPIFY,
            "fairness_key": "header:X-Shopify-Shop-Domain",
            "auto_register_tenants": True,
        },
    )
    if made:
        SourceSecret.objects.create(source=source, secret=DEMO_SOURCE_SECRET)
        source.destinations.add(shared)
    return {"admin_user": "admin", "admin_password": password, "viewer_user": "alpha"}
