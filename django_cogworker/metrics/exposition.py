"""The Prometheus text exposition format (version 0.0.4), written by hand: a few gauges and
counters don't earn ``prometheus_client`` a place in every install.

What needs care is escaping: a label value is anyone's queue name or job class, so a
backslash, a double quote or a newline in it must not end the value or the line (which would
make the scraper reject the whole page, or read a sample of the pusher's making).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
TYPES = ("counter", "gauge", "summary", "histogram", "untyped")


@dataclasses.dataclass
class Family:
    """One metric: its HELP and TYPE lines, and its samples ``(suffix, labels, value)``; the suffix
    is "" but for a summary's or a histogram's ``_sum`` and ``_count`` (and a histogram's ``_bucket``)."""

    name: str
    type: str
    help: str
    samples: list[tuple[str, Mapping[str, str], float]] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name) or self.type not in TYPES:
            raise ValueError(f"not a metric name and type: {self.name!r} {self.type!r}")

    def add(self, value: float, suffix: str = "", **labels: str) -> Family:
        self.samples.append((suffix, labels, value))
        return self


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def number(value: float) -> str:
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def render(families: Iterable[Family]) -> str:
    """The page: for each family its HELP and TYPE lines, then its samples; a final newline."""
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.type}")
        for suffix, labels, value in family.samples:
            if labels:
                if not all(_LABEL.match(k) for k in labels):
                    raise ValueError(f"not label names: {sorted(labels)!r}")
                text = ",".join(f'{k}="{escape_label(_utf8(v))}"' for k, v in labels.items())
                lines.append(f"{family.name}{suffix}{{{text}}} {number(value)}")
            else:
                lines.append(f"{family.name}{suffix} {number(value)}")
    return "\n".join(lines) + "\n"


def _utf8(text: str) -> str:
    """``text`` as UTF-8 can carry it (a lone surrogate, from a queue name that isn't UTF-8, escaped)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
