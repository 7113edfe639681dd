"""What every section's report shares: numbers and tables for docs/benchmarks.md, and the sentences
on the machine's other load and on where a section run alone was measured."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

# The drain that "vs ref" columns compare with.
REFERENCE = "cogworker-reliable-c10"


def fmt(x: Any, digits: int = 3) -> str:
    """A number for a table: thousands separators, about ``digits`` significant figures."""
    if x is None or x == "":
        return "–"
    if isinstance(x, str):
        return x
    if isinstance(x, int) or x == 0 or abs(x) >= 10 ** (digits - 1):
        return f"{x:,.0f}"
    decimals = digits - 1 - math.floor(math.log10(abs(x)))
    return f"{x:,.{max(decimals, 0)}f}"


def table(header: list[str], rows: list[list[Any]], align: str = "") -> str:
    align = align or "l" + "r" * (len(header) - 1)
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    out += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


class Page:
    """Lines of Markdown being written: ``add(line)``, then ``text()`` (a section's ``report``)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, line: str) -> None:
        self.lines.append(line)

    def text(self) -> str:
        return "\n".join(self.lines)


def machine_line(m: dict[str, Any]) -> str:
    """``2 CPUs (AMD EPYC, cpuidle driver haltpoll)`` (older results lack the driver: nothing is said)."""
    idle = f", cpuidle driver {m['cpuidle_driver'] or 'none'}" if "cpuidle_driver" in m else ""
    return f"{m['nproc']} CPUs ({m['cpu_model']}{idle})"


def other_load(drains: dict[str, Any], name: Callable[[Any], str]) -> str | None:
    """What the drains say of the machine's other load (``name``: a drain's name in the sentence)."""
    other = {name(d): d["other_cpu_cores"] for d in drains.values() if d.get("other_cpu_cores", 0) >= 0.15}
    if other:
        return ("Other load on the machine during some drains (CPU cores busy outside the worker, Redis and the "
                "bench; those figures are less trustworthy): " + ", ".join(f"{k} {fmt(x)}" for k, x in other.items())
                + ".")
    if any("other_cpu_cores" in d for d in drains.values()):
        return ("The machine was otherwise quiet during every drain (under 0.15 core busy outside the worker, "
                "Redis and the bench, within the accounting noise of about ±0.1 core).")
    return None


def source_of(res: dict[str, Any], section: str) -> dict[str, Any] | None:
    """The run a section was merged in from (report.merge), or None: it is the first file's."""
    return res.get("merged", {}).get(section)


def measured_where(add: Callable[[str], None], res: dict[str, Any], section: str) -> None:
    """The line saying where a section run on its own was measured: its run, or this one's machine."""
    source = source_of(res, section)
    if source:
        add(f"Measured in another run than the sections above: {source['timestamp']}, against django-cogworker "
            f"{source['git']}, on {source['machine']}: `python bench/run.py {' '.join(source['argv'])}`.")
    else:
        add(f"On {machine_line(res['machine'])}; alone: `python bench/run.py --sections {section}`.")
