"""Retries of dead-set (and other sorted-set) entries that name no queue, by their payload's class.

The object model (``api.sorted_sets``) moves a retried entry to its queue; an entry of a
feature's own kind names none (the outbox's units: ``outbox/retry.py``), and the feature plugs its
retry in here (``apps.py`` registers it), the object model knowing none. A module of its own, with
no imports: ``apps.py`` registers at startup, and a pushing process must not import the object
model (and through it the engine) to do so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Called with the entry (an ``api.SortedEntry``, read whole) and the time; returns False if the
# entry was gone; raises ``api.ActionRefused`` when it can't be retried, or what stopped it.
Retry = Callable[[Any, float], bool]
RETRIES: dict[str, Retry] = {}


def register(job_class: str, retry: Retry) -> None:
    """Retry the entries whose payload's class is ``job_class`` with ``retry``."""
    RETRIES[job_class] = retry
