"""What the scheduler's tests share: a fake clock, small batches, draining, and the
invariants every state of the schedule must satisfy (checked against the raw keys)."""

import struct
from collections import Counter

from core.ids import new_ulid, ulid_time_ms
from delivery.scheduler import Item, Lease, Scheduler

T0 = 1_800_000_000.0


class FakeClock:
    """Scripts take `now` from here instead of the Redis clock: lease expiry on demand."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def has_functions(connection) -> bool:
    """Whether the server has Redis Functions (7.0+), read from INFO, not from what the
    scheduler decided."""
    info = connection.info("server")
    if "redis_version" not in info:  # a cluster answers per node
        info = next(iter(info.values()))
    return int(info["redis_version"].split(".")[0]) >= 7


def script_command(sched: Scheduler) -> str:
    """The one command a scheduler call must send: FCALL or, without Functions, EVALSHA."""
    return "FCALL" if has_functions(sched.connection) else "EVALSHA"


def batch(tenant: int | None, endpoint: int, n: int, **fields) -> list[Item]:
    return [Item(new_ulid(), tenant, endpoint, **fields) for _ in range(n)]


def fill_a_new_adaptive_limit(sched: Scheduler, tenant: int | None, endpoint: int) -> None:
    """Ten deliveries to an adaptive endpoint with a cap of 50, picked: a new limit starts at
    4, so four go out and six wait behind it."""
    sched.enqueue(batch(tenant, endpoint, 10, max_in_flight=50, adaptive=True))
    assert len(sched.pick("w", 10).leases) == 4


def drain(sched: Scheduler, max_items: int = 50) -> list[Lease]:
    """Pick and ack until nothing is dispatchable; returns the leases in hand-out order."""
    order: list[Lease] = []
    while True:
        leases = sched.pick("drain", max_items).leases
        if not leases:
            return order
        order += leases
        sched.ack(leases)


def dispatch_order(sched: Scheduler, n: int) -> list[Lease]:
    """n single picks, each acked at once (so caps never bind)."""
    order = []
    for _ in range(n):
        (lease,) = sched.pick("w").leases
        order.append(lease)
        sched.ack([lease])
    return order


def schedule_keys(sched: Scheduler) -> set[str]:
    return {k.decode() for k in sched.connection.scan_iter(match=sched.keys.prefix + "*")}


def check_invariants(sched: Scheduler) -> Counter:
    """Read the whole schedule (SCAN is fine in a test) and check the structural rules of
    lua/lib.lua. Returns a Counter of every delivery id held anywhere in the schedule."""
    r, keys = sched.connection, sched.keys
    prefix = keys.prefix

    def scan(pattern: str) -> list[list[str]]:
        found = r.scan_iter(match=prefix + pattern, count=1000)
        return [k.decode()[len(prefix) :].split(":") for k in found]

    def strings(values) -> list[str]:
        return [v.decode() for v in values]

    lanes = {
        (t, e, k): strings(r.lrange(f"{prefix}q:{t}:{e}:{k}", 0, -1)) for _, t, e, k in scan("q:*")
    }
    assert all(lanes.values()), "an empty lane key was left behind"
    in_rotation, parked = Counter(), Counter()
    for _, t, k in scan("rot:*"):
        for e in strings(r.lrange(f"{prefix}rot:{t}:{k}", 0, -1)):
            in_rotation[(t, e, k)] += 1
    for _, e, k in scan("park:*"):
        for t in strings(r.zrange(f"{prefix}park:{e}:{k}", 0, -1)):
            parked[(t, e, k)] += 1
    places = in_rotation + parked
    listed = set(strings(r.smembers(prefix + "parked")))
    assert {e for _, e, _ in parked} <= listed, "an endpoint with parked lanes is not listed"
    assert set(places) == set(lanes), "a lane is lost, or listed while empty"
    assert max(places.values(), default=1) == 1, "a lane is listed twice"

    paused = set(strings(r.smembers(keys.paused)))
    due = strings(r.zrange(keys.due, 0, -1))
    asleep = {m[1:] for m in due if m.startswith("t")}  # out of tokens: out of vt until due
    eligible = {t for t, _, _ in in_rotation} - paused - asleep
    assert set(strings(r.zrange(keys.vt, 0, -1))) == eligible

    leases = [m.split("|") for m in strings(r.zrange(keys.leases, 0, -1))]
    delayed = [m.split("|") for m in strings(r.zrange(keys.delayed, 0, -1))]
    fifo = [m.split("|") for m in strings(r.lrange(keys.fifo, 0, -1))]
    answered = {m.decode() for m in r.smembers(keys.prefix + "answered")}
    assert answered <= set(strings(r.zrange(keys.leases, 0, -1))), "an answered lease leaked"
    open_leases = [m for m in leases if "|".join(m) not in answered]  # still holding a slot
    busy = {e.decode(): int(s) for e, s in r.zrange(keys.busy, 0, -1, withscores=True)}
    assert busy == dict(Counter(e for _, _, e, _, _ in open_leases))
    if sched.mode == "fair":
        # Liveness: a parked lane has something that will offer it its endpoint again: a
        # lease whose end calls fill, a token due (a pick wakes it), a candidate lane of
        # the same endpoint in a rotation, or a cap of 0 that only an operator can raise.
        awaited = {m[1:] for m in due if m.startswith("e")}
        candidates = {e for t, e, _ in in_rotation if t not in paused}
        for t, e, k in parked:
            row = endpoint_row(sched, e)
            m, rm = int(row.get("m", 0)), int(row.get("rm", 0))
            cap = m if k == "f" else min(m, rm)
            woken = busy.get(e, 0) > 0 or e in awaited or e in candidates or cap == 0
            assert woken, f"lane {t}:{e}:{k} is parked with nothing to wake it"
    for e, in_flight in busy.items():
        retry_leases = sum(1 for _, _, le, k, _ in open_leases if le == e and k == "r")
        assert int(endpoint_row(sched, e).get("ri", 0)) == retry_leases
        assert in_flight >= 0

    rows = {t.decode(): tenant_row(v) for t, v in r.hgetall(keys.tenants).items()}
    tenants = set(rows)
    held = {t for t, _, _ in lanes} | {m[1] for m in leases + delayed + fifo}
    assert tenants == held, "a tenant hash leaked, or a busy tenant has none"
    counted = {f.decode(): int(v) for f, v in r.hgetall(keys.count).items()}
    endpoints = {e.decode() for e in r.hkeys(keys.endpoints)}
    expected_fields = {"t" + t for t in tenants} | {"e" + e for e in endpoints}
    assert set(counted) == expected_fields, "a count leaked, or a tenant or endpoint has none"
    for t in tenants:
        row = rows[t]
        row["n"] = counted["t" + t]
        row["i"] = row["n"] - row["f"] - row["r"] - row["d"]  # in flight, as the snapshot
        for k in "fr":
            queued = sum(len(ids) for (lt, _, lk), ids in lanes.items() if lt == t and lk == k)
            queued += sum(1 for m in fifo if m[1] == t and m[3] == k)
            assert row[k] == queued
        assert row["d"] == sum(1 for m in delayed if m[1] == t)
        assert row["i"] == sum(1 for m in leases if m[1] == t)
        if sched.mode == "fair" and any(lt == t for lt, _, _ in lanes):
            oldest = min(ulid_time_ms(ids[0]) for (lt, _, _), ids in lanes.items() if lt == t)
            # Kept in 1024-millisecond steps: never younger than the truth, nor a step older.
            age = int(r.zscore(keys.age, t))
            assert age <= oldest and age // 1024 == oldest // 1024, (age, oldest)

    ids = Counter(i for lane in lanes.values() for i in lane)
    ids.update(m[0] for m in leases + delayed + fifo)
    for e in endpoints:
        n = sum(c for i, c in ids.items() if _endpoint_of(lanes, leases, delayed, fifo, i) == e)
        assert counted["e" + e] == n
    return ids


TENANT_ROW = ("w", "rr", "f", "r", "d", "c", "u", "s", "bt", "bs")  # lua/lib.lua, `tenants`
# lua/lib.lua, `endpoints`
ENDPOINT_ROW = ("m", "rm", "ri", "rr", "al", "lf", "lb", "lt", "lp", "lw", "bt", "bs")


def tenant_row(packed: bytes) -> dict[str, float]:
    """A tenant's row in the `tenants` hash, by name (its saved virtual time, -1 when it has
    none, left out then)."""
    row = _row(packed, TENANT_ROW)
    if row["s"] < 0:
        del row["s"]
    return row


def endpoint_row(sched: Scheduler, endpoint_id: int | str) -> dict[str, float]:
    """An endpoint's row in the `endpoints` hash, by name ({} without one)."""
    packed = sched.connection.hget(sched.keys.endpoints, str(endpoint_id))
    return _row(packed, ENDPOINT_ROW) if packed is not None else {}


def _row(packed: bytes, names: tuple[str, ...]) -> dict[str, float]:
    """lua/lib.lua packs rows as little-endian doubles (Redis's struct library)."""
    return dict(zip(names, struct.unpack(f"<{len(names)}d", packed), strict=True))


def _endpoint_of(lanes, leases, delayed, fifo, delivery_id) -> str:
    for (_, e, _), ids in lanes.items():
        if delivery_id in ids:
            return e
    return next(m[2] for m in leases + delayed + fifo if m[0] == delivery_id)


GLOBAL_KEYS = {"stats", "wake", "epoch:5"}


def assert_no_tenant_keys(sched: Scheduler) -> None:
    left = {k[len(sched.keys.prefix) :] for k in schedule_keys(sched)}
    assert left <= GLOBAL_KEYS, f"keys left behind: {sorted(left - GLOBAL_KEYS)}"


# --- hand-out, drain, keys -----------------------------------------------------------
