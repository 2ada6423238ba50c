"""Verifying inbound webhook signatures, and signing our own deliveries (Standard Webhooks).

Pure functions: no Django models, no I/O, and the clock is passed in, so every path is testable.

Ground rules, each for a reason:
- The MAC is computed over the raw body bytes exactly as received. Providers sign bytes, and
  any re-serialization (key order, whitespace, unicode escapes) changes them.
- Received signatures are decoded to bytes and compared with `hmac.compare_digest` on bytes:
  constant time, and unlike comparing `str`, it cannot raise on non-ASCII input.
- Every refusal is a `SignatureError` whose message names the header and the problem but never
  echoes a secret, an expected signature or the received value, so it is safe in a 401 body.
- Several secrets may be active during a rotation; any one of them matching is enough.
"""

import base64
import binascii
import functools
import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

SCHEMES = frozenset({"none", "shopify", "github", "stripe", "standard-webhooks", "hmac-sha256"})
ENCODINGS = frozenset({"hex", "base64"})

SHOPIFY_HEADER = "X-Shopify-Hmac-Sha256"
GITHUB_HEADER = "X-Hub-Signature-256"
GITHUB_PREFIX = "sha256="
STRIPE_HEADER = "Stripe-Signature"
# Standard Webhooks names first; Svix (which wrote the spec) still sends its own prefix.
STANDARD_HEADER_FAMILIES = ("webhook", "svix")
STANDARD_SECRET_PREFIX = "whsec_"  # noqa: S105 (a format marker, not a secret)

_DIGEST_SIZE = hashlib.sha256().digest_size
# ASCII-only on purpose: int() would also accept "1_000", "+5" and non-ASCII digits, and a
# length bound keeps int() away from its huge-number limit (which raises ValueError).
_TIMESTAMP = re.compile(r"[0-9]{1,15}", re.ASCII)
_HEX_DIGEST = re.compile(r"[0-9a-fA-F]{64}", re.ASCII)
# Visible ASCII: the id is part of the signed bytes, so anything a header cannot carry verbatim
# (and anything whose bytes would depend on how the server decoded the header) is refused.
_MESSAGE_ID = re.compile(r"[\x21-\x7e]+", re.ASCII)


class SignatureError(Exception):
    """Why a request was refused; `str(err)` is a short reason safe to return in a 401 body
    (never echoes a secret or an expected signature)."""


@dataclass(frozen=True)
class VerificationConfig:
    """How one source signs its requests.

    `secrets` is kept out of `repr` so that a config in a log line or a traceback's locals does
    not leak the secrets. Blank secrets are ignored rather than used: an empty HMAC key is one
    anybody can sign with.
    """

    scheme: str  # "none" | "shopify" | "github" | "stripe" | "standard-webhooks" | "hmac-sha256"
    secrets: Sequence[str] = field(repr=False)
    tolerance_seconds: int = 300
    hmac_header: str = "X-Signature"  # generic HMAC: header holding the signature
    hmac_encoding: str = "hex"  # "hex" | "base64"
    hmac_prefix: str = ""  # e.g. "sha256="

    def __post_init__(self) -> None:
        # These are programming errors (the model's choices rule them out), so they fail loudly
        # at construction instead of turning into a 401 that blames the sender.
        if self.scheme not in SCHEMES:
            raise ValueError(f"unknown signature scheme {self.scheme!r}")
        if self.hmac_encoding not in ENCODINGS:
            raise ValueError(f"unknown HMAC encoding {self.hmac_encoding!r}")
        if self.tolerance_seconds < 0:
            raise ValueError("tolerance_seconds must not be negative")
        if isinstance(self.secrets, str | bytes):
            # A bare string is a Sequence[str] too: each character would become a secret.
            raise TypeError("secrets must be a sequence of strings, not a single string")
        if not all(isinstance(secret, str) for secret in self.secrets):
            raise TypeError("every secret must be a string")
        # A tuple, so the frozen config cannot be changed through a list it was given.
        object.__setattr__(self, "secrets", tuple(self.secrets))


def verify_request(
    config: VerificationConfig, headers: Mapping[str, str], body: bytes, now: float
) -> None:
    """Return if the request is authentic under `config`, else raise SignatureError.

    `headers` may be a plain dict in any casing or Django's `request.headers`; `now` is the
    current Unix time (passed in so tests and replays can pin the clock).
    """
    if not isinstance(body, bytes | bytearray | memoryview):
        raise TypeError("body must be the raw request bytes")
    if config.scheme == "none":
        return
    if config.scheme == "shopify":
        _verify_shopify(config, headers, body)
    elif config.scheme == "github":
        _verify_github(config, headers, body)
    elif config.scheme == "stripe":
        _verify_stripe(config, headers, body, now)
    elif config.scheme == "standard-webhooks":
        _verify_standard_webhooks(config, headers, body, now)
    else:
        _verify_generic_hmac(config, headers, body)


