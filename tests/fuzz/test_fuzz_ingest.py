"""The ingest door (/ingest/<slug>/) under random requests, one source per signature
scheme, each keyed another way (body, header, query, path): bodies of any bytes, header
values of any bytes (UTF-8 or not), odd paths and query strings, signatures right and
wrong. Every answer is below 500 and says why when it refuses; every 202 stored exactly
the bytes sent; a 200 names the event it duplicates; a refused request stores nothing."""

import json
import time

import pytest
from django.test import Client
from hypothesis import event as note_case
from hypothesis import given
from hypothesis import strategies as st

from tests import signing
from tests.factories import make_endpoint, make_source, make_tenant
from tests.fuzz.strategies import FUZZ, header_values, json_bodies
from webhooks.models import Event, Source

pytestmark = pytest.mark.django_db

SECRET = "fuzz-secret"
SW_SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
# (scheme, where the tenant key is, the provider headers that name a type or an id)
SOURCES = {
    "shopify": (Source.SHOPIFY, "header:X-Shopify-Shop-Domain"),
    "github": (Source.GITHUB, "body.repository.owner.login"),
    "stripe": (Source.STRIPE, "body.account"),
    "standard": (Source.STANDARD_WEBHOOKS, "query:tenant"),
    "hmac": (Source.HMAC_SHA256, "path:0"),
}
PROVIDER_HEADERS = [
    "X-Shopify-Shop-Domain",
    "X-Shopify-Topic",
    "X-Shopify-Webhook-Id",
    "X-GitHub-Event",
    "X-GitHub-Delivery",
    "Idempotency-Key",
    "Content-Type",
]


@pytest.fixture
def sources() -> dict[str, Source]:
    make_tenant("shop-1")
    made = {}
    for slug, (scheme, key) in SOURCES.items():
        secret = SW_SECRET if scheme == Source.STANDARD_WEBHOOKS else SECRET
        made[slug] = make_source(slug, secret=secret, scheme=scheme, fairness_key=key)
        made[slug].auto_register_tenants = True
        made[slug].save()
        made[slug].destinations.add(make_endpoint(None, f"http://127.0.0.1:9/{slug}"))
    return made


def signature_headers(slug: str, body: bytes, tamper: bool, message_id: str) -> dict[str, str]:
    signed = body + b"x" if tamper else body
    now = int(time.time())
    if slug == "shopify":
        return {"X-Shopify-Hmac-Sha256": signing.shopify(SECRET, signed)}
    if slug == "github":
        return {"X-Hub-Signature-256": signing.github(SECRET, signed)}
    if slug == "stripe":
        return {"Stripe-Signature": signing.stripe(SECRET, now, signed)}
    if slug == "standard":
        return {
            "webhook-id": message_id,
            "webhook-timestamp": str(now),
            "webhook-signature": signing.standard_webhooks(SW_SECRET, message_id, now, signed),
        }
    return {"X-Signature": signing.hmac_hex(SECRET, signed)}


@FUZZ
@given(
    slug=st.sampled_from(sorted(SOURCES)),
    body=json_bodies,
    extra=st.dictionaries(st.sampled_from(PROVIDER_HEADERS), header_values, max_size=4),
    path=st.sampled_from(["", "shop-1", "a/b/c", "%C3%A9t%C3%A9", "x" * 300, "%00", "..%2F"]),
    query=st.sampled_from(["", "tenant=shop-1", "tenant=", "tenant=%FF%FE", "tenant=a&tenant=b"]),
    tamper=st.booleans(),
    message_id=st.from_regex(r"msg_[\x21-\x7e]{1,20}", fullmatch=True),
)
def test_any_request_is_answered_below_500_and_loses_nothing_acknowledged(
    sources, slug, body, extra, path, query, tamper, message_id
) -> None:
    headers = {**extra, **signature_headers(slug, body, tamper, message_id)}
    content_type = headers.pop("Content-Type", "application/json")
    url = f"/ingest/{slug}/{path}" + (f"?{query}" if query else "")
    before = Event.objects.count()
    answer = Client().generic(
        "POST", url, body, content_type=content_type or "application/json", headers=headers
    )
    assert answer.status_code < 500, answer.content[:300]
    note_case(f"{slug}: {answer.status_code}")  # the spread: --hypothesis-show-statistics
    reply = json.loads(answer.content)
    if answer.status_code == 202:
        event = Event.objects.get(pk=reply["id"])
        assert bytes(event.payload) == body
        assert Event.objects.count() == before + 1
        assert reply["lane"] == ("tenant" if event.tenant_id else "fallback")
    elif answer.status_code == 200:
        assert reply["duplicate"] and Event.objects.filter(pk=reply["id"]).exists()
        assert Event.objects.count() == before
    else:
        assert reply["error"] and Event.objects.count() == before
    if tamper:
        assert answer.status_code == 401
