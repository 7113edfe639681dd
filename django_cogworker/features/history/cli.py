"""``manage.py cogworker metrics [--minutes N] [--class NAME] [--json]`` and ``cogworker mark LABEL``."""

from __future__ import annotations

from ...cli.actions import Outcome
from ...cli.listings import Listing
from ...push.payload import printable
from . import api


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def listing(minutes: int, job_class: str | None = None) -> Listing:
    """One row per class, the busiest by run time first; the document is the window's."""
    window = api.read(minutes, job_class=job_class)
    rows = [[printable(name), c.processed, c.failed, f"{c.ms_total / 1000:,.1f}s", _ms(c.ms_mean), _ms(c.p50),
             _ms(c.p95), _ms(c.p99)] for name, c in window.classes.items()]
    note = None
    if window.step == 3600:
        note = f"read by the hour: the {round((window.end - window.start) / 3600)} hours up to now"
    if not rows:
        which = f" for {printable(job_class)}" if job_class else ""
        note = f"no runs counted in the last {minutes} minute(s){which}"
    return Listing(["CLASS", "PROCESSED", "FAILED", "TOTAL", "MEAN MS", "P50 MS", "P95 MS", "P99 MS"], rows,
                   window.document(), note)


def mark(label: str) -> Outcome:
    try:
        made = api.add_mark(label)
    except ValueError as exc:
        return Outcome(failed=[str(exc)])
    return Outcome(done=[f"marked {printable(made.label)!s} at {made.at:.0f}"])
