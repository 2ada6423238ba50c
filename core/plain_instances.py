"""New model instances for rows about to be inserted, without Model.__init__'s cost.

A 500-event publish batch builds 500 Events and their Deliveries before its INSERT, and
`Model(**fields)` does a lot of work for each (keyword matching, a descriptor per foreign
key, a get_default() call per field left out, the init signals): a large share of the
batch's Python CPU once the INSERT itself is cheap (docs/INGEST.md). Here the defaults are
worked out once per model (a callable default, such as a ULID or the time, is still
called for every instance), and an instance is its attribute dictionary, set in one
step, plus the foreign keys' related-object cache: the state `Model(**fields)` leaves
(a test compares the two field by field). Like core.plain_insert, no signals are sent
(nothing in this project listens to pre_init or post_init).
"""

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from django.db import models
from django.db.models.base import ModelState

M = TypeVar("M", bound=models.Model)
# Per model: the default of every concrete field by attname, constant or to be called,
# and each foreign key's (attname, attname of the field it points to) by field name.
_Plan = tuple[dict[str, Any], list[tuple[str, Callable[[], Any]]], dict[str, tuple[str, str]]]
_PLANS: dict[type, _Plan] = {}


def _plan(model: type[models.Model]) -> _Plan:
    if model not in _PLANS:
        constant: dict[str, Any] = {}
        called: list[tuple[str, Callable[[], Any]]] = []
        keys: dict[str, tuple[str, str]] = {}
        for field in model._meta.concrete_fields:
            if field.has_default() and callable(field.default):
                called.append((field.attname, field.default))
            else:  # None, "" or a declared constant: what get_default() gives every time
                constant[field.attname] = field.get_default()
            if field.is_relation:
                keys[field.name] = (field.attname, field.target_field.attname)
        _PLANS[model] = (constant, called, keys)
    return _PLANS[model]


def new(
    model: type[M], values: Mapping[str, Any], related: Mapping[str, models.Model | None] = {}
) -> M:
    """An unsaved `model` as `model(**values, **related)` builds it: `values` by attname
    (`status`, `tenant_id`), `related` the foreign keys' objects by field name (`tenant`:
    its pk goes to `tenant_id`, the object to the cache, so `.tenant` costs no query);
    every other field gets its default."""
    constant, called, keys = _plan(model)
    attributes = dict(constant)
    for attname, default in called:
        if attname not in values:
            attributes[attname] = default()
    attributes.update(values)
    for name, obj in related.items():
        attname, target = keys[name]
        attributes[attname] = None if obj is None else getattr(obj, target)
    instance = model.__new__(model)
    state = instance._state = ModelState()
    state.fields_cache.update(related)
    instance.__dict__.update(attributes)
    return instance
