"""Signature verification: every scheme, against signatures computed here with hmac/hashlib/base64
directly (never with the module's own helpers), plus the providers' published examples."""

import base64
import hashlib
import hmac
import json
import re

import pytest
from django.http.request import HttpHeaders
from django.test import RequestFactory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.signatures import (
    SignatureError,
    VerificationConfig,
    sign_standard_webhooks,
    standard_webhooks_key,
    verify_request,
)

NOW = 1_700_000_000
BODY = b'{"id": 1001, "shop": "acme.myshopify.com", "total": "12.50"}'
# The same JSON document, re-serialized the way a framework might: bytes differ, meaning does not.
RESERIALIZED_BODIES = [
    json.dumps(json.loads(BODY), separators=(",", ":")).encode(),
    json.dumps(json.loads(BODY), sort_keys=True, indent=2).encode(),
    json.dumps(dict(reversed(json.loads(BODY).items()))).encode(),
]

OLD_SECRET = "old-shared-secret"
NEW_SECRET = "new-shared-secret"

# Standard Webhooks keys are random bytes shipped as whsec_<base64>.
SW_OLD_KEY = bytes(range(24))
SW_NEW_KEY = bytes(range(100, 132))
SW_OLD = "whsec_" + base64.b64encode(SW_OLD_KEY).decode()
SW_NEW = "whsec_" + base64.b64encode(SW_NEW_KEY).decode()


