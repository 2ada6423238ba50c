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
    plot_w, plot_h = width - left - right, height - top - bottom
    visible = [p for p in points if since <= p.at <= until]
    values = [p.value for p in visible if p.value is not None]
    if visible:
        # Up to the whole window, but no emptier than needed: a flood that began three
        # minutes ago is a shape over ten minutes, not a spike at the edge of an hour.
        since = max(since, min(visible[0].at, until - CHART_MIN_SPAN))
    peak = max(values, default=0.0)
    step = _nice_step(max(peak, 1e-9) / 4, AGE_STEPS if duration_axis else None)
    if peak <= 0:
        step = AGE_STEPS[2] if duration_axis else 1
    top_value = step * max(1, math.ceil(peak / step)) if peak > 0 else step * 4
    span = (until - since).total_seconds() or 1

    def x(at: datetime) -> float:
        return left + (at - since).total_seconds() / span * plot_w

    def y(value: float) -> float:
        return top + plot_h - min(value, top_value) / top_value * plot_h

    segments: list[list[tuple[float, float]]] = [[]]
    for p in visible:
        if p.value is None:
            segments.append([])
        else:
            segments[-1].append((round(x(p.at), 1), round(y(p.value), 1)))
    base = top + plot_h
    line_parts, area_parts = [], []
    for coords in (segment for segment in segments if segment):
        line_parts.append("M" + " L".join(f"{cx},{cy}" for cx, cy in coords))
        area_parts.append(
            f"M{coords[0][0]},{base} "
            + " ".join(f"L{cx},{cy}" for cx, cy in coords)
            + f" L{coords[-1][0]},{base} Z"
        )
    line = " ".join(line_parts)
    area = " ".join(area_parts)
    y_ticks = [Tick(round(y(step * i), 1), fmt(step * i)) for i in range(int(top_value / step) + 1)]
    tick_minutes = next((m for limit, m in TICK_MINUTES if span <= limit), 60)
    first = since.replace(second=0, microsecond=0)
    first += timedelta(minutes=(-first.minute) % tick_minutes)
    if first < since:
        first += timedelta(minutes=tick_minutes)
    x_ticks = []
    at = first
    local = timezone.get_current_timezone()
    while at <= until:
        x_ticks.append(Tick(round(x(at), 1), f"{at.astimezone(local):%H:%M}"))
        at += timedelta(minutes=tick_minutes)
    return Chart(
        title=title,
        width=width,
        height=height,
        left=left,
        top=top,
        plot_width=plot_w,
        plot_height=plot_h,
        line=line,
        area=area,
        y_ticks=y_ticks,
        x_ticks=x_ticks,
        latest=fmt(values[-1]) if values else "no samples yet",
        empty=not values,
        color=color,
    )
