"""JSON Schemas of the event type catalogue (webhooks.models.EventType): checking one as
it is saved, and a payload against it as it is published.

A schema is Draft 2020-12 unless its `$schema` names another draft jsonschema knows.
Its `$ref`s resolve within the schema alone: the validators get an empty registry, since
jsonschema would otherwise fetch any remote `$ref` over HTTP, from the publish path, at
whatever address the schema names. A `$ref` that does not resolve is refused when the
schema is saved, not discovered by the first publisher. `format` is asserted for the
formats jsonschema can check, as a schema's author expects of "format": "date-time".
"""

from collections.abc import Iterator
from urllib.parse import urljoin

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from jsonschema.protocols import Validator
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012, specification_with

MAX_MESSAGE_CHARS = 300  # a message quotes the offending value, which may be large
# Keywords whose values are data, not subschemas: a {"$ref": ...} inside them is a value.
DATA_KEYWORDS = frozenset({"const", "enum", "examples", "default"})
_NO_REMOTE = Registry()
NOT_CHECKABLE = "cannot be checked"


class SchemaProblem(ValueError):
    """The schema cannot be used; the message says why, for the field `schema`."""


def _brief(error: ValidationError | SchemaError) -> str:
    where = error.json_path
    message = f"{where}: {error.message}" if where != "$" else error.message
    return message if len(message) <= MAX_MESSAGE_CHARS else message[: MAX_MESSAGE_CHARS - 1] + "…"


def _refs(node: object, base: str) -> Iterator[str]:
    """Every `$ref` in the schema, made absolute against the `$id`s around it."""
    if isinstance(node, dict):
        if isinstance(node.get("$id"), str):
            base = urljoin(base, node["$id"])
        if isinstance(node.get("$ref"), str):
            yield urljoin(base, node["$ref"])
        for key, value in node.items():
            if key not in DATA_KEYWORDS:
                yield from _refs(value, base)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item, base)


def _check_refs(schema: dict, validator_class: type[Validator]) -> None:
    specification = specification_with(
        validator_class.META_SCHEMA.get("$id", ""), default=DRAFT202012
    )
    resource = specification.create_resource(schema)
    root = resource.id() or ""
    resolver = Registry().with_resource(root, resource).crawl().resolver(base_uri=root)
    for ref in _refs(schema, root):
        try:
            resolver.lookup(ref)
        except Unresolvable as exc:
            raise SchemaProblem(
                f"$ref {ref[:100]!r} does not resolve within the schema "
                f"(remote schemas are never fetched): {type(exc).__name__}"
            ) from exc


def _trial(validator: Validator) -> None:
    """Validate a few small documents: a schema that refers to itself without end (a
    root "$ref": "#") or names a reference that cannot resolve fails on any of them, and
    is better refused when saved than found by a publisher."""
    for instance in (None, {}, [], 0, ""):
        problem = first_error(validator, instance)
        if problem is not None and problem.startswith(NOT_CHECKABLE):
            detail = problem.removeprefix(f"{NOT_CHECKABLE}: ")
            raise SchemaProblem(f"checking a document with it fails: {detail}.")


def compile_schema(schema: object) -> Validator:
    """A validator for `schema`, or SchemaProblem saying what is wrong with it."""
    if not isinstance(schema, dict | bool):
        raise SchemaProblem("A JSON Schema is an object (or true or false).")
    if isinstance(schema, dict) and not isinstance(schema.get("$schema", ""), str):
        raise SchemaProblem("$schema is the URI of a draft, a string.")
    try:
        validator_class = validators.validator_for(schema, default=Draft202012Validator)
        validator_class.check_schema(schema)
        if isinstance(schema, dict):
            _check_refs(schema, validator_class)
        validator = validator_class(
            schema, registry=_NO_REMOTE, format_checker=validator_class.FORMAT_CHECKER
        )
        _trial(validator)
    except SchemaProblem:
        raise
    except SchemaError as exc:
        raise SchemaProblem(_brief(exc)) from exc
    except RecursionError as exc:
        raise SchemaProblem("The schema is nested too deeply.") from exc
    except (ValueError, TypeError, AttributeError, LookupError) as exc:
        # jsonschema and referencing assume well-formed URIs and keywords in places the
        # metaschema does not check (an $id that is not a URI, for one).
        raise SchemaProblem(f"The schema cannot be read: {type(exc).__name__}: {exc}") from exc
    return validator


def first_error(validator: Validator, instance: object) -> str | None:
    """What is wrong with `instance`, briefly (where and what, for the most relevant of
    its errors), or None when the schema accepts it."""
    try:
        error = best_match(validator.iter_errors(instance))
    except RecursionError:
        return f"{NOT_CHECKABLE}: nested too deeply, or a schema that refers to itself"
    except Unresolvable as exc:  # a $dynamicRef, or a schema saved around the model's checks
        return f"{NOT_CHECKABLE}: a reference does not resolve ({type(exc).__name__})"
    except (ValueError, TypeError) as exc:  # a keyword jsonschema could not apply
        return f"{NOT_CHECKABLE}: {type(exc).__name__}: {str(exc)[:MAX_MESSAGE_CHARS]}"
    return None if error is None else _brief(error)
