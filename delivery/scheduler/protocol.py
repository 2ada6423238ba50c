"""The named protocol between the scheduler's Python and its Lua: every value that crosses
(a call's arguments, an enqueued item's fields, a pick's reply) is named here, once.

Python packs and unpacks by these names; scripts.py writes the same definitions into the
Lua as tables (`ITEM.weight`, `PICK.worker`, ...), which the scripts read instead of
positions. Adding a value is one name in one record here, plus its use on each side;
tests/delivery/test_scheduler_protocol.py adds a throwaway field at the front of every
record and runs the scheduler, so a side that still counts positions fails there.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ARGUMENTS, GROUP, REPLY, COMMON = "arguments", "group", "reply", "common"


@dataclass(frozen=True)
class Record:
    """Values that travel side by side, by name. In Lua, `NAME.field` is:

    - a script's ARGUMENTS: the field's ARGV index (after the COMMON ones every call
      starts with), and `NAME.rest` the index where a variadic tail (`rest`) starts;
    - a GROUP repeated per item from ARGS_FIRST on: the offset from the group's start,
      `NAME.SIZE` the group's length;
    - a REPLY: the index in the array the script returns."""

    lua_name: str
    fields: tuple[str, ...]
    kind: str = ARGUMENTS
    rest: str | None = None  # a variadic tail after the fields
    # What pack() sends for a field the caller leaves out: a new field can ship before
    # every caller fills it in.
    defaults: Mapping[str, object] = field(default_factory=dict)

    @property
    def first(self) -> int:
        if self.kind == ARGUMENTS:
            return args_first()
        return 0 if self.kind == GROUP else 1

    def index(self, name: str) -> int:
        return self.first + self.fields.index(name)

    def pack(self, values: Mapping[str, object], rest: Sequence[object] = ()) -> list[object]:
        """The fields' values in the protocol's order, then the tail."""
        values = {**self.defaults, **values}
        missing = set(self.fields) - set(values)
        unknown = set(values) - set(self.fields)
        if missing or unknown:
            raise ValueError(
                f"{self.lua_name}: missing {sorted(missing)}, unknown {sorted(unknown)}"
            )
        if rest and self.rest is None:
            raise ValueError(f"{self.lua_name} takes no {len(rest)} trailing values")
        return [*(values[name] for name in self.fields), *rest]

    def unpack(self, values: Sequence[Any]) -> dict[str, Any]:
        """A reply's array by name (a reply's `first` is 1)."""
        if len(values) != len(self.fields):
            raise ValueError(f"{self.lua_name}: {len(values)} values for {len(self.fields)}")
        return dict(zip(self.fields, values, strict=True))

    def lua(self) -> str:
        entries = [f"{name} = {self.index(name)}" for name in self.fields]
        if self.rest is not None:
            entries.append(f"{self.rest} = {self.first + len(self.fields)}")
        entries.append(f"SIZE = {len(self.fields)}")
        return f"local {self.lua_name} = {{{', '.join(entries)}}}"


# Every call starts with these (lib.lua's begin reads them).
CALL = Record("CALL", ("prefix", "now", "mode"), kind=COMMON)


def args_first() -> int:
    """The ARGV index of a script's first own argument (ARGS_FIRST in Lua)."""
    return 1 + len(CALL.fields)


