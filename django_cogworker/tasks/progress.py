"""A task's progress (``Job.progress`` for ``@task`` functions): Django's ``TaskResult`` has no field
for it (a frozen dataclass with slots, in Django 6.1's ``django.tasks`` and the django-tasks
backport alike), so it is read and reported through these two helpers:

    from django_cogworker.tasks import report_progress, task_progress

    @task()
    def reindex(shop_id):
        for n, product in enumerate(products, 1):
            index(product)
            report_progress(n, len(products), note=product.name)

    result = reindex.enqueue(42)
    task_progress(result)          # Progress(done=120, total=500, ..., eta=31.6) or None

A task function has no ``self``: :func:`report_progress` reports for the task this thread runs
(a no-op outside one), as ``self.progress`` does for a job (features/progress/).
"""

from __future__ import annotations

from typing import Any

from ..features.progress.api import Progress, current, get_progress
from ..features.progress.tracker import check


def task_progress(result: Any) -> Progress | None:
    """The latest progress of the task of ``result`` (a TaskResult, or its id), or None: it reported
    none, or it finished (a task's progress is deleted when it succeeds or fails for good)."""
    return get_progress(result if isinstance(result, str) else str(result.id))


def report_progress(done: float, total: float | None = None, note: str = "") -> None:
    """From a task function: report how far the task this thread runs got (``Job.progress``: at most
    one write a second, the last at its end; ValueError for bad values). Outside a task's run: nothing."""
    check(done, total, note)
    tracker = current()
    if tracker is not None:
        tracker.update(done, total, note)
        tracker.flush()
