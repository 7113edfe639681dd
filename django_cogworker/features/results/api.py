"""Reading job results (the opt-in records of :mod:`.records`) for the admin and shells."""

from __future__ import annotations

from ...api._base import _defaults
from ...broker.keys import Keys
from ...broker.types import RedisClient
from . import records as results


def job_result(jid: str, redis: RedisClient | None = None, keys: Keys | None = None) -> results.JobResult | None:
    """The result record of ``jid`` (a task's, or a ``result_ttl`` job's), or None when it has none."""
    redis, keys = _defaults(redis, keys)
    return results.read(redis, keys, jid)
