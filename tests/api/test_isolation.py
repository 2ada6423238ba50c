"""Tenant isolation, for every operation the OpenAPI document lists: tenant A's read-write
token, aimed at tenant B's key or B's ids, answers 404 exactly as a key or id that does
not exist would, and changes nothing anywhere (every table, the Redis schedule).

The operations come from the document, not from a list here, so a route added later is
checked the day it lands; a path parameter or a request body this file cannot fill
fails loudly rather than letting the route through unchecked. Each cross-tenant call is
paired with the same call on A's own rows, which must reach the operation (not 404, not
422): that is what shows the 404 comes from the tenant check, not from ids or a body the
operation would refuse anyway."""

import itertools
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.apps import apps
from django.utils import timezone

from api.problems import MEDIA_TYPE
from tests.api.helpers import Api, tenant_token
from tests.api.world import (
    CATALOGUED_TYPE,
    Operation,
    World,
    api_operations,
    make_catalogue,
    make_world,
    openapi_document,
)

pytestmark = pytest.mark.django_db(transaction=True)

OPERATIONS = api_operations()
SCOPED = [op for op in OPERATIONS if op.tenant_scoped]
PLATFORM = [op for op in OPERATIONS if not op.tenant_scoped]
SAFE = ("GET", "HEAD", "OPTIONS")

# Every path parameter naming a row, and the row of a tenant's world it names. A route
# with a parameter missing here fails its test until it is added.
IDS: dict[str, Callable[[World], object]] = {
    "endpoint_id": lambda world: world.endpoint.pk,
    "event_id": lambda world: world.event.pk,
    "delivery_id": lambda world: world.dead.pk,
    "attempt_id": lambda world: world.attempt.pk,
    "replay_id": lambda world: world.replay.pk,
    "link_id": lambda world: world.link.pk,
    "portal_link_id": lambda world: world.link.pk,
}
# Path parameters of platform-wide routes (no tenant key), and what they name.
PLATFORM_IDS: dict[str, object] = {"name": CATALOGUED_TYPE}
# Of the right shape, naming nothing: another tenant's row must answer exactly as these.
MISSING_KEY = "no-such-tenant.example"
MISSING_ULID = "01J00000000000000000000000"
MISSING: dict[str, object] = {
    "endpoint_id": 999_999_999,
    "event_id": MISSING_ULID,
    "delivery_id": MISSING_ULID,
    "attempt_id": 999_999_999,
    "replay_id": 999_999_999,
    "link_id": 999_999_999,
    "portal_link_id": 999_999_999,
}


def _window(world: World) -> dict:
    now = timezone.now()
    return {
        "since": (now - timedelta(days=1)).isoformat(),
        "until": (now + timedelta(minutes=1)).isoformat(),
        "statuses": ["dead", "delivered"],
        "endpoint_id": world.endpoint.pk,
    }


# Bodies that the operation accepts from a tenant's token, built for the tenant they
# target: were the tenant check missing, each would act on that tenant's rows. An
# operation not listed gets one built from its request schema (_from_schema).
BODIES: dict[str, Callable[[World], dict]] = {
    "tenants_create": lambda world: {"key": "new-tenant.example"},
    "tenants_update": lambda world: {"name": "changed", "weight": 4, "paused": True},
    "endpoints_create": lambda world: {"url": "http://127.0.0.1:9/new", "description": "new"},
    "endpoints_update": lambda world: {
        "url": "http://127.0.0.1:9/changed",
        "description": "changed",
        "max_in_flight": 3,
    },
    "endpoints_disable": lambda world: {"reason": "isolation"},
    "endpoints_secrets_rotate": lambda world: {"overlap_hours": 1},
    "replays_preview": _window,
    "replays_create": _window,
}


def _resolve(schema: dict) -> dict:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = openapi_document()["components"]["schemas"][name]
    if "allOf" in schema:
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            part = _resolve(part)
            merged = {
                **merged,
                **part,
                "properties": {**merged.get("properties", {}), **part.get("properties", {})},
                "required": [*merged.get("required", []), *part.get("required", [])],
            }
        return merged
    return schema


def _from_schema(schema: dict, world: World, name: str, where: str) -> object:
    """A plausible value for `schema`: its required properties only, ids from `world`."""
    schema = _resolve(schema)
    if name in IDS:
        return IDS[name](world)
    if schema.get("enum"):
        return next(value for value in schema["enum"] if value is not None)
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        return {
            prop: _from_schema(schema["properties"][prop], world, prop, f"{where}.{prop}")
            for prop in schema.get("required", [])
        }
    if kind == "string":
        if schema.get("format") == "date-time":
            return timezone.now().isoformat()
        if schema.get("format") == "uri":
            return "http://127.0.0.1:9/isolation"
        return "isolation"[: schema.get("maxLength", 9)]
    if kind in ("integer", "number"):
        return max(schema.get("minimum", 1), 1)
    if kind == "boolean":
        return True
    if kind == "array":
        item = _from_schema(schema.get("items", {}), world, name, f"{where}[]")
        return [item] * max(schema.get("minItems", 1), 1)
    pytest.fail(f"No value for {where} ({schema}): add the operation to BODIES.")