# enqueue: one group per delivery. Weight, caps and rates ride along with each delivery,
# so that what the database said at enqueue time wins.
ITEM = Record(
    "ITEM",
    (
        "id",
        "tenant",  # the tenant's token: its id, or "fb" for the fallback lane
        "endpoint",
        "weight",
        "max_in_flight",
        "retry_max_in_flight",
        "kind",  # "f" fresh, "r" retry
        "due",  # epoch seconds, or "" for now
        "endpoint_rate",  # requests per second, or "" for none
        "tenant_rate",
        "adaptive",  # "1": the endpoint's in-flight limit adapts under max_in_flight
    ),
    kind=GROUP,
)
PICK = Record(
    "PICK",
    (
        "worker",
        "max_items",
        "turn_size",
        "retry_share_ppm",
        "fallback_weight",
        "lease_seconds",
        "promote_limit",
        "reclaim_limit",
        "wake_limit",
    ),
)
PICK_REPLY = Record("PICK_REPLY", ("members", "deadline", "wait_seconds"), kind=REPLY)
ACK = Record("ACK", ("outcome",), rest="members")
# answered: `signals` ENDPOINT_ANSWERS groups from ANSWERED.members on, then the lease
# members.
ANSWERED = Record("ANSWERED", ("signals",), rest="members")
ENDPOINT_ANSWERS = Record(
    "ENDPOINT_ANSWERS", ("endpoint", "ok", "overloaded", "latency_ms"), kind=GROUP
)
RENEW = Record("RENEW", ("lease_seconds",), rest="members")
RENEW_REPLY = Record("RENEW_REPLY", ("lost", "deadline"), kind=REPLY)
RETRY_LATER = Record("RETRY_LATER", (), rest="pairs")
RETRY_PAIR = Record("RETRY_PAIR", ("member", "due"), kind=GROUP)
PROMOTE = Record("PROMOTE", ("member",))
SET_TENANT = Record("SET_TENANT", ("tenant", "weight", "paused", "rate"))
SET_ENDPOINT = Record(
    "SET_ENDPOINT", ("endpoint", "max_in_flight", "retry_max_in_flight", "rate", "adaptive")
)
PAUSE_ENDPOINT = Record("PAUSE_ENDPOINT", ("endpoint", "paused_until"))
SNAPSHOT = Record("SNAPSHOT", ("top_n",), rest="bounds")
# snapshot's rows: one per listed tenant and endpoint; "" or none where a value is absent.
SNAPSHOT_TENANT = Record(
    "SNAPSHOT_TENANT",
    (
        "tenant",
        "oldest_ms",  # the age index's score: its oldest queued delivery
        "fresh",
        "retry",
        "delayed",
        "in_flight",
        "weight",
        "paused",  # 1 or 0
        "rate",  # deliveries per second, "" for none
        "rate_limited",  # 1: its rate has no token ready (it sleeps until the next)
    ),
    kind=REPLY,
)
SNAPSHOT_ENDPOINT = Record(
    "SNAPSHOT_ENDPOINT",
    (
        "endpoint",
        "in_flight",
        "max_in_flight",
        "retry_max_in_flight",
        "retry_in_flight",
        "parked_lanes",
        "rate",
        "paused_until",  # epoch seconds of a Retry-After's end, "" when not paused
        "rate_limited",
        "retry_budget",
        "adaptive_limit",  # the rest: only while the endpoint's limit adapts
        "latency_ms",
        "baseline_ms",
        "backed_off_at",
        "backed_off_from",
        "backed_off_latency_ms",
    ),
    kind=REPLY,
)
ENDPOINT_STATE = Record("ENDPOINT_STATE", ("endpoint",))
ENDPOINT_STATE_REPLY = Record(
    "ENDPOINT_STATE_REPLY",
    (
        "in_flight",
        "max_in_flight",
        "retry_budget",  # tokens now (fractional)
        "retry_budget_cap",
        "adaptive_limit",  # the rest: only while the endpoint's limit adapts
        "latency_ms",  # its answers' recent latency
        "baseline_ms",
        "backed_off_at",  # epoch seconds of its last backoff; none before the first
        "backed_off_from",  # the limit before it
        "backed_off_latency_ms",  # the recent latency that was too slow; none: an overload
    ),
    kind=REPLY,
)


def records() -> list[Record]:
    """Every record of this module, as it stands now (a test may swap one in)."""
    return [value for value in globals().values() if isinstance(value, Record)]


def lua_prelude() -> str:
    """The records as Lua tables, put before lib.lua in every script."""
    lines = ["-- protocol.py's records (generated: edit them there)."]
    lines += [f"local ARGS_FIRST = {args_first()}"]
    lines += [record.lua() for record in records()]
    return "\n".join(lines) + "\n"
