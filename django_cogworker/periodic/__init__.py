"""Periodic (cron) entries: declared in settings or on job classes, ticked by every process."""

from .entries import Entry, build_entries, periodic

__all__ = ["Entry", "build_entries", "periodic"]