def standard_webhooks_key(secret: str) -> bytes:
    """The HMAC key inside a Standard Webhooks secret: `whsec_<base64>` (or bare base64).

    Raises ValueError for anything that is not strict base64 of a non-empty key, so callers can
    also use it to validate a secret when it is saved.
    """
    encoded = secret.removeprefix(STANDARD_SECRET_PREFIX)
    try:
        key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as err:  # ValueError: non-ASCII characters
        raise ValueError("secret is not valid base64 after the whsec_ prefix") from err
    if not key:
        raise ValueError("secret holds an empty key")
    return key


def sign_standard_webhooks(msg_id: str, timestamp: int, body: bytes, secrets: Sequence[str]) -> str:
    """The `webhook-signature` value for one of our deliveries: one `v1,` entry per secret, so
    a receiver that knows either the old or the new secret accepts it during a rotation."""
    if isinstance(secrets, str) or not secrets:
        raise ValueError("signing needs a non-empty sequence of secrets")
    message = f"{msg_id}.{timestamp}.".encode() + body
    # hmac.digest: OpenSSL's one-shot HMAC, without building an HMAC object per delivery.
    return " ".join(
        f"v1,{base64.b64encode(hmac.digest(_signing_key(secret), message, 'sha256')).decode()}"
        for secret in secrets
    )


@functools.lru_cache(maxsize=1024)
def _signing_key(secret: str) -> bytes:
    # Decoded once per secret, not per delivery: a worker signs with the same few all day.
    return standard_webhooks_key(secret)


# --- schemes ---------------------------------------------------------------------------------


def _verify_shopify(config: VerificationConfig, headers: Mapping[str, str], body: bytes) -> None:
    received = _decode_base64(_require_header(headers, SHOPIFY_HEADER), SHOPIFY_HEADER)
    _check_any_match(_utf8_keys(config), b"", body, [received])


def _verify_github(config: VerificationConfig, headers: Mapping[str, str], body: bytes) -> None:
    value = _require_header(headers, GITHUB_HEADER)
    if not value.startswith(GITHUB_PREFIX):
        raise SignatureError(f"{GITHUB_HEADER} header must start with {GITHUB_PREFIX!r}")
    received = _decode_hex(value[len(GITHUB_PREFIX) :], GITHUB_HEADER)
    _check_any_match(_utf8_keys(config), b"", body, [received])


def _verify_stripe(
    config: VerificationConfig, headers: Mapping[str, str], body: bytes, now: float
) -> None:
    timestamp, signatures = _parse_stripe_header(_require_header(headers, STRIPE_HEADER))
    keys = _utf8_keys(config)
    # The timestamp is checked before any MAC work: a replayed request costs us nothing more.
    _check_tolerance(timestamp, now, config.tolerance_seconds)
    _check_any_match(keys, f"{timestamp}.".encode(), body, signatures)


def _parse_stripe_header(value: str) -> tuple[str, list[bytes]]:
    """`t=<unix>,v1=<hex>[,v1=<hex>...]` plus schemes we ignore (v0 is Stripe's test-mode fake;
    only v1 is trusted, so nobody can downgrade us to a weaker scheme)."""
    timestamps: list[str] = []
    signatures: list[bytes] = []
    for element in value.split(","):
        name, sep, item = element.strip().partition("=")
        if not sep or not name:
            raise SignatureError(f"{STRIPE_HEADER} header is malformed")
        if name == "t":
            timestamps.append(item.strip())
        elif name == "v1":
            signatures.append(_decode_hex(item.strip(), STRIPE_HEADER))
    if len(timestamps) != 1:
        raise SignatureError(f"{STRIPE_HEADER} header must carry exactly one timestamp (t=)")
    timestamp = _parse_timestamp(timestamps[0], f"{STRIPE_HEADER} timestamp")
    if not signatures:
        raise SignatureError(f"{STRIPE_HEADER} header has no v1 signature")
    return timestamp, signatures


def _verify_standard_webhooks(
    config: VerificationConfig, headers: Mapping[str, str], body: bytes, now: float
) -> None:
    family = _standard_header_family(headers)
    id_header, timestamp_header, signature_header = (
        f"{family}-id",
        f"{family}-timestamp",
        f"{family}-signature",
    )
    msg_id = _require_header(headers, id_header)
    if not _MESSAGE_ID.fullmatch(msg_id):
        raise SignatureError(f"{id_header} header must be visible ASCII")
    timestamp = _parse_timestamp(
        _require_header(headers, timestamp_header), f"{timestamp_header} header"
    )
    signatures = _parse_standard_signatures(
        _require_header(headers, signature_header), signature_header
    )
    keys = _standard_keys(config)
    # Both directions matter: a timestamp far in the future would let a captured request be
    # replayed until that time arrives.
    _check_tolerance(timestamp, now, config.tolerance_seconds)
    _check_any_match(keys, f"{msg_id}.{timestamp}.".encode(), body, signatures)


def _standard_header_family(headers: Mapping[str, str]) -> str:
    """Use one family's three headers together; mixing `webhook-id` with `svix-signature`
    would be verifying a request nobody sent."""
    for family in STANDARD_HEADER_FAMILIES:
        if _header(headers, f"{family}-signature") is not None:
            return family
    return STANDARD_HEADER_FAMILIES[0]


