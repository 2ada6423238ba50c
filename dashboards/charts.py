"""Server-side SVG charts of a history series (the markup is templates/dashboards/chart.svg)."""

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from dashboards.history import Point

CHART_MIN_SPAN = timedelta(minutes=10)
# (span of the chart up to this many seconds, minutes between x-axis ticks)
TICK_MINUTES = ((15 * 60, 2), (30 * 60, 5), (3600, 10))
AGE_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 28800, 86400)


@dataclass(frozen=True)
class Tick:
    pos: float
    label: str


@dataclass(frozen=True)
class Chart:
    title: str
    width: int
    height: int
    left: int
    top: int
    plot_width: int
    plot_height: int
    line: str  # SVG path of the line: one "M… L…" run per stretch with samples
    area: str  # SVG path of the filled area under each run
    y_ticks: list[Tick]
    x_ticks: list[Tick]
    latest: str  # the newest value, formatted
    empty: bool
    color: str

    @property
    def right(self) -> int:
        return self.left + self.plot_width

    @property
    def bottom(self) -> int:
        return self.top + self.plot_height

    @property
    def middle_x(self) -> float:
        return self.left + self.plot_width / 2

    @property
    def middle_y(self) -> float:
        return self.top + self.plot_height / 2


def _nice_step(target: float, steps: Iterable[float] | None = None) -> float:
    if steps is not None:
        return next((s for s in steps if s >= target), max(steps))
    magnitude = 10 ** math.floor(math.log10(target)) if target > 0 else 1
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= target)


@dataclass(frozen=True)
class _Frame:
    """The plot's geometry: where a time and a value land on it."""

    left: int
    top: int
    plot_width: int
    plot_height: int
    since: datetime
    until: datetime
    top_value: float  # the value at the top of the plot (higher ones are drawn there)

    @property
    def span(self) -> float:
        return (self.until - self.since).total_seconds() or 1

    @property
    def base(self) -> float:
        return self.top + self.plot_height

    def x(self, at: datetime) -> float:
        return self.left + (at - self.since).total_seconds() / self.span * self.plot_width

    def y(self, value: float) -> float:
        return self.base - min(value, self.top_value) / self.top_value * self.plot_height


def build_chart(
    title: str,
    points: list[Point],
    *,
    since: datetime,
    until: datetime,
    fmt: Callable[[float], str],
    duration_axis: bool = False,
    color: str = "#2563eb",
    width: int = 640,
    height: int = 200,
) -> Chart:
    left, right, top, bottom = 64, 16, 12, 28
    visible = [p for p in points if since <= p.at <= until]
    values = [p.value for p in visible if p.value is not None]
    step, top_value = _value_scale(max(values, default=0.0), duration_axis)
    frame = _Frame(
        left=left,
        top=top,
        plot_width=width - left - right,
        plot_height=height - top - bottom,
        since=_first_shown(visible, since, until),
        until=until,
        top_value=top_value,
    )
    line, area = _paths(_runs(visible, frame), frame.base)
    return Chart(
        title=title,
        width=width,
        height=height,
        left=left,
        top=top,
        plot_width=frame.plot_width,
        plot_height=frame.plot_height,
        line=line,
        area=area,
        y_ticks=_y_ticks(frame, step, fmt),
        x_ticks=_x_ticks(frame),
        latest=fmt(values[-1]) if values else "no samples yet",
        empty=not values,
        color=color,
    )


def _first_shown(visible: list[Point], since: datetime, until: datetime) -> datetime:
    """Up to the whole window, but no emptier than needed: a flood that began three minutes
    ago is a shape over ten minutes, not a spike at the edge of an hour."""
    if not visible:
        return since
    return max(since, min(visible[0].at, until - CHART_MIN_SPAN))


def _value_scale(peak: float, duration_axis: bool) -> tuple[float, float]:
    """A round step between the y-axis ticks, and the value at the top of the plot: the
    first whole step at or above the peak (four steps when there is nothing to show)."""
    if peak <= 0:
        step = AGE_STEPS[2] if duration_axis else 1
        return step, step * 4
    step = _nice_step(max(peak, 1e-9) / 4, AGE_STEPS if duration_axis else None)
    return step, step * max(1, math.ceil(peak / step))


def _runs(visible: list[Point], frame: _Frame) -> list[list[tuple[float, float]]]:
    """The plotted points, one run per stretch with samples: a missing value breaks the line."""
    runs: list[list[tuple[float, float]]] = [[]]
    for p in visible:
        if p.value is None:
            runs.append([])
        else:
            runs[-1].append((round(frame.x(p.at), 1), round(frame.y(p.value), 1)))
    return [run for run in runs if run]


def _paths(runs: list[list[tuple[float, float]]], base: float) -> tuple[str, str]:
    """The SVG paths of the line and of the area under it, one subpath per run."""
    line_parts, area_parts = [], []
    for coords in runs:
        line_parts.append("M" + " L".join(f"{cx},{cy}" for cx, cy in coords))
        area_parts.append(
            f"M{coords[0][0]},{base} "
            + " ".join(f"L{cx},{cy}" for cx, cy in coords)
            + f" L{coords[-1][0]},{base} Z"
        )
    return " ".join(line_parts), " ".join(area_parts)


def _y_ticks(frame: _Frame, step: float, fmt: Callable[[float], str]) -> list[Tick]:
    count = int(frame.top_value / step) + 1
    return [Tick(round(frame.y(step * i), 1), fmt(step * i)) for i in range(count)]


def _x_ticks(frame: _Frame) -> list[Tick]:
    """A tick on every round TICK_MINUTES for the span, labelled in the current time zone."""
    tick_minutes = next((m for limit, m in TICK_MINUTES if frame.span <= limit), 60)
    first = frame.since.replace(second=0, microsecond=0)
    first += timedelta(minutes=(-first.minute) % tick_minutes)
    if first < frame.since:
        first += timedelta(minutes=tick_minutes)
    ticks = []
    at = first
    local = timezone.get_current_timezone()
    while at <= frame.until:
        ticks.append(Tick(round(frame.x(at), 1), f"{at.astimezone(local):%H:%M}"))
        at += timedelta(minutes=tick_minutes)
    return ticks
