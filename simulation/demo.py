"""Demo data for `make run`: shops whose endpoints each show one thing the platform does.

* alpha, bravo, charlie, delta: quiet shops posting signed Shopify-style webhooks now
  and then. Their deliveries should arrive within a second whatever big-shop does.
* big-shop floods (through the publish API, at about twice what the worker delivers):
  the scheduler paces it to its fair share and its backlog shows on every page.
* bravo's endpoint fails half the time: retries, mostly recovered.
* charlie's second endpoint always answers 500: retries, then dead letters to replay.
* delta's endpoint hangs: it has no cap of its own, so its limit adapts, and each round of
  timeouts halves it, down to one request (plus one retry) held and nothing more.
"""

import secrets

from django.conf import settings
from django.contrib.auth.models import User

from tenants.models import Endpoint, Membership, Tenant
from webhooks.models import ApiToken, Source, SourceSecret

DEMO_SOURCE_SLUG = "shop"
DEMO_SOURCE_SECRET = "demo-shopify-secret"  # noqa: S105 (development only; printed so you can sign requests)
DEMO_RECEIVER = "http://127.0.0.1:8001"
DEMO_TOKEN_NAME = "demo traffic"  # noqa: S105 (a name, not a secret)
QUIET_TENANTS = [
    "alpha-shop.example",
    "bravo-shop.example",
    "charlie-shop.example",
    "delta-shop.example",
]
LOUD_TENANT = "big-shop.example"

# tenant key -> its endpoints: (receiver path, description, fields)
ENDPOINTS: dict[str, list[tuple[str, str, dict]]] = {
    "alpha-shop.example": [("ok/alpha", "Healthy", {})],
    "bravo-shop.example": [("flaky/bravo", "Fails half the time: retries", {})],
    "charlie-shop.example": [
        ("ok/charlie", "Healthy", {}),
        ("broken/charlie", "Always 500: dead letters to replay", {}),
    ],
    "delta-shop.example": [
        (
            "hang/delta",
            "Hangs: its limit backs off to one request, nothing more",
            {"timeout_seconds": 10},
        ),
    ],
    # A cap above the demo worker's slots: what paces big-shop is its fair share of the
    # worker, not its endpoint (the overview then says "paced", not "at its cap").
    LOUD_TENANT: [("ok/big", "Healthy, fast, generous cap", {"max_in_flight": 200})],
}
WEIGHTS = {"charlie-shop.example": 2}
# (username, tenant key, role): the tenant logins the demo prints.
DEMO_MEMBERS = [
    ("alpha", QUIET_TENANTS[0], Membership.VIEWER),
    ("big", LOUD_TENANT, Membership.ADMIN),
    ("charlie", QUIET_TENANTS[2], Membership.ADMIN),
]


def admin_password() -> str:
    """Generated once into var/ so it is stable across runs but never a known default."""
    path = settings.VAR_DIR / "demo_admin_password"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(9))
        path.chmod(0o600)
    return path.read_text().strip()


def _user(username: str, password: str, **fields) -> User:
    user, made = User.objects.get_or_create(username=username, defaults=fields)
    if made:
        user.set_password(password)
        user.save()
    return user


def seed(receiver: str = DEMO_RECEIVER) -> dict[str, str]:
    """Idempotent: brings the demo's own objects to this layout (an older checkout's demo
    data included) and leaves everything else alone. Returns the logins."""
    password = admin_password()
    _user("admin", password, is_staff=True, is_superuser=True, email="admin@example.com")
    tenants = {}
    for key in [*QUIET_TENANTS, LOUD_TENANT]:
        tenants[key], _ = Tenant.objects.get_or_create(
            key=key,
            defaults={
                "name": key.split(".")[0].replace("-", " ").title(),
                "weight": WEIGHTS.get(key, 1),
            },
        )
        urls = []
        for path, description, fields in ENDPOINTS[key]:
            urls.append(f"{receiver}/{path}")
            Endpoint.objects.update_or_create(
                tenant=tenants[key], url=urls[-1], defaults={"description": description, **fields}
            )
        # Endpoints an older demo made on the receiver, and no longer part of it.
        old = Endpoint.objects.filter(tenant=tenants[key], url__startswith=f"{receiver}/")
        old.exclude(url__in=urls).delete()
    # Tenant members see only their own shop: alpha as a viewer, big as its admin, and
    # charlie as the admin of the shop whose endpoint fails (its dead letters, a replay).
    for username, key, role in DEMO_MEMBERS:
        user = _user(username, password)
        Membership.objects.get_or_create(user=user, tenant=tenants[key], defaults={"role": role})
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
    # Older demos routed the source to one shared endpoint (gateway mode); now each shop's
    # events go to that shop's own endpoints.
    source.destinations.clear()
    Endpoint.objects.filter(tenant=None, url=f"{receiver}/shared").delete()
    return {"admin": password, **{username: password for username, _, _ in DEMO_MEMBERS}}


def issue_token() -> str:
    """A fresh publish-API token for this run's traffic (the last run's is revoked)."""
    ApiToken.objects.filter(name=DEMO_TOKEN_NAME).delete()
    return ApiToken.issue(DEMO_TOKEN_NAME)[1]
