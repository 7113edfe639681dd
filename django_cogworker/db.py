"""Django database hygiene around each job, as around a request."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import close_old_connections


class CloseOldConnections:
    """Server middleware, always outermost: drop unusable or expired DB connections before and after a job.

    A worker thread lives for days; without this a connection past
    CONN_MAX_AGE, or broken by a database restart, fails every later job.
    """

    def __init__(self, run: Callable[[Any, dict], Any]):
        self.run = run

    def __call__(self, job: Any, payload: dict) -> Any:
        close_old_connections()
        try:
            return self.run(job, payload)
        finally:
            close_old_connections()