def hmac_sha256(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def refusal(config: VerificationConfig, headers: dict, body: bytes = BODY, now: float = NOW) -> str:
    """The reason verify_request gives; fails the test if the request is accepted."""
    with pytest.raises(SignatureError) as info:
        verify_request(config, headers, body, now)
    return str(info.value)


# --- configuration ---------------------------------------------------------------------------


def test_none_scheme_accepts_unsigned_requests_without_secrets():
    verify_request(VerificationConfig("none", []), {}, b"anything", NOW)


def test_unknown_scheme_fails_at_construction():
    with pytest.raises(ValueError, match="unknown signature scheme"):
        VerificationConfig("md5", ["s"])


def test_unknown_hmac_encoding_fails_at_construction():
    with pytest.raises(ValueError, match="unknown HMAC encoding"):
        VerificationConfig("hmac-sha256", ["s"], hmac_encoding="base32")


def test_negative_tolerance_fails_at_construction():
    with pytest.raises(ValueError, match="tolerance"):
        VerificationConfig("stripe", ["s"], tolerance_seconds=-1)


def test_a_bare_string_is_not_taken_as_a_list_of_one_character_secrets():
    with pytest.raises(TypeError):
        VerificationConfig("github", "abc")


def test_secrets_are_left_out_of_the_config_repr():
    config = VerificationConfig("github", ["do-not-log-me"])
    assert "do-not-log-me" not in repr(config)


def test_config_keeps_a_snapshot_of_the_secret_list():
    secrets = [OLD_SECRET]
    config = VerificationConfig("github", secrets)
    secrets.append(NEW_SECRET)
    assert config.secrets == (OLD_SECRET,)


@pytest.mark.parametrize(
    "scheme", ["shopify", "github", "stripe", "standard-webhooks", "hmac-sha256"]
)
@pytest.mark.parametrize("secrets", [[], [""], ["", ""]])
def test_signing_scheme_without_an_active_secret_refuses(scheme, secrets):
    headers = {
        "X-Shopify-Hmac-Sha256": b64(hmac_sha256(b"", BODY)),
        "X-Hub-Signature-256": "sha256=" + hmac_sha256(b"", BODY).hex(),
        "Stripe-Signature": f"t={NOW},v1=" + hmac_sha256(b"", f"{NOW}.".encode() + BODY).hex(),
        "webhook-id": "msg_1",
        "webhook-timestamp": str(NOW),
        "webhook-signature": "v1," + b64(hmac_sha256(b"", f"msg_1.{NOW}.".encode() + BODY)),
        "X-Signature": hmac_sha256(b"", BODY).hex(),
    }
    # Signed with an empty key, which a blank secret would otherwise accept.
    assert refusal(VerificationConfig(scheme, secrets), headers) == "no active secret configured"


# --- Shopify ---------------------------------------------------------------------------------


def shopify_headers(secret: str, body: bytes = BODY) -> dict[str, str]:
    return {"X-Shopify-Hmac-Sha256": b64(hmac_sha256(secret.encode(), body))}


SHOPIFY = VerificationConfig("shopify", [NEW_SECRET])


def test_shopify_valid_signature_passes():
    verify_request(SHOPIFY, shopify_headers(NEW_SECRET), BODY, NOW)


def test_shopify_secret_is_used_as_utf8_text():
    secret = "sécret-ü"
    config = VerificationConfig("shopify", [secret])
    headers = {"X-Shopify-Hmac-Sha256": b64(hmac_sha256(secret.encode("utf-8"), BODY))}
    verify_request(config, headers, BODY, NOW)


@pytest.mark.parametrize("body", RESERIALIZED_BODIES)
def test_shopify_reserialized_body_is_refused(body):
    assert refusal(SHOPIFY, shopify_headers(NEW_SECRET), body) == "signature does not match"


def test_shopify_wrong_secret_is_refused():
    assert refusal(SHOPIFY, shopify_headers("guess")) == "signature does not match"


@pytest.mark.parametrize("signed_with", [OLD_SECRET, NEW_SECRET])
def test_shopify_accepts_either_secret_during_rotation(signed_with):
    config = VerificationConfig("shopify", [OLD_SECRET, NEW_SECRET])
    verify_request(config, shopify_headers(signed_with), BODY, NOW)


def test_shopify_retired_secret_is_refused_after_rotation():
    assert refusal(SHOPIFY, shopify_headers(OLD_SECRET)) == "signature does not match"


@pytest.mark.parametrize("name", ["x-shopify-hmac-sha256", "X-SHOPIFY-HMAC-SHA256"])
def test_shopify_header_name_is_case_insensitive(name):
    value = shopify_headers(NEW_SECRET)["X-Shopify-Hmac-Sha256"]
    verify_request(SHOPIFY, {name: value}, BODY, NOW)


@pytest.mark.parametrize("headers", [{}, {"X-Shopify-Hmac-Sha256": ""}, {"X-Other": "x"}])
def test_shopify_missing_header_is_refused(headers):
    assert refusal(SHOPIFY, headers) == "missing X-Shopify-Hmac-Sha256 header"


@pytest.mark.parametrize(
    "value",
    [
        "not base64!",
        b64(b"short"),
        hmac_sha256(NEW_SECRET.encode(), BODY).hex(),  # hex where base64 is expected
        b64(hmac_sha256(NEW_SECRET.encode(), BODY))[:-1],  # padding cut off
        "é" * 44,
    ],
)
def test_shopify_malformed_header_is_refused(value):
    reason = refusal(SHOPIFY, {"X-Shopify-Hmac-Sha256": value})
    assert reason == "X-Shopify-Hmac-Sha256 signature is not a base64 SHA-256 digest"


# --- GitHub ----------------------------------------------------------------------------------


def github_headers(secret: str, body: bytes = BODY) -> dict[str, str]:
    return {"X-Hub-Signature-256": "sha256=" + hmac_sha256(secret.encode(), body).hex()}


GITHUB = VerificationConfig("github", [NEW_SECRET])


def test_github_published_example_passes():
    # docs.github.com, "Validating webhook deliveries": test values.
    config = VerificationConfig("github", ["It's a Secret to Everybody"])
    headers = {
        "X-Hub-Signature-256": (
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
        )
    }
    verify_request(config, headers, b"Hello, World!", NOW)


def test_github_published_example_with_other_payload_is_refused():
    config = VerificationConfig("github", ["It's a Secret to Everybody"])
    headers = {
        "X-Hub-Signature-256": (
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
        )
    }
    assert refusal(config, headers, b"Hello, World?") == "signature does not match"


def test_github_valid_signature_passes():
    verify_request(GITHUB, github_headers(NEW_SECRET), BODY, NOW)


def test_github_uppercase_hex_digest_is_accepted():
    value = "sha256=" + hmac_sha256(NEW_SECRET.encode(), BODY).hex().upper()
    verify_request(GITHUB, {"X-Hub-Signature-256": value}, BODY, NOW)


@pytest.mark.parametrize("body", RESERIALIZED_BODIES)
def test_github_reserialized_body_is_refused(body):
    assert refusal(GITHUB, github_headers(NEW_SECRET), body) == "signature does not match"


def test_github_wrong_secret_is_refused():
    assert refusal(GITHUB, github_headers("guess")) == "signature does not match"


@pytest.mark.parametrize("signed_with", [OLD_SECRET, NEW_SECRET])
def test_github_accepts_either_secret_during_rotation(signed_with):
    config = VerificationConfig("github", [OLD_SECRET, NEW_SECRET])
    verify_request(config, github_headers(signed_with), BODY, NOW)


@pytest.mark.parametrize("name", ["x-hub-signature-256", "X-HUB-SIGNATURE-256"])
def test_github_header_name_is_case_insensitive(name):
    verify_request(GITHUB, {name: github_headers(NEW_SECRET)["X-Hub-Signature-256"]}, BODY, NOW)


def test_github_missing_header_is_refused():
    sha1 = "sha1=" + hmac.new(NEW_SECRET.encode(), BODY, hashlib.sha1).hexdigest()
    # The legacy SHA-1 header alone is not enough.
    assert refusal(GITHUB, {"X-Hub-Signature": sha1}) == "missing X-Hub-Signature-256 header"


@pytest.mark.parametrize(
    "value",
    [
        hmac_sha256(NEW_SECRET.encode(), BODY).hex(),  # no prefix
        "sha1=" + hmac_sha256(NEW_SECRET.encode(), BODY).hex(),
        "SHA256=" + hmac_sha256(NEW_SECRET.encode(), BODY).hex(),
    ],
)
def test_github_header_without_sha256_prefix_is_refused(value):
    reason = refusal(GITHUB, {"X-Hub-Signature-256": value})
    assert reason == "X-Hub-Signature-256 header must start with 'sha256='"


@pytest.mark.parametrize(
    "digest",
    [
        "",
        "zz" * 32,
        hmac_sha256(NEW_SECRET.encode(), BODY).hex()[:-2],
        hmac_sha256(NEW_SECRET.encode(), BODY).hex() + "00",
        " ".join(re.findall("..", hmac_sha256(NEW_SECRET.encode(), BODY).hex())),
        "٣" * 64,  # non-ASCII digits
    ],
)
def test_github_malformed_digest_is_refused(digest):
    reason = refusal(GITHUB, {"X-Hub-Signature-256": "sha256=" + digest})
    assert reason == "X-Hub-Signature-256 signature is not a hex SHA-256 digest"


# --- Stripe ----------------------------------------------------------------------------------

STRIPE_OLD = "whsec_oldStripeSecretValue"
STRIPE_NEW = "whsec_newStripeSecretValue"
STRIPE = VerificationConfig("stripe", [STRIPE_NEW])


def stripe_v1(secret: str, timestamp: int | str, body: bytes = BODY) -> str:
    return hmac_sha256(secret.encode(), f"{timestamp}.".encode() + body).hex()


def stripe_headers(secret: str = STRIPE_NEW, timestamp: int = NOW, body: bytes = BODY) -> dict:
    return {"Stripe-Signature": f"t={timestamp},v1={stripe_v1(secret, timestamp, body)}"}


def test_stripe_valid_signature_passes():
    verify_request(STRIPE, stripe_headers(), BODY, NOW)


def test_stripe_secret_is_used_literally_not_base64_decoded():
    # Unlike Standard Webhooks, the whole whsec_... string is the key.
    decoded_key = base64.b64decode(STRIPE_NEW.removeprefix("whsec_") + "==")
    value = hmac_sha256(decoded_key, f"{NOW}.".encode() + BODY).hex()
    assert refusal(STRIPE, {"Stripe-Signature": f"t={NOW},v1={value}"}) == (
        "signature does not match"
    )


def test_stripe_published_header_example_is_parsed_and_checked():
    # stripe.com/docs/webhooks, "Verifying signatures manually" (its secret is not published,
    # so the example can only show that the header parses and the digest is compared).
    header = (
        "t=1492774577,"
        "v1=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd,"
        "v0=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39"
    )
    reason = refusal(STRIPE, {"Stripe-Signature": header}, now=1492774577)
    assert reason == "signature does not match"


@pytest.mark.parametrize("body", RESERIALIZED_BODIES)
def test_stripe_reserialized_body_is_refused(body):
    assert refusal(STRIPE, stripe_headers(), body) == "signature does not match"


def test_stripe_wrong_secret_is_refused():
    assert refusal(STRIPE, stripe_headers("whsec_guess")) == "signature does not match"


def test_stripe_signature_over_another_timestamp_is_refused():
    value = f"t={NOW},v1={stripe_v1(STRIPE_NEW, NOW - 1)}"
    assert refusal(STRIPE, {"Stripe-Signature": value}) == "signature does not match"


@pytest.mark.parametrize("signed_with", [STRIPE_OLD, STRIPE_NEW])
def test_stripe_accepts_either_secret_during_rotation(signed_with):
    config = VerificationConfig("stripe", [STRIPE_OLD, STRIPE_NEW])
    verify_request(config, stripe_headers(signed_with), BODY, NOW)


@pytest.mark.parametrize("configured", [[STRIPE_OLD], [STRIPE_NEW]])
def test_stripe_header_with_one_v1_per_rotated_secret_passes(configured):
    header = f"t={NOW},v1={stripe_v1(STRIPE_OLD, NOW)},v1={stripe_v1(STRIPE_NEW, NOW)}"
    verify_request(
        VerificationConfig("stripe", configured), {"Stripe-Signature": header}, BODY, NOW
    )


def test_stripe_unknown_schemes_are_ignored():
    header = f"t={NOW},v0=abc,v1={stripe_v1(STRIPE_NEW, NOW)},v9=whatever,x=1"
    verify_request(STRIPE, {"Stripe-Signature": header}, BODY, NOW)


def test_stripe_only_v0_signature_is_refused_to_prevent_downgrade():
    header = f"t={NOW},v0={stripe_v1(STRIPE_NEW, NOW)}"
    assert refusal(STRIPE, {"Stripe-Signature": header}) == (
        "Stripe-Signature header has no v1 signature"
    )


def test_stripe_spaces_after_commas_are_tolerated():
    header = f"t={NOW}, v1={stripe_v1(STRIPE_NEW, NOW)}"
    verify_request(STRIPE, {"Stripe-Signature": header}, BODY, NOW)


@pytest.mark.parametrize("age", [301, 3600, NOW])
def test_stripe_stale_timestamp_is_refused(age):
    reason = refusal(STRIPE, stripe_headers(timestamp=NOW - age))
    assert reason == "timestamp outside the 300 s tolerance (too old)"


@pytest.mark.parametrize("ahead", [301, 86_400])
def test_stripe_future_timestamp_is_refused(ahead):
    reason = refusal(STRIPE, stripe_headers(timestamp=NOW + ahead))
    assert reason == "timestamp outside the 300 s tolerance (in the future)"


@pytest.mark.parametrize("offset", [-300, 300])
def test_stripe_timestamp_exactly_at_the_tolerance_passes(offset):
    verify_request(STRIPE, stripe_headers(timestamp=NOW + offset), BODY, NOW)


def test_stripe_custom_tolerance_is_used_in_the_check_and_the_reason():
    config = VerificationConfig("stripe", [STRIPE_NEW], tolerance_seconds=60)
    assert refusal(config, stripe_headers(timestamp=NOW - 61)) == (
        "timestamp outside the 60 s tolerance (too old)"
    )


@pytest.mark.parametrize("name", ["stripe-signature", "STRIPE-SIGNATURE"])
def test_stripe_header_name_is_case_insensitive(name):
    verify_request(STRIPE, {name: stripe_headers()["Stripe-Signature"]}, BODY, NOW)


def test_stripe_missing_header_is_refused():
    assert refusal(STRIPE, {"X-Hub-Signature-256": "x"}) == "missing Stripe-Signature header"


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (f"v1={'a' * 64}", "Stripe-Signature header must carry exactly one timestamp (t=)"),
        (
            f"t={NOW},t={NOW},v1={'a' * 64}",
            "Stripe-Signature header must carry exactly one timestamp (t=)",
        ),
        (f"t={NOW}", "Stripe-Signature header has no v1 signature"),
        (f"t={NOW},v1", "Stripe-Signature header is malformed"),
        (f"t={NOW},v1={'a' * 64},", "Stripe-Signature header is malformed"),
        (f"t={NOW};v1={'a' * 64}", "Stripe-Signature timestamp is not a Unix time in seconds"),
        ("garbage", "Stripe-Signature header is malformed"),
        (f"=x,t={NOW},v1={'a' * 64}", "Stripe-Signature header is malformed"),
        (f"t=abc,v1={'a' * 64}", "Stripe-Signature timestamp is not a Unix time in seconds"),
        (f"t=-5,v1={'a' * 64}", "Stripe-Signature timestamp is not a Unix time in seconds"),
        (f"t={NOW}.5,v1={'a' * 64}", "Stripe-Signature timestamp is not a Unix time in seconds"),
        (
            f"t=1_700_000_000,v1={'a' * 64}",
            "Stripe-Signature timestamp is not a Unix time in seconds",
        ),
        (
            f"t={'9' * 5000},v1={'a' * 64}",
            "Stripe-Signature timestamp is not a Unix time in seconds",
        ),
        (f"t={NOW},v1=xyz", "Stripe-Signature signature is not a hex SHA-256 digest"),
    ],
)
def test_stripe_malformed_header_is_refused(header, reason):
    assert refusal(STRIPE, {"Stripe-Signature": header}) == reason