def body_for(op: Operation, world: World) -> dict | None:
    if op.id in BODIES:
        return BODIES[op.id](world)
    if not op.takes_body:
        return {} if op.method in ("POST", "PATCH", "PUT") else None
    content = op.spec["requestBody"]["content"]
    schema = content.get("application/json", next(iter(content.values())))["schema"]
    return _from_schema(schema, world, "", f"{op.id} body")


def path_for(op: Operation, key: str, ids: dict[str, object]) -> str:
    path = op.path
    for name in op.path_parameters:
        if name == "key":
            value = key
        elif name in ids:
            value = ids[name]
        else:
            pytest.fail(
                f"{op.method} {op.path}: path parameter {name!r} names no row of a tenant "
                "here. Map it in IDS and MISSING so the route is checked."
            )
        path = path.replace("{" + name + "}", str(value))
    return path


def ids_of(op: Operation, world: World) -> dict[str, object]:
    return {name: IDS[name](world) for name in op.path_parameters if name in IDS}


def call(api: Api, op: Operation, path: str, body: dict | None):
    return api.call(op.method, path, body)


# What one request may change without it being a change: the token's last use.
VOLATILE = {"webhooks.ApiToken": {"last_used_at"}}
RATE_KEYS = b"api:rate:"


def snapshot(conn: redis.Redis) -> dict[str, object]:
    """Every row of every table, and every Redis key but the per-token rate counters."""
    state: dict[str, object] = {}
    for model in apps.get_models():
        if model._meta.proxy or not model._meta.managed:
            continue
        skip = VOLATILE.get(model._meta.label, set())
        rows = model._base_manager.order_by("pk").values()
        state[model._meta.label] = [
            {
                name: bytes(value) if isinstance(value, memoryview) else value
                for name, value in row.items()
                if name not in skip
            }
            for row in rows
        ]
    state["redis"] = {
        key: (conn.type(key), conn.dump(key))
        for key in sorted(conn.scan_iter())
        if RATE_KEYS not in key
    }
    return state


def assert_unchanged(before: dict, after: dict, what: str) -> None:
    changed = [name for name in before if before[name] != after.get(name)]
    assert not changed, f"{what} changed {changed}: " + "; ".join(
        f"{name}: {before[name]!r} -> {after.get(name)!r}" for name in changed[:3]
    )


def assert_not_found(answer, what: str) -> None:
    assert answer.status_code == 404, f"{what}: {answer.status_code} {answer.content[:500]!r}"
    assert answer["Content-Type"] == MEDIA_TYPE, what
    assert answer.json()["status"] == 404, what


@pytest.fixture
def worlds(settings) -> tuple[World, World]:
    # Endpoint URLs in these bodies point at 127.0.0.1: let them pass, so that only the
    # tenant check stands between A's token and B's rows.
    settings.ALLOW_PRIVATE_DESTINATIONS = True
    make_catalogue()
    return make_world("alpha.example"), make_world("bravo.example")


@pytest.fixture
def alpha(worlds) -> Api:
    return Api(tenant_token(worlds[0].tenant))


def _leaks(text: str, world: World) -> list[str]:
    """Which of `world`'s names and ids appear in `text`."""
    names = [
        world.tenant.key,
        world.endpoint.url,
        world.second_endpoint.url,
        world.event.pk,
        world.dead.pk,
        world.delivered.pk,
        world.pending.pk,
    ]
    return [str(name) for name in names if str(name) in text]


@pytest.mark.parametrize("op", SCOPED, ids=[op.id for op in SCOPED])
def test_another_tenants_key_answers_404_and_changes_nothing(
    op: Operation, worlds, alpha: Api, redis_conn
) -> None:
    a, b = worlds
    before = snapshot(redis_conn)
    answer = call(alpha, op, path_for(op, b.tenant.key, ids_of(op, b)), body_for(op, b))
    assert_not_found(answer, f"A's token on B's key: {op.method} {op.path}")
    assert_unchanged(before, snapshot(redis_conn), f"{op.id} with B's key")
    # Indistinguishable from a tenant that does not exist: nothing confirms B is there.
    missing = call(alpha, op, path_for(op, MISSING_KEY, ids_of(op, b)), body_for(op, b))
    assert (missing.status_code, missing.json()) == (answer.status_code, answer.json())
    # The same call on A's own rows reaches the operation: the ids and the body are good.
    own = call(alpha, op, path_for(op, a.tenant.key, ids_of(op, a)), body_for(op, a))
    assert own.status_code < 500 and own.status_code not in (404, 422), (
        f"{op.id} on A's own rows: {own.status_code} {own.content[:500]!r}: fix IDS or BODIES"
    )


