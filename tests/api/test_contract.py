"""The API against its own OpenAPI document, by schemathesis: for every operation the
document lists, generated requests (valid and invalid) go through the production WSGI
application with an operator's read-write token, and every check is on: never a 500, a
status, media type, body and headers the document describes, invalid input refused,
valid input accepted, and no answer without a valid token.

The database holds a tenant "acme" with an endpoint, events, deliveries (one dead),
attempts, a replay and a catalogued event type, and the fuzzer puts their real keys and
ids into the path some of the time, so that requests get past "not found" to the
operation's own checks and successes. Every endpoint URL a request carries is pointed at
127.0.0.1 (port 9, where nothing listens) before it is sent: a generated host is never
looked up, let alone called, and with loopback allowed the endpoints can be created.

The same checks from the command line, against `make run`, for a look at schemathesis'
own report (without this file's hooks: expect the 422s SEMANTIC_FIELDS explains, and
404s for most paths, whose keys and ids are made up):

    .venv/bin/st run http://127.0.0.1:8000/api/v1/openapi.json --checks all \\
        --header "Authorization: Bearer $TOKEN" --max-examples 20
"""

import hashlib
import json
import os
import re
import secrets
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
import schemathesis
from drf_spectacular.validation import validate_schema
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.core.parameters import ParameterLocation
from schemathesis.openapi.checks import RejectedPositiveData

from api.idempotency import HEADER as IDEMPOTENCY_KEY
from api.idempotency import MAX_KEY_CHARS
from project.machine_doors import get_wsgi_application
from tenants.models import AuditEntry
from tests.api.helpers import Api, operator_token
from tests.api.world import make_catalogue, make_world
from webhooks.models import ApiToken, hash_token

pytestmark = pytest.mark.django_db(transaction=True)

# The operator token the run sends, made anew for each test (the database is emptied
# between them) with this value, which the schema's auth needs before any test starts.
TOKEN = "whp_" + secrets.token_urlsafe(32)
CONFIG = schemathesis.Config.from_dict({"auth": {"openapi": {"bearerAuth": {"bearer": TOKEN}}}})
APP = get_wsgi_application()
SCHEMA = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", APP, config=CONFIG)
# Per operation: about half a minute in all on SQLite. CONTRACT_MAX_EXAMPLES=200 for a
# longer hunt.
MAX_EXAMPLES = int(os.environ.get("CONTRACT_MAX_EXAMPLES", "25"))
LOOPBACK = "127.0.0.1:9"

# The real key and ids of the fixture's rows, by path parameter and by body property
# name; filled per test.
REAL: dict[str, object] = {}
REAL_IN_BODY: dict[str, object] = {}

# 422s for requests the document calls valid, where the rule is one no JSON Schema can
# state: it compares fields with each other or with the database, or it is a validator
# richer than a schema keyword. Each operation lists the fields such a rule may name; a
# 422 naming any other field is still a failure (the document should have said it).
SEMANTIC_FIELDS: dict[str, set[str]] = {
    # "Printable" below is Python's str.isprintable(), a set of Unicode categories that no
    # pattern in the document's regex dialect names. The tenant key: printable, no slash.
    "tenants_create": {"key"},
    # The URL: Django's URL validator (stricter than format: uri) and the SSRF guard.
    # Event types: printable names, no commas, no NUL. Retries in flight: at most
    # max_in_flight.
    "endpoints_create": {"url", "event_types", "retry_max_in_flight"},
    "endpoints_update": {"url", "event_types", "retry_max_in_flight"},
    # Not before 1970, until after since, and the endpoint one of the tenant's.
    "replays_create": {"since", "until", "endpoint_id"},
    "replays_preview": {"since", "until", "endpoint_id"},
    # The name's characters; a schema that compiles; an example that matches it; and
    # enforce_schema only with a schema.
    "event_types_create": {"name", "schema", "example", "enforce_schema"},
    "event_types_update": {"schema", "example", "enforce_schema"},
    # Who the visitor is, in printable text.
    "portal_links_create": {"visitor"},
}


def _valid_in(case, location: ParameterLocation) -> bool:
    """Whether the case's `location` was generated valid: a value put there then keeps
    the case what it claims to be (a case made invalid elsewhere stays invalid)."""
    meta = case._meta
    part = meta.components.get(location) if meta is not None else None
    return part is None or part.mode.is_positive


def _fit_for_a_valid_case(case) -> None:
    """What a valid request needs beyond its schema, set in valid components only."""
    key = case.headers.get(IDEMPOTENCY_KEY) if case.headers else None
    if key and _valid_in(case, ParameterLocation.HEADER):
        # One key with two different bodies is a 422 by design; hypothesis repeats short
        # keys across examples. A key salted with the request's body keeps the same
        # request on the same key (the first answer again) and another on another.
        sent = json.dumps([case.path_parameters, case.body], sort_keys=True, default=str)
        salt = hashlib.sha256(sent.encode()).hexdigest()[:16]
        case.headers = {**case.headers, IDEMPOTENCY_KEY: f"{key[: MAX_KEY_CHARS - 17]}-{salt}"}


