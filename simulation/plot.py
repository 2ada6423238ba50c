"""The --plot picture: an SVG written by hand (no plotting dependency).

Latency panels are cumulative distributions on a log time axis: "what share of the
events had arrived within x". A curve far to the left is good. The y axis is linear up
to p90 and stretched above it, so the p99 a customer feels is as easy to read as the
median. The retry storm adds a panel of requests per second to the recovering
endpoint, its outage shaded.
"""

import math
from html import escape
from pathlib import Path
from typing import Any

COLORS = {
    "fair": "#1b7837",
    "fifo": "#c51b7d",
    "no-caps": "#d95f02",
    "no-hang": "#4575b4",
    "static": "#4575b4",
    "adaptive": "#1b7837",
}
DASHES = ["", "7 4", "2 3"]
NAMES = {
    "quiet": "quiet tenants",
    "loud": "loud tenant",
    "healthy": "healthy endpoints",
    "other": "other tenants",
    "large": "large tenant",
    "fragile": "fragile endpoint's tenant",
}
GROUPS = {
    "flood": ["quiet", "loud"],
    "slow-endpoints": ["healthy"],
    "retry-storm": ["other", "large"],
    "fragile-endpoints": ["quiet", "fragile"],
}
TITLES = {
    "flood": "Flood: latency from acceptance to arrival",
    "slow-endpoints": "Slow endpoints: healthy endpoints' latency, acceptance to arrival",
    "retry-storm": "Retry storm: latency from acceptance to arrival",
    "fragile-endpoints": "Fragile endpoint: latency from acceptance to arrival (the window's)",
}
WIDTH, PLOT_HEIGHT, LEFT, RIGHT = 900, 250, 70, 880
TITLE_SPACE, AXIS_SPACE, LEGEND_LINE = 34, 30, 17
BODY = 0.65  # share of the plot's height for p0-p90; the rest is p90 to p99.9
TAIL_DECADES = 3


def _color(label: str) -> str:
    return COLORS["no-caps"] if "no-caps" in label else COLORS.get(label, "#555555")


def _text(
    x: float, y: float, body: str, size: int = 12, anchor: str = "start", **attrs: str
) -> str:
    extra = "".join(f' {key.replace("_", "-")}="{value}"' for key, value in attrs.items())
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{extra}>{escape(body)}</text>'


def _line(
    x1: float,
    y1: float,
    x2: float,
    y2: float,
    color: str = "#e4e4e4",
    width: float = 1,
    dash: str = "",
) -> str:
    return f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{color}" stroke-width="{width}" stroke-dasharray="{dash}"/>'


def _polyline(points: list[tuple[float, float]], color: str, dash: str = "") -> str:
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>'


def _legend(top: float, entries: list[tuple[str, str, str]]) -> list[str]:
    out = []
    for index, (color, dash, label) in enumerate(entries):
        y = top + index * LEGEND_LINE
        out += [_line(LEFT, y - 4, LEFT + 30, y - 4, color, 2, dash), _text(LEFT + 36, y, label)]
    return out


