"""Key names and the encodings shared with the Lua scripts (see lua/lib.lua).

Every key starts with ``wh:{<shard>}:``: the braces are a Redis Cluster hash tag, so all
keys of one shard live in one slot and each script can touch them atomically.
"""

from core import redis_connection

from .values import FRESH, RETRY

FALLBACK_TOKEN = "fb"  # noqa: S105 (a lane name, not a secret)
KIND_OF_LANE = {FRESH: "f", RETRY: "r"}
LANE_OF_KIND = {kind: lane for lane, kind in KIND_OF_LANE.items()}


def prefix(shard: int) -> str:
    return f"{redis_connection.KEY_PREFIX}{{{shard}}}:"


def tenant_token(tenant_id: int | None) -> str:
    return FALLBACK_TOKEN if tenant_id is None else str(int(tenant_id))


def tenant_id_of(token: str) -> int | None:
    return None if token == FALLBACK_TOKEN else int(token)


def lease_member(
    delivery_id: str, tenant_id: int | None, endpoint_id: int, lane: str, token: str
) -> str:
    """A lease's member in the leases ZSET: what it frees needs no lookup."""
    return "|".join(
        (delivery_id, tenant_token(tenant_id), str(endpoint_id), KIND_OF_LANE[lane], token)
    )


class Keys:
    """The names of one shard's keys that Python itself reads or writes."""

    def __init__(self, shard: int) -> None:
        self.prefix = prefix(shard)
        self.stats = self.prefix + "stats"
        self.wake = self.prefix + "wake"
        # Versioned with the schedule's format: a schedule written in an older format
        # (whose counts mean something else) has no such key, so the first sweep after an
        # upgrade rebuilds it from the database.
        self.epoch = self.prefix + "epoch:5"
        self.leases = self.prefix + "leases"
        self.delayed = self.prefix + "delayed"
        self.fifo = self.prefix + "fifo"
        self.vt = self.prefix + "vt"
        self.busy = self.prefix + "busy"
        self.age = self.prefix + "age"
        self.count = self.prefix + "count"  # "t<token>" / "e<id>": deliveries anywhere here
        self.tenants = self.prefix + "tenants"  # token -> the tenant's row (lua/lib.lua)
        self.endpoints = self.prefix + "endpoints"  # id -> the endpoint's row (lua/lib.lua)
        self.paused = self.prefix + "paused"
        self.tat = self.prefix + "tat"  # token clocks of rates, "e<id>" / "t<token>"
        self.due = self.prefix + "due"  # what waits for a token, by when it is due
        self.hold = self.prefix + "hold"  # paused endpoints (Retry-After), by until
        # Held while the schedule is rebuilt from the database. Outside the prefix, so
        # that the rebuild's own clear() keeps it; same hash tag, same cluster slot.
        self.rebuild_lock = f"wh-rebuild:{{{shard}}}"

    def lane(self, tenant_id: int | None, endpoint_id: int, lane: str) -> str:
        return f"{self.prefix}q:{tenant_token(tenant_id)}:{endpoint_id}:{KIND_OF_LANE[lane]}"

    def rotation(self, tenant_id: int | None, lane: str) -> str:
        return f"{self.prefix}rot:{tenant_token(tenant_id)}:{KIND_OF_LANE[lane]}"

    def park(self, endpoint_id: int, lane: str) -> str:
        return f"{self.prefix}park:{endpoint_id}:{KIND_OF_LANE[lane]}"