# --- Standard Webhooks -----------------------------------------------------------------------

SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TIMESTAMP = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
SPEC_HEADERS = {
    "webhook-id": SPEC_ID,
    "webhook-timestamp": str(SPEC_TIMESTAMP),
    "webhook-signature": SPEC_SIGNATURE,
}
SPEC_CONFIG = VerificationConfig("standard-webhooks", [SPEC_SECRET])
STANDARD = VerificationConfig("standard-webhooks", [SW_NEW])


def sw_signature(key: bytes, msg_id: str = "msg_1", timestamp: int = NOW, body: bytes = BODY):
    return "v1," + b64(hmac_sha256(key, f"{msg_id}.{timestamp}.".encode() + body))


def sw_headers(key: bytes = SW_NEW_KEY, msg_id="msg_1", timestamp=NOW, body=BODY, prefix="webhook"):
    return {
        f"{prefix}-id": msg_id,
        f"{prefix}-timestamp": str(timestamp),
        f"{prefix}-signature": sw_signature(key, msg_id, timestamp, body),
    }


def test_standard_webhooks_spec_test_vector_passes():
    verify_request(SPEC_CONFIG, SPEC_HEADERS, SPEC_BODY, SPEC_TIMESTAMP)


def test_standard_webhooks_spec_test_vector_is_what_we_sign():
    signed = sign_standard_webhooks(SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY, [SPEC_SECRET])
    assert signed == SPEC_SIGNATURE


