"""The profiles, for the admin's Profiles page and ``manage.py cogworker profiles``, and "run profiled".

    from django_cogworker.features.profiling import api
    page = api.profiles(page=1)            # the newest first: label, class, jid, when, elapsed, error
    profile = api.profile(page.items[0].id)  # with its top functions
    api.run_profiled(django_cogworker.api.RetrySet(), token, "why-slow")  # enqueued now, profiled
"""

from __future__ import annotations

import copy
from typing import Any

from ...api._base import ActionRefused
from ...api.records import Page
from ...broker.keys import Keys
from ...broker.types import RedisClient
from . import records
from .declaration import FIELD, check_label
from .records import Profile

PER_PAGE = 50


def _defaults(redis: RedisClient | None, keys: Keys | None) -> tuple[RedisClient, Keys]:
    from ...api._base import _defaults as defaults

    return defaults(redis, keys)


def profiles(page: int = 1, per_page: int = PER_PAGE, *, redis: RedisClient | None = None,
             keys: Keys | None = None) -> Page:
    """One page of the profiles kept, the newest first (their summaries: no top functions)."""
    redis, keys = _defaults(redis, keys)
    page, per_page = max(int(page), 1), max(min(int(per_page), 100), 1)
    items, total = records.summaries(redis, keys, (page - 1) * per_page, per_page)
    return Page(items, page, per_page, total)


def profile(ident: str, *, redis: RedisClient | None = None, keys: Keys | None = None) -> Profile | None:
    """Profile ``ident`` with its top functions, or None (expired, trimmed, or never made)."""
    redis, keys = _defaults(redis, keys)
    return records.load(redis, keys, ident) if _plausible(ident) else None


def html(ident: str, *, redis: RedisClient | None = None, keys: Keys | None = None) -> str | None:
    """Profile ``ident``'s pyinstrument page, or None."""
    redis, keys = _defaults(redis, keys)
    return records.html(redis, keys, ident) if _plausible(ident) else None


def _plausible(ident: str) -> bool:
    """An id as the hook makes them (16 hex digits): anything else names no profile, nor another key."""
    return len(ident) == 16 and all(c in "0123456789abcdef" for c in ident)


def run_profiled(zset: Any, token: str, label: str) -> bool:
    """Enqueue the entry ``token`` of ``zset`` (scheduled, retry or dead) now, its payload marked
    ``profile=label``: its next run is profiled (and its retries', should it fail again). False if
    the entry was no longer there; ActionRefused if it can't be (unreadable, no queue).

    The entry's own ``enqueue_now`` moves it (atomically, as "Retry now" and "Enqueue now" do),
    from a copy whose payload carries the label: the stored entry it takes off is the one read."""
    label = check_label(label, "profile")
    entry = zset.find(token, whole=True)
    if entry is None:
        return False
    if entry.parse_error:
        raise ActionRefused(f"{entry.display_class} {entry.ident} can't be read: it can't be run profiled")
    marked = copy.copy(entry)
    marked.payload = dict(entry.payload, **{FIELD: label})
    return bool(marked.enqueue_now())


__all__ = ["PER_PAGE", "Profile", "html", "profile", "profiles", "run_profiled"]