@SCHEMA.hook
def map_case(context, case):
    """Every case, in every phase: what a valid request needs beyond its schema."""
    _fit_for_a_valid_case(case)
    return case


@SCHEMA.hook
def flatmap_case(context, case):
    """The key and ids of rows that exist, in place of generated ones: in the path, and
    for a body's endpoint_id; all of them half of the time, else each by a coin. Not in a
    case whose headers are the invalid part: the run's own token goes with every request,
    so a case "without a token" that named a real row would be answered."""
    valid = _valid_in(case, ParameterLocation.PATH) and _valid_in(case, ParameterLocation.HEADER)
    path = [name for name in case.path_parameters if name in REAL] if valid else []
    body = []
    if isinstance(case.body, dict) and _valid_in(case, ParameterLocation.BODY):
        body = [name for name in case.body if name in REAL_IN_BODY]
    slots = len(path) + len(body)
    if not slots:
        return st.just(case)

    def with_real(chosen: list[bool]):
        if any(chosen[: len(path)]):
            real = {name: REAL[name] for name, yes in zip(path, chosen, strict=False) if yes}
            case.path_parameters = {**case.path_parameters, **real}
        if any(chosen[len(path) :]):
            picked = zip(body, chosen[len(path) :], strict=True)
            case.body = {**case.body, **{name: REAL_IN_BODY[name] for name, yes in picked if yes}}
        _fit_for_a_valid_case(case)
        return case

    coins = st.lists(st.booleans(), min_size=slots, max_size=slots)
    return st.one_of(st.just([True] * slots), coins).map(with_real)


@SCHEMA.hook
def filter_failure(context, failure, case, response) -> bool:
    """Keep every failure but a valid request's 422 from a rule in SEMANTIC_FIELDS."""
    if not isinstance(failure, RejectedPositiveData) or response.status_code != 422:
        return True
    allowed = SEMANTIC_FIELDS.get(case.operation.schema.get_operation_id(case.operation), set())
    try:
        named = {_root(error["field"]) for error in json.loads(response.content)["errors"]}
    except (ValueError, KeyError, TypeError):
        return True
    return not named or not named <= allowed


def _root(field: str) -> str:
    """The body property an error names: "event_types" for "event_types.2"."""
    return re.split(r"[.\[]", field, maxsplit=1)[0]