def test_standard_webhooks_spec_vector_with_changed_body_is_refused():
    assert refusal(SPEC_CONFIG, SPEC_HEADERS, b'{"test":2432232314}', SPEC_TIMESTAMP) == (
        "signature does not match"
    )


def test_standard_webhooks_secret_without_prefix_is_raw_base64():
    config = VerificationConfig("standard-webhooks", [SPEC_SECRET.removeprefix("whsec_")])
    verify_request(config, SPEC_HEADERS, SPEC_BODY, SPEC_TIMESTAMP)


def test_standard_webhooks_key_is_the_decoded_secret_not_its_text():
    headers = sw_headers(key=SW_NEW.encode())
    assert refusal(STANDARD, headers) == "signature does not match"


def test_standard_webhooks_valid_signature_passes():
    verify_request(STANDARD, sw_headers(), BODY, NOW)


def test_standard_webhooks_svix_header_names_are_accepted():
    verify_request(STANDARD, sw_headers(prefix="svix"), BODY, NOW)


@pytest.mark.parametrize("prefix", ["WEBHOOK", "Webhook", "SVIX", "Svix"])
def test_standard_webhooks_header_names_are_case_insensitive(prefix):
    verify_request(STANDARD, sw_headers(prefix=prefix), BODY, NOW)


