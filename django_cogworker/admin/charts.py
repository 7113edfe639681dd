"""The dashboard's history chart, laid out here and drawn by the template as inline SVG.

Server-side, no JavaScript and no CDN: the template only places rectangles and
labels at the numbers computed here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

WIDTH, HEIGHT = 900, 200
LEFT, RIGHT, TOP, BOTTOM = 56, 8, 10, 22


@dataclasses.dataclass
class Bar:
    x: float
    y: float
    width: float
    height: float
    kind: str  # "processed" or "failed"
    title: str


@dataclasses.dataclass
class Tick:
    y: float
    label: str


@dataclasses.dataclass
class Chart:
    width: int
    height: int
    left: int
    bottom_y: float
    bars: list[Bar]
    ticks: list[Tick]
    labels: list[tuple[float, str]]  # (x, day) under some bars


def nice_ceiling(value: int) -> int:
    """The smallest 1, 2 or 5 times a power of ten that is at least ``value`` (at least 1)."""
    if value <= 1:
        return 1
    power = 10 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= value)


def history_chart(days: Sequence[Any]) -> Chart:
    """Two bars a day (processed, failed) for ``days`` (objects with day, processed, failed)."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    top = nice_ceiling(max([d.processed for d in days] + [d.failed for d in days] + [0]))
    slot = plot_w / max(len(days), 1)
    bar_w = slot * 0.4
    bottom = TOP + plot_h
    bars, labels = [], []
    for i, d in enumerate(days):
        x = LEFT + i * slot + slot * 0.1
        for offset, kind, count in ((0.0, "processed", d.processed), (bar_w, "failed", d.failed)):
            h = plot_h * count / top
            bars.append(Bar(round(x + offset, 1), round(bottom - h, 1), round(bar_w, 1), round(h, 1), kind,
                            f"{d.day}: {count:,} {kind}"))
        if i % 5 == 0 or i == len(days) - 1:
            labels.append((round(x + bar_w, 1), d.day[5:]))
    ticks = [Tick(round(bottom - plot_h * f, 1), f"{int(top * f):,}") for f in (0.0, 0.5, 1.0)]
    return Chart(WIDTH, HEIGHT, LEFT, bottom, bars, ticks, labels)
