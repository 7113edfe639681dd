"""What the progress feature declares (django_cogworker/declarations.py): the function behind
``Job.progress`` (api.py's ``report``), and what becomes of a job's report when it dies off the
job's path (orphaned too often, killed from the admin): deleted, as a job that died on it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...declarations import Declaration

_reporter: Callable[..., None] | None = None


def _report(payload: dict[str, Any], done: float, total: float | None = None, note: str = "") -> None:
    global _reporter
    if _reporter is None:  # (imported on the first report, then kept: an import statement per call cost 2 µs)
        from .api import report

        _reporter = report
    _reporter(payload, done, total, note)


def _died(redis: Any, keys: Any, payload: dict[str, Any], error: str, message: str, ttl: float) -> None:
    """A job dead for good off the job's path: its progress is gone with it."""
    jid = payload.get("jid")
    if isinstance(jid, str):
        redis.delete(keys.progress(jid))


DECLARATION = Declaration("progress", died=_died, provides={"progress": _report})