def test_standard_webhooks_headers_of_the_two_families_are_not_mixed():
    headers = sw_headers()
    headers["svix-id"] = headers.pop("webhook-id")
    assert refusal(STANDARD, headers) == "missing webhook-id header"


@pytest.mark.parametrize("body", RESERIALIZED_BODIES)
def test_standard_webhooks_reserialized_body_is_refused(body):
    assert refusal(STANDARD, sw_headers(), body) == "signature does not match"


def test_standard_webhooks_wrong_secret_is_refused():
    assert refusal(STANDARD, sw_headers(key=b"guess")) == "signature does not match"


def test_standard_webhooks_changed_message_id_is_refused():
    headers = sw_headers()
    headers["webhook-id"] = "msg_2"
    assert refusal(STANDARD, headers) == "signature does not match"


def test_standard_webhooks_changed_timestamp_is_refused():
    headers = sw_headers()
    headers["webhook-timestamp"] = str(NOW + 1)
    assert refusal(STANDARD, headers) == "signature does not match"


@pytest.mark.parametrize("signed_with", [SW_OLD_KEY, SW_NEW_KEY])
def test_standard_webhooks_accepts_either_secret_during_rotation(signed_with):
    config = VerificationConfig("standard-webhooks", [SW_OLD, SW_NEW])
    verify_request(config, sw_headers(key=signed_with), BODY, NOW)