def _cdf_panel(top: float, scenario: str, runs: dict[str, dict]) -> tuple[list[str], float]:
    series = [
        (label, group, values)
        for label, result in runs.items()
        for group in GROUPS[scenario]
        if (values := result.get("latencies_ms", {}).get(group))
    ]
    out = [_text(WIDTH / 2, top + 20, TITLES[scenario], 15, "middle", font_weight="bold")]
    if not series:
        return [*out, _text(WIDTH / 2, top + 80, "nothing was delivered", 13, "middle")], 120
    y_top = top + TITLE_SPACE
    bottom = y_top + PLOT_HEIGHT
    low = math.floor(math.log10(max(0.1, min(values[0] for *_, values in series))))
    high = max(math.ceil(math.log10(max(1.0, max(values[-1] for *_, values in series)))), low + 1)

    def x_of(ms: float) -> float:
        return LEFT + (math.log10(max(ms, 10**low)) - low) / (high - low) * (RIGHT - LEFT)

    def y_of(share: float) -> float:
        if share <= 0.9:
            return bottom - share / 0.9 * BODY * PLOT_HEIGHT
        decades = min(-math.log10(max(1 - share, 10**-TAIL_DECADES)), TAIL_DECADES) - 1
        return bottom - (BODY + decades / (TAIL_DECADES - 1) * (1 - BODY)) * PLOT_HEIGHT

    for decade in range(low, high + 1):
        x = x_of(10**decade)
        name = f"{10**decade:g} ms" if decade < 3 else f"{10 ** (decade - 3):g} s"
        out += [_line(x, y_top, x, bottom), _text(x, bottom + 16, name, 11, "middle")]
    for name in ("0%", "25%", "50%", "75%", "90%", "99%", "99.9%"):
        y = y_of(float(name[:-1]) / 100)
        out += [_line(LEFT, y, RIGHT, y), _text(LEFT - 6, y + 4, name, 11, "end")]
    middle = y_top + PLOT_HEIGHT / 2
    out.append(
        _text(
            16,
            middle,
            "share of events arrived",
            12,
            "middle",
            transform=f"rotate(-90 16 {middle:.0f})",
        )
    )
    legend = []
    for label, group, values in series:
        step = max(1, len(values) // 500)  # a few hundred points draw the same curve
        points = [
            (x_of(value), y_of((index + 1) / len(values)))
            for index, value in enumerate(values)
            if index % step == 0 or index == len(values) - 1
        ]
        dash = DASHES[GROUPS[scenario].index(group) % len(DASHES)]
        out.append(_polyline(points, _color(label), dash))
        p50, p99 = (
            values[math.ceil(0.5 * len(values)) - 1],
            values[math.ceil(0.99 * len(values)) - 1],
        )
        legend.append(
            (
                _color(label),
                dash,
                f"{label}, {NAMES.get(group, group)}: p50 {_duration(p50)}, p99 {_duration(p99)} ({len(values):,} events{_rounds(runs[label])})",
            )
        )
    out += _legend(bottom + AXIS_SPACE + 12, legend)
    return out, TITLE_SPACE + PLOT_HEIGHT + AXIS_SPACE + LEGEND_LINE * len(legend) + 16


def _rounds(run: dict[str, Any]) -> str:
    return f", {run['rounds']} rounds" if run.get("rounds", 1) > 1 else ""


def _duration(ms: float) -> str:
    return f"{ms:,.0f} ms" if ms < 10_000 else f"{ms / 1000:,.1f} s"


def _rate_panel(top: float, runs: dict[str, dict]) -> tuple[list[str], float]:
    rates = {label: result.get("storm_requests_per_s") or [0] for label, result in runs.items()}
    seconds = max(len(values) for values in rates.values())
    peak = max(max(values) for values in rates.values()) or 1
    scale = 10 ** math.floor(math.log10(peak))
    peak = math.ceil(peak / scale) * scale
    y_top = top + TITLE_SPACE
    bottom = y_top + PLOT_HEIGHT

    def x_of(second: float) -> float:
        return LEFT + second / seconds * (RIGHT - LEFT)

    def y_of(rate: float) -> float:
        return bottom - rate / peak * PLOT_HEIGHT

    title = "Retry storm: requests per second to the recovering endpoint"
    count = next(iter(runs.values())).get("rounds", 1)
    title += f" (round 1 of {count})" if count > 1 else ""
    out = [_text(WIDTH / 2, top + 20, title, 15, "middle", font_weight="bold")]
    outage = next((result["outage"] for result in runs.values() if result.get("outage")), None)
    if outage:
        x0, x1 = x_of(outage[0]), x_of(outage[1])
        out.append(
            f'<rect x="{x0:.1f}" y="{y_top:.1f}" width="{x1 - x0:.1f}" height="{PLOT_HEIGHT}" fill="#fbe3e3"/>'
        )
        out.append(_text(x0 + 4, y_top + 14, "down (503)", 11))
    for tick in range(0, int(peak) + 1, max(1, int(peak) // 5)):
        out += [
            _line(LEFT, y_of(tick), RIGHT, y_of(tick)),
            _text(LEFT - 6, y_of(tick) + 4, str(tick), 11, "end"),
        ]
    for second in range(0, seconds + 1, max(1, seconds // 10)):
        out.append(_text(x_of(second), bottom + 16, f"{second} s", 11, "middle"))
    legend = []
    for label, values in rates.items():
        steps = [
            point
            for second, n in enumerate(values)
            for point in ((x_of(second), y_of(n)), (x_of(second + 1), y_of(n)))
        ]
        out.append(_polyline(steps, _color(label)))
        result = runs[label]
        legend.append(
            (
                _color(label),
                "",
                f"{label}: peak {result.get('storm_peak_rps_after_recovery')}/s after the recovery, retry requests open at once: at most {result.get('storm_retry_open_max')}",
            )
        )
    out += _legend(bottom + AXIS_SPACE + 12, legend)
    return out, TITLE_SPACE + PLOT_HEIGHT + AXIS_SPACE + LEGEND_LINE * len(legend) + 16


def write_plot(path: Path, scenario: str, runs: dict[str, Any]) -> None:
    elements, height = _cdf_panel(0, scenario, runs)
    if scenario == "retry-storm":
        more, extra = _rate_panel(height + 10, runs)
        elements += more
        height += extra + 10
    body = "\n".join(elements)
    path.write_text(
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}" '
        f'viewBox="0 0 {WIDTH} {height:.0f}" font-family="sans-serif">\n'
        f'<rect width="100%" height="100%" fill="white"/>\n{body}\n</svg>\n'
    )
