"""The named protocol (delivery/scheduler/protocol.py): Python and Lua read every value
that crosses between them by name. A throwaway field put first in every record shifts
every position; the scheduler still behaves, on the plain Redis, the cluster and Redis
6.2, only if neither side counts positions. And no script indexes ARGV by a number."""

import re
from dataclasses import replace
from pathlib import Path

import pytest

from delivery.scheduler import Item, Scheduler, protocol, scripts
from tests.scheduler_helpers import T0, FakeClock, assert_no_tenant_keys, batch, check_invariants

LUA = Path(protocol.__file__).with_name("lua")
# A number where a name belongs: ARGV[5], ARGV[i + 3], `for i = 4, #ARGV`. clear.lua
# stands alone (no lib.lua, one argument of its own).
POSITIONAL = re.compile(r"ARGV\[\s*\d|ARGV\[\s*\w+\s*[-+]\s*\d|=\s*\d+\s*,\s*#ARGV")


def test_no_script_reads_an_argument_by_its_position() -> None:
    found = {
        path.name: line.strip()
        for path in LUA.glob("*.lua")
        if path.name != "clear.lua"
        for line in path.read_text().splitlines()
        if POSITIONAL.search(line.split("--", 1)[0])
    }
    assert found == {}


def test_a_record_packs_by_name_and_refuses_unknown_or_missing_names() -> None:
    assert protocol.SET_TENANT.pack({"tenant": "7", "weight": 2, "paused": "0", "rate": ""}) == [
        "7",
        2,
        "0",
        "",
    ]
    with pytest.raises(ValueError, match="missing"):
        protocol.SET_TENANT.pack({"tenant": "7"})
    with pytest.raises(ValueError, match="unknown"):
        protocol.PROMOTE.pack({"member": "m", "extra": 1})
    assert "tenant_rate = 9" in protocol.ITEM.lua() and "SIZE = 11" in protocol.ITEM.lua()


@pytest.fixture
def widened(monkeypatch: pytest.MonkeyPatch):
    """Every record with a field "throwaway" in front (sent as "~", returned as nil), and
    the scripts rebuilt from the widened protocol; the real ones again afterwards."""
    for name, record in list(vars(protocol).items()):
        if isinstance(record, protocol.Record):
            wider = replace(
                record,
                fields=("throwaway", *record.fields),
                defaults={**record.defaults, "throwaway": "~"},
            )
            monkeypatch.setattr(protocol, name, wider)
    scripts.source.cache_clear()
    scripts.library.cache_clear()
    assert "throwaway = 1" in protocol.lua_prelude()
    assert "ARGS_FIRST = 5" in protocol.lua_prelude()
    yield
    monkeypatch.undo()
    scripts.source.cache_clear()
    scripts.library.cache_clear()


@pytest.mark.usefixtures("widened")
def test_every_value_still_reaches_its_place_with_a_field_added_in_front(scheduler_conn) -> None:
    clock = FakeClock()
    sched = Scheduler(scheduler_conn, clock=clock, lease_seconds=10)
    sched.enqueue(
        [
            *batch(1, 10, 3, weight=3, max_in_flight=1, retry_max_in_flight=1, tenant_rate=500.0),
            *batch(2, 11, 2, max_in_flight=5),
            Item("01" + "0" * 24, 3, 12, lane="retry", due_at=T0 + 60),
        ]
    )
    assert sum(check_invariants(sched).values()) == 6

    picked = sched.pick("w1", max_items=10)
    by_endpoint = {}
    for lease in picked.leases:
        by_endpoint.setdefault(lease.endpoint_id, []).append(lease)
        assert (lease.tenant_id, lease.lane) in {(1, "fresh"), (2, "fresh")}
    assert len(by_endpoint[10]) == 1  # the cap of 1 came through as a cap, not a weight
    assert len(by_endpoint[11]) == 2
    assert picked.leases[0].deadline == pytest.approx(T0 + 10)

    snap = sched.snapshot(top_n=5, age_buckets=(1.0, 60.0))
    assert snap.in_flight == 3 and snap.delayed_depth == 1 and snap.fresh_depth == 2
    tenants = {row.tenant_id: row for row in snap.tenants}
    assert tenants[1].weight == 3 and tenants[1].rate_per_second == 500.0
    endpoint = {row.endpoint_id: row for row in snap.endpoints}[10]
    assert (endpoint.max_in_flight, endpoint.retry_max_in_flight) == (1, 1)

    first = by_endpoint[10][0]
    assert sched.answered([first]) == 1
    assert sched.renew(picked.leases) == []
    assert sched.ack([first], outcome="done") == []
    assert sched.retry_later_many([(by_endpoint[11][0], T0 + 5)]) == [True]
    assert sched.promote("01" + "0" * 24, 3, 12)
    sched.set_tenant(2, weight=2, paused=True)
    sched.set_endpoint(10, max_in_flight=2, retry_max_in_flight=1)
    assert sched.pause_endpoint(11, T0 + 30)
    assert sched.counters() == {"done": 1, "retry": 1}

    rest = []
    for _ in range(5):
        clock.advance(40)
        leases = sched.pick("w1", max_items=10).leases
        sched.ack(leases)
        rest += leases
        sched.ack([lease for lease in picked.leases if lease is not first])
    sched.set_tenant(2, weight=2, paused=False)
    for _ in range(3):
        clock.advance(40)
        leases = sched.pick("w1", max_items=10).leases
        sched.ack(leases)
        rest += leases
    handed = {lease.delivery_id for lease in [*picked.leases, *rest]}
    assert len(handed) == 6
    assert_no_tenant_keys(sched)