def _id_mixes(op: Operation) -> list[tuple[str, ...]]:
    """Every non-empty set of a route's id parameters: those get B's ids, the others A's,
    so that B's delivery under A's endpoint is tried as well as everything of B's."""
    names = [name for name in op.path_parameters if name != "key"]
    return [mix for size in range(1, len(names) + 1) for mix in itertools.combinations(names, size)]


WITH_IDS = [op for op in SCOPED if _id_mixes(op)]


@pytest.mark.parametrize("op", WITH_IDS, ids=[op.id for op in WITH_IDS])
def test_another_tenants_ids_under_its_own_key_answer_404(
    op: Operation, worlds, alpha: Api, redis_conn
) -> None:
    a, b = worlds
    for mix in _id_mixes(op):
        before = snapshot(redis_conn)
        ids = {**ids_of(op, a), **{name: IDS[name](b) for name in mix if name in IDS}}
        answer = call(alpha, op, path_for(op, a.tenant.key, ids), body_for(op, a))
        assert_not_found(answer, f"A's key with B's {mix}: {op.method} {op.path}")
        assert_unchanged(before, snapshot(redis_conn), f"{op.id} with B's {mix}")
        missing_ids = {**ids, **{name: MISSING[name] for name in mix}}
        missing = call(alpha, op, path_for(op, a.tenant.key, missing_ids), body_for(op, a))
        assert (missing.status_code, missing.json()) == (answer.status_code, answer.json())


def _body_ids(op: Operation) -> list[str]:
    """The request body's properties that name a row by id."""
    if not op.takes_body:
        return []
    content = op.spec["requestBody"]["content"]
    schema = _resolve(content.get("application/json", next(iter(content.values())))["schema"])
    return [name for name in schema.get("properties", {}) if name in IDS]


BODY_IDS = [op for op in SCOPED if _body_ids(op)]


@pytest.mark.parametrize("op", BODY_IDS, ids=[op.id for op in BODY_IDS])
def test_another_tenants_ids_in_a_body_are_refused(
    op: Operation, worlds, alpha: Api, redis_conn
) -> None:
    a, b = worlds
    names = _body_ids(op)
    body = {**(body_for(op, a) or {}), **{name: IDS[name](b) for name in names}}
    before = snapshot(redis_conn)
    answer = call(alpha, op, path_for(op, a.tenant.key, ids_of(op, a)), body)
    assert answer.status_code in (404, 422), f"{op.id}: {answer.status_code} {answer.json()}"
    assert_unchanged(before, snapshot(redis_conn), f"{op.id} with B's {names} in its body")
    missing_body = {**body, **{name: MISSING[name] for name in names}}
    missing = call(alpha, op, path_for(op, a.tenant.key, ids_of(op, a)), missing_body)
    assert (missing.status_code, missing.json()) == (answer.status_code, answer.json())


PLATFORM_WRITES = [op for op in PLATFORM if op.method not in SAFE]
PLATFORM_READS = [op for op in PLATFORM if op.method in SAFE]


@pytest.mark.parametrize("op", PLATFORM_WRITES, ids=[op.id for op in PLATFORM_WRITES])
def test_platform_routes_refuse_a_tenants_token_to_change_them(
    op: Operation, worlds, alpha: Api, redis_conn
) -> None:
    _, b = worlds
    before = snapshot(redis_conn)
    answer = call(alpha, op, path_for(op, "", PLATFORM_IDS), body_for(op, b))
    assert answer.status_code == 403, f"{op.id}: {answer.status_code} {answer.content[:500]!r}"
    assert answer["Content-Type"] == MEDIA_TYPE
    assert_unchanged(before, snapshot(redis_conn), op.id)


@pytest.mark.parametrize("op", PLATFORM_READS, ids=[op.id for op in PLATFORM_READS])
def test_platform_routes_show_a_tenant_nothing_of_another(
    op: Operation, worlds, alpha: Api
) -> None:
    a, b = worlds
    answer = call(alpha, op, path_for(op, "", PLATFORM_IDS), None)
    assert answer.status_code == 200, f"{op.id}: {answer.status_code} {answer.content[:500]!r}"
    text = json.dumps(answer.json())
    assert _leaks(text, b) == [], f"{op.id} shows A's token B's rows"
    if op.id == "tenants_list":
        assert [tenant["key"] for tenant in answer.json()["data"]] == [a.tenant.key]


def test_the_document_was_read_and_every_path_parameter_is_mapped() -> None:
    """What the tests above stand on, checked once with every gap listed: the operations
    came from the document (not an empty one), their operationIds, the test ids, are
    unique, and each path parameter names a row this file can fill in."""
    ids = [op.id for op in OPERATIONS]
    assert {"tenants_list", "tenants_get", "endpoints_get"} <= set(ids)
    assert len(set(ids)) == len(ids), "operationIds repeat"
    unmapped = [
        f"{op.method} {op.path}: {name}"
        for op in OPERATIONS
        for name in op.path_parameters
        if name != "key" and name not in (IDS if op.tenant_scoped else PLATFORM_IDS)
    ]
    assert unmapped == [], "map these in IDS and MISSING, or PLATFORM_IDS"
