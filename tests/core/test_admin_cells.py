"""Narrow changelist cells: clipped values and compact times keep the whole value in a title."""

from datetime import UTC, datetime

from core.admin_cells import clip, clipped, timed, when
from tests.factories import make_endpoint, make_tenant

ULID = "01JQ8Z6X5E7Y3K2M1N0P9R8S7T"
NOW = datetime(2025, 6, 10, 15, 0, tzinfo=UTC)


def test_a_short_value_is_shown_as_it_is() -> None:
    assert clip("shop.example", 20) == "shop.example"
    assert clip(None, 20) == ""


def test_a_long_value_keeps_its_head_and_the_whole_in_the_title() -> None:
    url = "https://hooks.example.com/" + "a" * 60
    cell = clip(url, 20)
    assert f'title="{url}"' in cell
    assert ">https://hooks.examp…</span>" in cell


def test_an_id_keeps_its_tail_where_rows_made_together_differ() -> None:
    cell = clip(ULID, 11, keep_end=True)
    assert f'title="{ULID}"' in cell
    assert "…\u2060" + ULID[-10:] in cell


def test_a_clipped_value_is_escaped() -> None:
    cell = clip("<script>alert(1)</script>" * 3, 10)
    assert "<script>" not in cell


def test_times_are_compact_by_how_recent_they_are() -> None:
    def shown(moment: datetime) -> str:
        return when(moment, now=NOW).split(">", 1)[1].split("<", 1)[0]

    assert shown(datetime(2025, 6, 10, 9, 5, 7, tzinfo=UTC)) == "09:05:07"
    assert shown(datetime(2025, 3, 9, 14, 3, tzinfo=UTC)) == "Mar 9 14:03"
    assert shown(datetime(2023, 12, 31, 23, 0, tzinfo=UTC)) == "2023-12-31"
    assert 'title="2025-03-09 14:03:00 UTC"' in when(datetime(2025, 3, 9, 14, 3, tzinfo=UTC), NOW)
    assert when(None) is None


def test_columns_follow_a_lookup_and_sort_by_it(db) -> None:
    endpoint = make_endpoint(make_tenant(), "https://hooks.example.com/" + "b" * 60)
    column = clipped("endpoint__url", 16, description="endpoint")
    assert column.short_description == "endpoint" and column.admin_order_field == "endpoint__url"
    holder = type("Row", (), {"endpoint": endpoint})()
    assert "https://hooks.e…" in column(holder)
    assert clipped("endpoint__url", 16)(type("Row", (), {"endpoint": None})()) == ""
    started = timed("created_at")
    assert started.short_description == "created at"
    assert "<time" in started(endpoint.tenant)