def _parse_standard_signatures(value: str, header: str) -> list[bytes]:
    """Space-separated `<version>,<base64>` entries. Versions other than v1 (such as `v1a`,
    asymmetric signatures) are skipped, so a sender adding them does not break us."""
    signatures: list[bytes] = []
    for entry in value.split():
        version, sep, encoded = entry.partition(",")
        if not sep or not version:
            raise SignatureError(f"{header} header is malformed")
        if version == "v1":
            signatures.append(_decode_base64(encoded, header))
    if not signatures:
        raise SignatureError(f"{header} header has no v1 signature")
    return signatures


def _verify_generic_hmac(
    config: VerificationConfig, headers: Mapping[str, str], body: bytes
) -> None:
    name = config.hmac_header.strip()
    if not name:
        raise SignatureError("no signature header configured")
    value = _require_header(headers, name)
    if config.hmac_prefix:
        if not value.startswith(config.hmac_prefix):
            raise SignatureError(f"{name} header must start with {config.hmac_prefix!r}")
        value = value[len(config.hmac_prefix) :]
    if config.hmac_encoding == "hex":
        received = _decode_hex(value, name)
    else:
        received = _decode_base64(value, name)
    _check_any_match(_utf8_keys(config), b"", body, [received])


# --- helpers ---------------------------------------------------------------------------------


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """The header's value matched case-insensitively, or None when absent.

    Works for a plain dict and for Django's `request.headers` alike by scanning the items; two
    spellings of one name with different values are refused rather than picking one.
    """
    wanted = name.lower()
    found: str | None = None
    for key, value in headers.items():
        if not isinstance(key, str) or key.lower() != wanted:
            continue
        if not isinstance(value, str):
            raise SignatureError(f"{name} header is not text")
        if found is not None and found != value:
            raise SignatureError(f"conflicting {name} headers")
        found = value
    return found


def _require_header(headers: Mapping[str, str], name: str) -> str:
    value = _header(headers, name)
    if value is None or not value.strip():
        raise SignatureError(f"missing {name} header")
    # Servers strip surrounding whitespace already; a hand-built dict may not have.
    return value.strip()


def _parse_timestamp(text: str, subject: str) -> str:
    """Digits only, returned as sent: the sender signed these exact characters."""
    if not _TIMESTAMP.fullmatch(text):
        raise SignatureError(f"{subject} is not a Unix time in seconds")
    return text


def _check_tolerance(timestamp: str, now: float, tolerance: int) -> None:
    age = now - int(timestamp)
    if age > tolerance:
        raise SignatureError(f"timestamp outside the {tolerance} s tolerance (too old)")
    if age < -tolerance:
        raise SignatureError(f"timestamp outside the {tolerance} s tolerance (in the future)")


def _decode_hex(text: str, header: str) -> bytes:
    # A regex rather than bytes.fromhex, which also accepts embedded whitespace.
    if not _HEX_DIGEST.fullmatch(text):
        raise SignatureError(f"{header} signature is not a hex SHA-256 digest")
    return bytes.fromhex(text)


def _decode_base64(text: str, header: str) -> bytes:
    try:
        decoded = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):  # ValueError: non-ASCII characters
        decoded = b""
    if len(decoded) != _DIGEST_SIZE:
        raise SignatureError(f"{header} signature is not a base64 SHA-256 digest")
    return decoded


def _utf8_keys(config: VerificationConfig) -> list[bytes]:
    """Shopify, GitHub, Stripe and generic HMAC use the secret text itself as the key
    (Stripe's `whsec_...` included: unlike Standard Webhooks it is not decoded)."""
    keys = [secret.encode() for secret in config.secrets if secret]
    if not keys:
        raise SignatureError("no active secret configured")
    return keys


def _standard_keys(config: VerificationConfig) -> list[bytes]:
    active = [secret for secret in config.secrets if secret]
    if not active:
        raise SignatureError("no active secret configured")
    keys: list[bytes] = []
    for secret in active:
        try:
            keys.append(standard_webhooks_key(secret))
        except ValueError:
            # An undecodable secret can match nothing; skipping it keeps the other secret of a
            # rotation working. Validate with standard_webhooks_key when secrets are saved.
            continue
    if not keys:
        raise SignatureError("no usable secret configured")
    return keys


def _mac(key: bytes, prefix: bytes, body: bytes) -> bytes:
    # Two update() calls instead of prefix + body: no copy of a large body, and any
    # bytes-like body (memoryview included) works.
    mac = hmac.new(key, prefix, hashlib.sha256)
    mac.update(body)
    return mac.digest()


def _check_any_match(
    keys: Sequence[bytes], prefix: bytes, body: bytes, received: Sequence[bytes]
) -> None:
    expected = [_mac(key, prefix, body) for key in keys]
    # Every pair is compared (no early exit), so timing does not reveal which secret matched.
    matched = False
    for digest in expected:
        for candidate in received:
            matched |= hmac.compare_digest(digest, candidate)
    if not matched:
        raise SignatureError("signature does not match")
