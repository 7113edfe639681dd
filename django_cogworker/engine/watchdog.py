"""Moved to :mod:`django_cogworker.loops` (imported by the periodic ticker too, which is no engine part).

Kept only for the engine modules that still import it from here (heartbeat, manager); the lead
moves their imports at merge and deletes this file.
"""

from ..loops import BACKOFF_MAX, BACKOFF_START, LoopThread, Watchdog

__all__ = ["BACKOFF_MAX", "BACKOFF_START", "LoopThread", "Watchdog"]