@pytest.mark.parametrize("configured", [SW_OLD, SW_NEW])
def test_standard_webhooks_header_with_one_entry_per_rotated_secret_passes(configured):
    headers = sw_headers()
    headers["webhook-signature"] = f"{sw_signature(SW_OLD_KEY)} {sw_signature(SW_NEW_KEY)}"
    verify_request(VerificationConfig("standard-webhooks", [configured]), headers, BODY, NOW)


def test_standard_webhooks_non_v1_entries_are_ignored():
    headers = sw_headers()
    headers["webhook-signature"] = (
        f"v1a,{b64(bytes(64))} {headers['webhook-signature']} v2,{b64(bytes(32))}"
    )
    verify_request(STANDARD, headers, BODY, NOW)


def test_standard_webhooks_v1a_signature_alone_is_refused():
    headers = sw_headers()
    headers["webhook-signature"] = "v1a," + b64(hmac_sha256(SW_NEW_KEY, b"x") * 2)
    assert refusal(STANDARD, headers) == "webhook-signature header has no v1 signature"


@pytest.mark.parametrize("age", [301, 86_400])
def test_standard_webhooks_stale_timestamp_is_refused(age):
    reason = refusal(STANDARD, sw_headers(timestamp=NOW - age))
    assert reason == "timestamp outside the 300 s tolerance (too old)"


@pytest.mark.parametrize("ahead", [301, 86_400])
def test_standard_webhooks_future_timestamp_is_refused(ahead):
    reason = refusal(STANDARD, sw_headers(timestamp=NOW + ahead))
    assert reason == "timestamp outside the 300 s tolerance (in the future)"


@pytest.mark.parametrize("offset", [-300, 300])
def test_standard_webhooks_timestamp_exactly_at_the_tolerance_passes(offset):
    verify_request(STANDARD, sw_headers(timestamp=NOW + offset), BODY, NOW)


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_standard_webhooks_missing_header_is_refused(missing):
    headers = sw_headers()
    del headers[missing]
    assert refusal(STANDARD, headers) == f"missing {missing} header"


@pytest.mark.parametrize("missing", ["svix-id", "svix-timestamp"])
def test_standard_webhooks_missing_svix_header_is_refused(missing):
    headers = sw_headers(prefix="svix")
    del headers[missing]
    assert refusal(STANDARD, headers) == f"missing {missing} header"


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("webhook-timestamp", "soon", "webhook-timestamp header is not a Unix time in seconds"),
        (
            "webhook-timestamp",
            f"{NOW}.0",
            "webhook-timestamp header is not a Unix time in seconds",
        ),
        (
            "webhook-timestamp",
            f"-{NOW}",
            "webhook-timestamp header is not a Unix time in seconds",
        ),
        (
            "webhook-timestamp",
            "1" * 40,
            "webhook-timestamp header is not a Unix time in seconds",
        ),
        ("webhook-signature", "v1", "webhook-signature header is malformed"),
        ("webhook-signature", ",abc", "webhook-signature header is malformed"),
        (
            "webhook-signature",
            "v1,not-base64!",
            "webhook-signature signature is not a base64 SHA-256 digest",
        ),
        (
            "webhook-signature",
            "v1," + b64(b"short"),
            "webhook-signature signature is not a base64 SHA-256 digest",
        ),
        ("webhook-id", "msg 1", "webhook-id header must be visible ASCII"),
        ("webhook-id", "msg_é", "webhook-id header must be visible ASCII"),
    ],
)
def test_standard_webhooks_malformed_header_is_refused(field, value, reason):
    headers = sw_headers()
    headers[field] = value
    assert refusal(STANDARD, headers) == reason


def test_standard_webhooks_undecodable_secret_is_skipped_during_rotation():
    config = VerificationConfig("standard-webhooks", ["whsec_not base64!", SW_NEW])
    verify_request(config, sw_headers(), BODY, NOW)


def test_standard_webhooks_only_undecodable_secrets_refuse():
    config = VerificationConfig("standard-webhooks", ["whsec_not base64!", "whsec_"])
    assert refusal(config, sw_headers()) == "no usable secret configured"


def test_standard_webhooks_key_decodes_with_and_without_prefix():
    assert standard_webhooks_key(SW_OLD) == SW_OLD_KEY
    assert standard_webhooks_key(SW_OLD.removeprefix("whsec_")) == SW_OLD_KEY


@pytest.mark.parametrize("secret", ["whsec_", "", "whsec_not base64!", "whsec_abc", "whsec_é"])
def test_standard_webhooks_key_rejects_bad_base64(secret):
    with pytest.raises(ValueError):
        standard_webhooks_key(secret)


