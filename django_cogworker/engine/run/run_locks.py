"""The locks around a run: a job's unique and periodic locks, released as it ends, even through an outage.

A release that Redis could not take (the connection lost, a failover under way,
a replica refusing writes) used to be logged and dropped: the lock then outlived
its job until its TTL, an hour by default for a unique job, and every push of
that job was refused as a duplicate of one that had already run. Such a release
is kept here and tried again on each heartbeat until Redis takes it. Every
release names its holder (the jid): one that comes late never frees a lock that
another run took since.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any

from ...broker.keys import Keys
from ...broker.locks import release_running, retake_running
from ...broker.types import RedisClient
from ...errors import is_unavailable
from ...push import unique

logger = logging.getLogger(__name__)

# Releases kept at most (a long outage under load): beyond, the oldest are dropped, to their TTL.
MAX_PENDING = 10_000


class RunLocks:
    """The run hook of the processors, and the heartbeat chore that retries what Redis refused.

    Created by the Launcher; called as ``run_locks(payload, moment)`` by the
    processor threads ("start", "success", "retry", "dead") and by the main
    thread at shutdown ("requeued"); ``retry_pending`` runs on the heartbeat
    thread (a chore) and once at shutdown. No thread of its own.
    """

    def __init__(self, redis: RedisClient, keys: Keys, max_pending: int = MAX_PENDING):
        self.redis = redis
        self.keys = keys
        self._pending: collections.deque[tuple[dict[str, Any], str]] = collections.deque()
        self._max_pending = max_pending
        self._lock = threading.Lock()

    def __call__(self, payload: dict[str, Any], moment: str) -> None:
        """Take or release the locks of ``payload`` at ``moment``; keep a release Redis refused for now."""
        try:
            self._apply(self.redis, payload, moment)
        except Exception as exc:
            if moment == "requeued" or not is_unavailable(exc):
                raise  # (the processor logs it; the lock goes at its TTL)
            self._keep(payload, moment, exc)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def retry_pending(self, redis: RedisClient) -> None:
        """Release what Redis refused before, oldest first; stop at the first refusal (still away)."""
        released = 0
        while True:
            with self._lock:
                if not self._pending:
                    break
                payload, moment = self._pending[0]
            self._apply(redis, payload, moment)  # (raises while Redis is away: the chore logs it)
            with self._lock:
                if self._pending and self._pending[0][0] is payload:
                    self._pending.popleft()
            released += 1
        if released:
            logger.info("released %d unique or periodic lock(s) that Redis had refused to release", released)

    def _apply(self, redis: RedisClient, payload: dict[str, Any], moment: str) -> None:
        if payload.get("unique_digest"):
            unique.release_at(redis, self.keys, payload, moment)
        if payload.get("periodic_pjid"):
            if moment == "requeued":
                retake_running(redis, self.keys, payload)  # it waits in its queue again: keep others out
            elif moment != "start":
                release_running(redis, self.keys, payload)

    def _keep(self, payload: dict[str, Any], moment: str, exc: BaseException) -> None:
        with self._lock:
            first = not self._pending
            self._pending.append((payload, moment))
            dropped = self._pending.popleft() if len(self._pending) > self._max_pending else None
        if first:
            logger.warning("releasing the locks of jid=%s failed (%s: %s); kept, and tried again with each "
                           "heartbeat", payload.get("jid"), type(exc).__name__, exc)
        if dropped is not None:
            logger.error("more than %d lock releases waiting for Redis: jid=%s's locks dropped; they "
                         "expire at their TTL", self._max_pending, dropped[0].get("jid"))