def _loopback(url: str) -> str:
    """`url` with its scheme and host replaced: http to 127.0.0.1:9, path kept."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return f"http://{LOOPBACK}/"
    return urlunsplit(("http", LOOPBACK, parts.path, parts.query, ""))


def _urls_to_loopback(body: object) -> object:
    if isinstance(body, dict):
        return {
            name: _loopback(value) if name == "url" and isinstance(value, str) else value
            for name, value in ((name, _urls_to_loopback(value)) for name, value in body.items())
        }
    if isinstance(body, list):
        return [_urls_to_loopback(item) for item in body]
    return body


@pytest.fixture
def contract_world(settings) -> Iterator[None]:
    """The rows the requests can reach, and the operator token they carry."""
    # Loopback URLs pass, so endpoints get created and the 201 is checked too. The fuzzer
    # makes more requests a minute than the per-token budget allows, and a 429 would
    # stop it short of the operations it is here to reach: no budget in this test.
    settings.ALLOW_PRIVATE_DESTINATIONS = True
    settings.API_RATE_LIMIT_PER_MINUTE = 0
    ApiToken.objects.create(
        name="contract", prefix=TOKEN[:8], token_hash=hash_token(TOKEN), tenant=None
    )
    catalogued = make_catalogue()
    world = make_world("acme")
    REAL.clear()
    REAL_IN_BODY.clear()
    # Text, as a path carries them: schemathesis checks a value put in the path against
    # the parameter's schema (a string), and an int there would make the case invalid.
    REAL.update(
        key=world.tenant.key,
        endpoint_id=str(world.endpoint.pk),
        event_id=world.event.pk,
        delivery_id=world.dead.pk,
        replay_id=str(world.replay.pk),
        name=catalogued.name,
    )
    REAL_IN_BODY.update(endpoint_id=world.endpoint.pk)
    yield
    REAL.clear()
    REAL_IN_BODY.clear()


@pytest.mark.slow
@SCHEMA.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
def test_every_answer_is_one_the_document_describes(case, contract_world) -> None:
    if isinstance(case.body, dict | list):
        loopback = _urls_to_loopback(case.body)
        if loopback != case.body:
            case.body = loopback
    case.call_and_validate()


def test_the_document_is_valid_openapi_3() -> None:
    answer = Api(None).get("/api/v1/openapi.json")
    assert answer.status_code == 200
    document = answer.json()
    assert document["openapi"].startswith("3.")
    validate_schema(document)  # drf-spectacular's: the OpenAPI 3.0 JSON Schema
    # Every operation says what a token may get back besides success.
    for path, item in document["paths"].items():
        for method, operation in item.items():
            assert {"401", "403", "429"} <= set(operation["responses"]), f"{method} {path}"


def test_a_digit_that_is_not_a_number_is_a_bad_limit_not_a_crash() -> None:
    """Found by the run: "²" is a digit to str.isdigit() and int() refuses it."""
    api = Api(operator_token())
    answer = api.get("/api/v1/tenants?limit=²")
    assert answer.status_code == 422
    assert answer.json()["errors"][0]["field"] == "limit"


def test_a_cursor_is_a_position_any_of_its_shape_is_answered() -> None:
    """Found by the run: cursors were opaque (base64 of JSON), so a cursor the document
    called valid was a 422 unless this API had given it out. Now the document's pattern is
    exact: any cursor of the shape is a position, and the rows after it come back."""
    api = Api(operator_token())
    for key in ("a", "b", "c"):
        api.post("/api/v1/tenants", {"key": key})
    given = api.get("/api/v1/tenants?limit=1").json()["next_cursor"]
    assert given == "a"
    after_b = api.get("/api/v1/tenants?cursor=b").json()
    assert [tenant["key"] for tenant in after_b["data"]] == ["c"]
    made_up = api.get("/api/v1/tenants?cursor=bb").json()  # names no row: still a place
    assert [tenant["key"] for tenant in made_up["data"]] == ["c"]
    api.post("/api/v1/tenants", {"key": "acme"})
    refused = api.get("/api/v1/tenants/acme/messages?cursor=not-a-time-1")
    assert refused.status_code == 422
    assert refused.json()["errors"][0]["field"] == "cursor"


def test_a_rate_with_more_decimals_than_kept_is_rounded_not_refused() -> None:
    """Found by the run: a JSON number like 0.1 + 0.2 was a 422 (too many digits), though
    the document says any number from 0 to 10000; the bounds still hold as sent."""
    api = Api(operator_token())
    api.post("/api/v1/tenants", {"key": "acme"})
    answer = api.patch("/api/v1/tenants/acme", {"rate_limit_per_second": 0.1 + 0.2})
    assert answer.status_code == 200, answer.json()
    assert answer.json()["rate_limit_per_second"] == 0.3
    above = api.patch("/api/v1/tenants/acme", {"rate_limit_per_second": 10000.0004})
    assert above.status_code == 422
    below = api.patch("/api/v1/tenants/acme", {"rate_limit_per_second": -0.0001})
    assert below.status_code == 422


def test_an_idempotency_key_the_document_refuses_is_refused() -> None:
    """Found by the run: the document now states the key's rule (visible ASCII, 1 to 255),
    and the API keeps to it."""
    api = Api(operator_token())
    made = api.post("/api/v1/tenants", {"key": "a"}, **{IDEMPOTENCY_KEY: "ok key-1"})
    assert made.status_code == 201
    for bad in ("é", "x" * (MAX_KEY_CHARS + 1), "tab\there"):
        answer = api.post("/api/v1/tenants", {"key": "b"}, **{IDEMPOTENCY_KEY: bad})
        assert answer.status_code == 422, bad
        assert answer.json()["errors"][0]["field"] == IDEMPOTENCY_KEY


def test_an_endpoint_with_a_rate_can_be_changed_and_the_change_is_audited(settings) -> None:
    """Found by the run: a rate reached the audit trail as a Decimal, which JSON cannot
    hold, so changing an endpoint's rate, or anything of an endpoint that had one, was a
    500."""
    settings.ALLOW_PRIVATE_DESTINATIONS = True
    world = make_world("acme")
    api = Api(operator_token())
    path = f"/api/v1/tenants/acme/endpoints/{world.endpoint.pk}"
    rated = api.patch(path, {"rate_limit_per_second": 2.5})
    assert rated.status_code == 200, rated.content
    described = api.patch(path, {"description": "after the rate"})
    assert described.status_code == 200, described.content
    assert described.json()["rate_limit_per_second"] == 2.5
    changes = AuditEntry.objects.filter(action=AuditEntry.Action.ENDPOINT_CHANGED).order_by("id")
    assert [entry.detail["new"] for entry in changes] == [
        {"rate_limit_per_second": "2.500"},
        {"description": "after the rate"},
    ]


def test_a_value_of_another_json_type_is_refused_not_read_as_one() -> None:
    """Found by the run: a number for a text field was taken as its digits (a tenant
    named "5"); so were "true" for true and "2" for 2. The document says the type."""
    api = Api(operator_token())
    assert api.post("/api/v1/tenants", {"key": "acme"}).status_code == 201
    for body, field in [
        ({"key": 5}, "key"),
        ({"key": "b", "paused": "true"}, "paused"),
        ({"key": "b", "weight": "2"}, "weight"),
        ({"key": "b", "rate_limit_per_second": "2"}, "rate_limit_per_second"),
    ]:
        answer = api.post("/api/v1/tenants", body)
        assert answer.status_code == 422, body
        assert [error["field"] for error in answer.json()["errors"]] == [field]
    assert api.patch("/api/v1/tenants/acme", {"name": 5}).status_code == 422
    assert api.patch("/api/v1/tenants/acme", {"name": "5", "weight": 2}).status_code == 200
