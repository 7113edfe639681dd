"""What a process holds and has seen of its limiters, shared by the gate (a job's ``limits``), the
places held with ``within`` (within.py) and the heartbeat's upkeep (upkeep.py): the concurrency
places held (their leases renewed), the keys used (written to the index), the holder tokens, and
the wake-up of jobs waiting for a place a release freed."""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from typing import Any

from ...broker import scripts
from ...broker.keys import Keys
from ...push import scope  # (a leaf: the running job and the process identity, set by the worker)

logger = logging.getLogger(__name__)


def wake(redis: Any, keys: Keys, popped: list[Any]) -> int:
    """Move the jobs a release popped from ``waiting`` (payload, due time, ...) from the schedule to
    their queues now, each only if still in the schedule as parked (one that ran or was deleted
    meanwhile isn't brought back); return how many moved. A wake-up that fails costs only time:
    the job is still due at its backoff."""
    from ...broker import crossings
    from ...push import payload as payloads

    moved = 0
    now = time.time()
    for raw, score in zip(popped[::2], popped[1::2], strict=True):
        try:
            payload = payloads.decode(raw)
            queue = payload.get("queue")
            if not isinstance(queue, str) or not queue:
                continue
            payload["enqueued_at"] = now
            text = payloads.encode(payload)
            if keys.spread:  # (the queue is in another slot: leased, pushed, then removed)
                moved += crossings.zset_to_queues(redis, keys, keys.schedule, [(raw, float(score), queue, text)],
                                                  now)[0] == crossings.MOVED
            else:
                moved += int(scripts.CLAIM_AND_REQUEUE(redis, [keys.schedule, keys.queues, keys.queue(queue)],
                                                       [raw, queue, text]))
        except Exception as exc:
            logger.warning("a job waiting for limiter place was not woken (%s: %s); it runs at its backoff",
                           type(exc).__name__, exc)
    return moved


def holder_token(jid: str | None) -> str:
    """A holder's token: who holds the place (shown by the admin), unique per run."""
    return json.dumps({"jid": jid, "process": _process(), "since": round(time.time(), 3),
                       "run": secrets.token_hex(6)}, separators=(",", ":"))


class _Held:
    """The concurrency places this process holds, for the heartbeat to renew their leases."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, tuple[str, float, str]] = {}
        self._next = 0

    def add(self, key: str, lease: float, token: str) -> int:
        with self._lock:
            self._next += 1
            self._held[self._next] = (key, lease, token)
            return self._next

    def remove(self, hold: int) -> None:
        with self._lock:
            self._held.pop(hold, None)

    def by_key(self) -> dict[str, tuple[float, list[str]]]:
        """limiter key -> (its lease, the tokens held on it)."""
        grouped: dict[str, tuple[float, list[str]]] = {}
        with self._lock:
            for key, lease, token in self._held.values():
                grouped.setdefault(key, (lease, []))[1].append(token)
        return grouped


HELD = _Held()


class _Seen:
    """The limiter keys this process used since its last beat, with their specs: the heartbeat
    writes them to the ``limits`` index (no write of its own on a job's path)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[str, str] = {}

    def add(self, key: str, limiter: Any) -> None:
        if key not in self._keys:
            with self._lock:
                self._keys[key] = limiter.describe()

    def put(self, key: str, spec: str) -> None:
        with self._lock:
            self._keys.setdefault(key, spec)

    def take(self) -> dict[str, str]:
        with self._lock:
            taken, self._keys = self._keys, {}
        return taken


SEEN = _Seen()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _process() -> str:
    """The worker process's identity, or host:pid elsewhere."""
    identity = scope.identity
    return identity if identity else f"{socket.gethostname()}:{os.getpid()}"


def _current_jid() -> str | None:
    running = scope.running.get()
    return running.payload.get("jid") if running is not None else None