def test_sign_standard_webhooks_emits_one_entry_per_secret():
    signed = sign_standard_webhooks("msg_9", NOW, BODY, [SW_OLD, SW_NEW])
    assert signed.split(" ") == [
        sw_signature(SW_OLD_KEY, "msg_9"),
        sw_signature(SW_NEW_KEY, "msg_9"),
    ]


@pytest.mark.parametrize("configured", [SW_OLD, SW_NEW])
def test_signed_delivery_verifies_with_either_rotated_secret(configured):
    headers = {
        "webhook-id": "msg_9",
        "webhook-timestamp": str(NOW),
        "webhook-signature": sign_standard_webhooks("msg_9", NOW, BODY, [SW_OLD, SW_NEW]),
    }
    verify_request(VerificationConfig("standard-webhooks", [configured]), headers, BODY, NOW)


@pytest.mark.parametrize("secrets", [[], SW_NEW, ["whsec_not base64!"]])
def test_sign_standard_webhooks_refuses_unusable_secrets(secrets):
    with pytest.raises(ValueError):
        sign_standard_webhooks("msg_9", NOW, BODY, secrets)


# --- generic HMAC-SHA256 ---------------------------------------------------------------------

GENERIC_HEX = VerificationConfig("hmac-sha256", [NEW_SECRET])
GENERIC_B64 = VerificationConfig(
    "hmac-sha256", [NEW_SECRET], hmac_header="X-Acme-Signature", hmac_encoding="base64"
)
GENERIC_PREFIXED = VerificationConfig("hmac-sha256", [NEW_SECRET], hmac_prefix="sha256=")


def generic_hex(secret: str = NEW_SECRET, body: bytes = BODY) -> str:
    return hmac_sha256(secret.encode(), body).hex()


def test_generic_hex_signature_in_default_header_passes():
    verify_request(GENERIC_HEX, {"X-Signature": generic_hex()}, BODY, NOW)


def test_generic_base64_signature_in_configured_header_passes():
    value = b64(hmac_sha256(NEW_SECRET.encode(), BODY))
    verify_request(GENERIC_B64, {"x-acme-signature": value}, BODY, NOW)


def test_generic_configured_prefix_passes():
    verify_request(GENERIC_PREFIXED, {"X-Signature": "sha256=" + generic_hex()}, BODY, NOW)


def test_generic_configured_prefix_must_be_present():
    assert refusal(GENERIC_PREFIXED, {"X-Signature": generic_hex()}) == (
        "X-Signature header must start with 'sha256='"
    )


def test_generic_unconfigured_prefix_makes_the_digest_malformed():
    assert refusal(GENERIC_HEX, {"X-Signature": "sha256=" + generic_hex()}) == (
        "X-Signature signature is not a hex SHA-256 digest"
    )


def test_generic_hex_digest_where_base64_is_configured_is_refused():
    assert refusal(GENERIC_B64, {"X-Acme-Signature": generic_hex()}) == (
        "X-Acme-Signature signature is not a base64 SHA-256 digest"
    )


@pytest.mark.parametrize("body", RESERIALIZED_BODIES)
def test_generic_reserialized_body_is_refused(body):
    assert refusal(GENERIC_HEX, {"X-Signature": generic_hex()}, body) == "signature does not match"


def test_generic_wrong_secret_is_refused():
    assert refusal(GENERIC_HEX, {"X-Signature": generic_hex("guess")}) == (
        "signature does not match"
    )


@pytest.mark.parametrize("signed_with", [OLD_SECRET, NEW_SECRET])
def test_generic_accepts_either_secret_during_rotation(signed_with):
    config = VerificationConfig("hmac-sha256", [OLD_SECRET, NEW_SECRET])
    verify_request(config, {"X-Signature": generic_hex(signed_with)}, BODY, NOW)


@pytest.mark.parametrize("name", ["x-signature", "X-SIGNATURE"])
def test_generic_header_name_is_case_insensitive(name):
    verify_request(GENERIC_HEX, {name: generic_hex()}, BODY, NOW)


def test_generic_signature_in_another_header_is_missing():
    assert refusal(GENERIC_B64, {"X-Signature": generic_hex()}) == (
        "missing X-Acme-Signature header"
    )


def test_generic_blank_configured_header_refuses():
    config = VerificationConfig("hmac-sha256", [NEW_SECRET], hmac_header="")
    assert refusal(config, {"X-Signature": generic_hex()}) == "no signature header configured"


# --- headers and bodies as the view hands them over ------------------------------------------


