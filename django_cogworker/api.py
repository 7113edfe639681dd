"""The object model over Redis that the admin, the CLI and ``manage.py shell`` use.

    from django_cogworker import api
    q = api.Queue("mail")
    q.size(), q.latency(), q.paused
    q.pause(); q.unpause()
    [q.name for q in api.Queue.all()]

Objects take an optional ``redis`` client and ``keys``; by default the
project's (``runtime``).
"""

from __future__ import annotations

import json
import time
from typing import Any

from .keys import Keys


def _defaults(redis: Any, keys: Keys | None) -> tuple[Any, Keys]:
    if redis is None or keys is None:
        from . import runtime

        redis = redis if redis is not None else runtime.get_redis()
        keys = keys if keys is not None else Keys(runtime.get_config().key_prefix)
    return redis, keys


class Queue:
    """One queue: its waiting jobs, and whether processes fetch from it."""

    def __init__(self, name: str, *, redis: Any = None, keys: Keys | None = None):
        if not isinstance(name, str) or not name:
            raise ValueError(f"a queue name must be a non-empty string, got {name!r}")
        self.name = name
        self.redis, self.keys = _defaults(redis, keys)
        self.key = self.keys.queue(name)

    @classmethod
    def all(cls, *, redis: Any = None, keys: Keys | None = None) -> list[Queue]:
        redis, keys = _defaults(redis, keys)
        names = {m.decode() for m in redis.smembers(keys.queues)} | {m.decode() for m in
                                                                      redis.smembers(keys.paused_queues)}
        return [cls(name, redis=redis, keys=keys) for name in sorted(names)]

    def size(self) -> int:
        return int(self.redis.llen(self.key))

    def latency(self, now: float | None = None) -> float:
        """Seconds the oldest waiting job has waited (0 when empty)."""
        oldest = self.redis.lindex(self.key, -1)
        if oldest is None:
            return 0.0
        try:
            enqueued = float(json.loads(oldest).get("enqueued_at"))
        except (ValueError, TypeError, AttributeError):
            return 0.0
        return max((time.time() if now is None else now) - enqueued, 0.0)

    @property
    def paused(self) -> bool:
        return bool(self.redis.sismember(self.keys.paused_queues, self.name))

    def pause(self) -> None:
        """No process fetches from this queue once its next heartbeat has read the paused set."""
        self.redis.sadd(self.keys.paused_queues, self.name)

    def unpause(self) -> None:
        self.redis.srem(self.keys.paused_queues, self.name)

    def clear(self) -> int:
        """Delete every waiting job; return how many there were."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.llen(self.key)
        pipe.delete(self.key)
        return int(pipe.execute()[0])
