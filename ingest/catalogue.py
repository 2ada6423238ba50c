"""The event type catalogue as publishing reads it (webhooks.models.EventType).

A batch reads the catalogue rows of the types it names in one query, however many
events it holds. The compiled validator of each enforced schema is kept in the process,
tagged with its row's `updated_at`: the query reads `updated_at` but not the schema, and
the schema is read again (a second query, only then) when a row's `updated_at` is not the
one kept. A change therefore applies to the very next batch, in every process.
"""

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from jsonschema.protocols import Validator

from webhooks.event_schemas import NOT_CHECKABLE, SchemaProblem, compile_schema, first_error
from webhooks.models import EventType

logger = logging.getLogger(__name__)
MAX_KEPT = 10_000  # validators per process; past it the oldest go

# name -> (updated_at, validator, or the reason the stored schema cannot be used)
_kept: dict[str, tuple[datetime, Validator | str]] = {}
_lock = threading.Lock()  # only for adding and evicting; reads are plain dict look-ups


@dataclass(frozen=True)
class Entry:
    """One catalogued type, as publishing needs it."""

    archived: bool
    # What is wrong with a payload (None: nothing); None when the schema is not enforced.
    check: Callable[[object], str | None] | None


class Catalogue:
    """The catalogue entries of the types a batch names."""

    def __init__(self, entries: dict[str, Entry]) -> None:
        self.entries = entries

    def get(self, name: str) -> Entry | None:
        return self.entries.get(name)


def _keep(name: str, updated_at: datetime, validator: Validator | str) -> None:
    with _lock:
        _kept.pop(name, None)  # re-inserted last: the oldest entries are first
        _kept[name] = (updated_at, validator)
        while len(_kept) > MAX_KEPT:
            del _kept[next(iter(_kept))]


def clear() -> None:
    with _lock:
        _kept.clear()


def _compiled(name: str, schema: object) -> Validator | str:
    if schema is None:
        return "enforce_schema is on but the type has no schema"
    try:
        return compile_schema(schema)
    except SchemaProblem as exc:
        # Saved around the model's checks (raw SQL, or a jsonschema that grew stricter):
        # refused rather than let through unchecked, since enforcing is what was asked.
        logger.error("the schema of event type %r cannot be used: %s", name, exc)
        return f"its schema cannot be used ({exc})"


def _checker(name: str, validator: Validator | str) -> Callable[[object], str | None]:
    if isinstance(validator, str):
        return lambda payload: f"{NOT_CHECKABLE} against the schema of {name}: {validator}"

    def check(payload: object) -> str | None:
        problem = first_error(validator, payload)
        if problem is None:
            return None
        if problem.startswith(NOT_CHECKABLE):
            detail = problem.removeprefix(f"{NOT_CHECKABLE}: ")
            return f"{NOT_CHECKABLE} against the schema of {name}: {detail}"
        return f"does not match the schema of {name}: {problem}"

    return check


def _validators(stamps: dict[str, datetime]) -> dict[str, Validator | str]:
    """The validators of these enforced types, read and compiled where not kept."""
    found = {}
    missing = []
    for name, updated_at in stamps.items():
        kept = _kept.get(name)
        if kept is not None and kept[0] == updated_at:
            found[name] = kept[1]
        else:
            missing.append(name)
    if missing:
        rows = EventType.objects.filter(name__in=missing).values_list(
            "name", "updated_at", "schema"
        )
        for name, updated_at, schema in rows:
            found[name] = _compiled(name, schema)
            _keep(name, updated_at, found[name])
    return found


def catalogue_for(names: Iterable[object]) -> Catalogue:
    """The catalogue entries of `names` (anything not a plausible type is skipped: no
    catalogued name holds control characters, and PostgreSQL refuses NUL)."""
    wanted = {name.strip() for name in names if isinstance(name, str) and name.isprintable()}
    wanted.discard("")
    if not wanted:
        return Catalogue({})
    rows = list(
        EventType.objects.filter(name__in=wanted).values_list(
            "name", "archived", "enforce_schema", "updated_at"
        )
    )
    enforced = {name: updated_at for name, _, enforce, updated_at in rows if enforce}
    validators = _validators(enforced) if enforced else {}
    return Catalogue(
        {
            name: Entry(
                archived=archived,
                check=_checker(name, validators[name]) if name in validators else None,
            )
            for name, archived, _, _ in rows
        }
    )
