"""The Metrics page's chart of one class, laid out here and drawn by the template as inline SVG
(as the dashboard's: admin/charts.py): a bar per slot (runs, the failed part red), the mean run
time of each slot as a line on its own scale, and a vertical line at each deploy mark."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from ...admin.charts import Bar, Tick, nice_ceiling
from .api import ClassHistory, Mark

WIDTH, HEIGHT = 900, 160
LEFT, RIGHT, TOP, BOTTOM = 56, 56, 10, 22


@dataclasses.dataclass
class MarkLine:
    x: float
    label: str


@dataclasses.dataclass
class ClassChart:
    width: int
    height: int
    left: int
    right_x: int
    bottom_y: float
    bars: list[Bar]
    ticks: list[Tick]
    labels: list[tuple[float, str]]
    line: str  # the mean run time's polyline points ("x,y x,y ...")
    ms_top: str  # what the top of the line's scale stands for
    marks: list[MarkLine]


def class_chart(history: ClassHistory, marks: Sequence[Mark], start: float, end: float, step: int) -> ClassChart:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    series = history.series
    top = nice_ceiling(max([p.processed for p in series] + [0]))
    means = [p.ms / p.processed if p.processed else None for p in series]
    ms_top = max([m for m in means if m is not None] + [0.0]) or 1.0
    slot = plot_w / max(len(series), 1)
    bottom = TOP + plot_h
    bars, labels, points = [], [], []
    every = max(1, len(series) // 6)
    fmt = "%H:%M" if step == 60 else "%m-%d %H:00"
    for i, p in enumerate(series):
        x = LEFT + i * slot
        when = time.strftime(fmt, time.gmtime(p.start))
        for kind, count in (("processed", p.processed), ("failed", p.failed)):
            if count:
                h = plot_h * count / top
                bars.append(Bar(round(x, 1), round(bottom - h, 1), round(max(slot * 0.8, 0.5), 1), round(h, 1), kind,
                                f"{when} UTC: {count:,} {kind}"))
        mean = means[i]
        if mean is not None:
            points.append(f"{round(x + slot * 0.4, 1)},{round(bottom - plot_h * mean / ms_top, 1)}")
        if i % every == 0:
            labels.append((round(x, 1), when))
    span = max(end - start, 1.0)
    lines = [MarkLine(round(LEFT + plot_w * (m.at - start) / span, 1), m.label) for m in marks if start <= m.at <= end]
    ticks = [Tick(round(bottom - plot_h * f, 1), f"{int(top * f):,}") for f in (0.0, 0.5, 1.0)]
    return ClassChart(WIDTH, HEIGHT, LEFT, WIDTH - RIGHT, bottom, bars, ticks, labels, " ".join(points),
                      f"{ms_top:,.0f} ms", lines)
