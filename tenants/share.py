"""Signed, expiring share links: a read-only tenant dashboard without an account.

The token is the tenant's id and an expiry time, signed with SECRET_KEY (Django's
signing, HMAC-SHA256, its own salt). Nothing is stored: a link cannot be revoked one by
one; rotating SECRET_KEY revokes them all, and links are short-lived by default.
"""

import time
from dataclasses import dataclass
from datetime import UTC, datetime

from django.core import signing

from tenants.models import Tenant

SALT = "tenants.share-link"
DEFAULT_DAYS = 7
MAX_DAYS = 90


class ShareLinkInvalid(Exception):
    """Tampered with, malformed, or signed with another key: answered as not found."""


class ShareLinkExpired(Exception):
    """Genuine but past its expiry: answered as forbidden, with a page saying so."""

    def __init__(self, expired_at: datetime) -> None:
        super().__init__(f"share link expired at {expired_at:%Y-%m-%d %H:%M} UTC")
        self.expired_at = expired_at


@dataclass(frozen=True)
class ShareGrant:
    tenant_id: int
    expires_at: datetime


def make_token(tenant: Tenant, *, days: float = DEFAULT_DAYS, now: float | None = None) -> str:
    if not 0 < days <= MAX_DAYS:
        raise ValueError(f"a share link lasts between a moment and {MAX_DAYS} days")
    expires = int((time.time() if now is None else now) + days * 86400)
    return signing.dumps({"t": tenant.pk, "e": expires}, salt=SALT, compress=False)


def read_token(token: str, *, now: float | None = None) -> ShareGrant:
    """The grant a token carries; raises ShareLinkInvalid or ShareLinkExpired."""
    try:
        data = signing.loads(token, salt=SALT)
        tenant_id, expires = int(data["t"]), int(data["e"])
    except (signing.BadSignature, KeyError, TypeError, ValueError) as exc:
        raise ShareLinkInvalid(str(exc)) from exc
    expires_at = datetime.fromtimestamp(expires, tz=UTC)
    if (time.time() if now is None else now) >= expires:
        raise ShareLinkExpired(expires_at)
    return ShareGrant(tenant_id=tenant_id, expires_at=expires_at)
