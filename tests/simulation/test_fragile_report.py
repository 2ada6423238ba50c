"""The fragile-endpoints figures from what a receiver saw: plain arithmetic, no run."""

from simulation.report import Observed, fragile

START = 1_000_000.0


def _observed(records: list[list], changes: list[tuple[float, int]]) -> Observed:
    return Observed(
        scenario="fragile-endpoints",
        label="static",
        started_at=START,
        accepted={},
        records=records,
        receiver_open_max={"fragile": 7},
        capacity_changes=changes,
        bounds={"service_s": 0.1, "window_s": 6.0},
    )


def _answers(second: float, ok: int, overloaded: int = 0) -> list[list]:
    spread = [second + (n + 0.5) / (ok + overloaded) for n in range(ok + overloaded)]
    return [
        [f"E{second}-{n}", "/fragile/t/0", START + at, 200 if n < ok else 503, 0]
        for n, at in enumerate(spread)
    ]


def test_goodput_overload_and_convergence_are_counted_per_phase() -> None:
    # C = 2 for 2 s (20/s at 0.1 s each), then 1 (10/s) for 2 s, then 2 again.
    changes = [(0.0, 2), (2.0, 1), (4.0, 2)]
    records = [
        *_answers(0, 20),
        *_answers(1, 20),
        *_answers(2, 5, overloaded=5),  # overloaded just after the change...
        *_answers(3, 10),  # ...then within reach: not 2 good seconds in the phase
        *_answers(4, 18),
        *_answers(5, 18),  # 36 of 40 in two seconds: 0.9 of the new capacity
        ["other", "/ok/t/0", START + 1, 200, 0],  # another endpoint's: not counted
        ["late", "/fragile/t/0", START + 6.5, 200, 0],  # after the window: not counted
    ]
    figures = fragile(_observed(records, changes))
    assert figures["capacity_per_s"] == round((2 * 20 + 2 * 10 + 2 * 20) / 6, 1)
    assert figures["goodput_per_s"] == round(91 / 6, 1)
    assert figures["goodput_to_capacity"] == round(91 / 100, 3)
    assert figures["overload_error_share"] == round(5 / 96, 4)
    assert figures["fragile_ok_per_s"] == [20, 20, 5, 10, 18, 18]
    assert figures["fragile_overload_per_s"] == [0, 0, 5, 0, 0, 0]
    # The halving never met its capacity in a clean two-second window (the first has
    # 503s in it); the doubling did at once.
    assert figures["converge_s_by_change"] == [None, 2.0]
    assert figures["converge_s"] is None
    assert figures["fragile_open_max"] == 7


def test_a_change_made_late_counts_from_when_it_was_made() -> None:
    changes = [(0.0, 2), (2.4, 1)]  # the runner polls: a change lands a little late
    records = [*_answers(0, 20), *_answers(1, 20), *_answers(2, 12), *_answers(3, 10)]
    records += [*_answers(4, 10), *_answers(5, 10)]
    figures = fragile(_observed(records, changes))
    assert figures["capacity_per_s"] == round((2.4 * 20 + 3.6 * 10) / 6, 1)
    # The first whole second after 2.4 s is 3: the window 3-5 s meets 10/s.
    assert figures["converge_s_by_change"] == [round(5 - 2.4, 2)]
    assert figures["converge_s"] == round(5 - 2.4, 2)
