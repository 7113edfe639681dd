"""Queues: ``Queue``, one queue's waiting jobs (size, latency, paging) and its pause flag."""

from __future__ import annotations

import json
import time
from typing import Any

from ..keys import Keys
from ._base import _clamp_page, _defaults
from .records import JobRecord, Page


class Queue:
    """One queue: its waiting jobs, and whether processes fetch from it."""

    def __init__(self, name: str, *, redis: Any = None, keys: Keys | None = None):
        if not isinstance(name, str) or not name:
            raise ValueError(f"a queue name must be a non-empty string, got {name!r}")
        self.name = name
        self.redis, self.keys = _defaults(redis, keys)
        self.key = self.keys.queue(name)

    def __repr__(self) -> str:
        return f"<Queue {self.name!r}>"

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

    def jobs(self, page: int = 1, per_page: int = 25) -> Page:
        """Waiting jobs by rank, the newest first (the fetch takes from the other end)."""
        page, per_page = _clamp_page(page, per_page)
        start = (page - 1) * per_page
        pipe = self.redis.pipeline(transaction=False)
        pipe.llen(self.key)
        pipe.lrange(self.key, start, start + per_page - 1)
        total, raws = pipe.execute()
        items = [JobRecord(raw, position=start + i) for i, raw in enumerate(raws)]
        return Page(items, page, per_page, int(total))
