"""The Metrics page: the metrics history over the chosen hours, by job class.

Classes by total run time, with runs, failures, mean and p50/p95/p99 (from the buckets); a chart
per class (the busiest ``CHARTS``) with the deploy marks as vertical lines. The window, the class
and the queue are GET parameters, so a filtered view is a link to keep. Read only, through
``api.read`` (features/history/api.py).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse

from ...admin.views import guard, render_page
from . import api
from .chart import class_chart

HOURS = (1, 3, 6, 12, 24, 72, 168, 720)  # the windows offered; 168 and 720: a week, 30 days (by the hour)
CHARTS = 20  # classes charted, the busiest by run time (the table lists them all)


def _ms(value: float | None) -> str:
    """A run time for the table: ms under 10 s, seconds above."""
    if value is None:
        return "-"
    return f"{value:,.1f} ms" if value < 10_000 else f"{value / 1000:,.1f} s"


@guard(actions=False)
def metrics(request: HttpRequest, *, site: Any) -> HttpResponse:
    try:
        hours = int(request.GET.get("hours", "1"))
    except ValueError:
        hours = 1
    hours = hours if hours in HOURS else 1
    job_class = request.GET.get("class") or None
    queue = request.GET.get("queue") or None
    window = api.read(hours * 60, job_class=job_class, queue=queue)
    histories = list(window.classes.values())
    rows = [{"job_class": h.job_class, "processed": h.processed, "failed": h.failed, "total": _ms(h.ms_total),
             "mean": _ms(h.ms_mean), "p50": _ms(h.p50), "p95": _ms(h.p95), "p99": _ms(h.p99)} for h in histories]
    charts = [(history, class_chart(history, window.marks, window.start, window.end, window.step))
              for history in histories[:CHARTS]]
    return render_page(request, site, "metrics", "admin/cogworker/history/metrics.html", "Metrics", window=window,
                       rows=rows, charts=charts, hours=hours, hours_choices=HOURS, job_class=job_class or "",
                       queue=queue or "", more_charts=max(len(rows) - CHARTS, 0))