def test_django_request_headers_and_raw_body_verify():
    request = RequestFactory().post(
        "/ingest/shop/",
        data=BODY,
        content_type="application/json",
        headers=github_headers(NEW_SECRET),
    )
    verify_request(GITHUB, request.headers, request.body, NOW)


def test_django_header_mapping_serves_standard_webhooks_names():
    meta = {f"HTTP_{name.upper().replace('-', '_')}": value for name, value in sw_headers().items()}
    verify_request(STANDARD, HttpHeaders(meta), BODY, NOW)


def test_memoryview_body_verifies():
    verify_request(GITHUB, github_headers(NEW_SECRET), memoryview(BODY), NOW)


def test_same_header_in_two_casings_with_different_values_is_refused():
    good = github_headers(NEW_SECRET)["X-Hub-Signature-256"]
    headers = {"X-Hub-Signature-256": good, "x-hub-signature-256": "sha256=" + "0" * 64}
    assert refusal(GITHUB, headers) == "conflicting X-Hub-Signature-256 headers"


def test_same_header_in_two_casings_with_one_value_passes():
    good = github_headers(NEW_SECRET)["X-Hub-Signature-256"]
    verify_request(GITHUB, {"X-Hub-Signature-256": good, "x-hub-signature-256": good}, BODY, NOW)


def test_non_text_header_value_is_refused():
    assert refusal(GITHUB, {"X-Hub-Signature-256": b"sha256=00"}) == (
        "X-Hub-Signature-256 header is not text"
    )


def test_reasons_never_echo_the_secret_or_the_expected_signature():
    secret = "s3cr3t-value"
    expected_hex = hmac_sha256(secret.encode(), BODY).hex()
    expected_b64 = b64(hmac_sha256(secret.encode(), BODY))
    cases = [
        (VerificationConfig("github", [secret]), {"X-Hub-Signature-256": "sha256=" + "0" * 64}),
        (VerificationConfig("shopify", [secret]), {"X-Shopify-Hmac-Sha256": b64(bytes(32))}),
        (VerificationConfig("hmac-sha256", [secret]), {"X-Signature": "0" * 64}),
        (VerificationConfig("stripe", [secret]), {"Stripe-Signature": f"t={NOW},v1={'0' * 64}"}),
    ]
    for config, headers in cases:
        reason = refusal(config, headers)
        assert secret not in reason
        assert expected_hex not in reason
        assert expected_b64 not in reason


# --- fuzzing: bad input only ever raises SignatureError --------------------------------------

SIGNING_SCHEMES = ["shopify", "github", "stripe", "standard-webhooks", "hmac-sha256"]
KNOWN_HEADERS = [
    "X-Shopify-Hmac-Sha256",
    "X-Hub-Signature-256",
    "Stripe-Signature",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "svix-id",
    "svix-timestamp",
    "svix-signature",
    "X-Signature",
]
header_names = st.one_of(
    st.sampled_from(KNOWN_HEADERS).flatmap(
        lambda name: st.sampled_from([name, name.lower(), name.upper()])
    ),
    st.text(max_size=30),
)
# Random text, and text shaped like each header so parsing gets past its first check.
header_values = st.one_of(
    st.text(),
    st.from_regex(r"sha256=[0-9a-fA-F ]{0,70}", fullmatch=True),
    st.from_regex(r"t=-?[0-9]{0,12}(,v[0-9]=[0-9a-f]{0,66})*,?", fullmatch=True),
    st.from_regex(r"(v1a?,[A-Za-z0-9+/=]{0,48} ?){0,3}", fullmatch=True),
    st.integers(0, 3_000_000_000).map(str),
    st.binary(max_size=50).map(lambda raw: base64.b64encode(raw).decode()),
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    scheme=st.sampled_from(SIGNING_SCHEMES),
    secrets=st.lists(st.one_of(st.text(max_size=20), st.just(SW_NEW)), max_size=3),
    headers=st.dictionaries(header_names, header_values, max_size=8),
    body=st.binary(max_size=200),
    now=st.integers(0, 4_000_000_000),
    prefix=st.sampled_from(["", "sha256="]),
    encoding=st.sampled_from(["hex", "base64"]),
)
def test_random_requests_are_refused_with_signature_error_only(
    scheme, secrets, headers, body, now, prefix, encoding
):
    config = VerificationConfig(scheme, secrets, hmac_prefix=prefix, hmac_encoding=encoding)
    with pytest.raises(SignatureError):
        verify_request(config, headers, body, now)
