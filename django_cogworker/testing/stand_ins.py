"""The clients fake and inline mode put in the process's place (push/runtime.py's override).

Both take a push as the client would: the payload JSON round-tripped (a job sees exactly what a
worker would), and, inside a batch's ``jobs()`` block, given the block's jid and bid and counted by
the batch first (push/client/'s ``Client._push_in_batch``; once taken here a job is the batch's for
good: it is never lost at a write). Neither waits for a transaction's commit nor goes through the
outbox: a push is taken when it is made. What a worker's feature pushes other than through the
client (a batch's callbacks) is handed here too (features/batches/delivery.py).
"""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Sequence
from typing import Any

from ..features.encryption.codec import perform_arguments
from ..features.encryption.keys import KeyRing, ring_for
from ..push import runtime
from ..push import scope as _scope
from ..push.job import Job
from .runner import Runner

PROGRESS_KEPT = 10_000  # reports kept per job (an iterable job reports each item)


class _StandIn:
    """What both modes share: taking pushes (``_take`` says what becomes of them)."""

    def __init__(self) -> None:
        self.runner = Runner()
        # jid -> the progress its runs reported (``Job.progress``), in order; the last PROGRESS_KEPT
        self._progress: dict[str, collections.deque[Any]] = {}
        self._progress_lock = threading.Lock()  # (inline mode: a live server's threads run jobs)

    def record_progress(self, jid: str, report: Any) -> None:
        """Keep a report a job made (features/progress/api.py's Recorder): nothing is written to Redis."""
        with self._progress_lock:
            self._progress.setdefault(jid, collections.deque(maxlen=PROGRESS_KEPT)).append(report)

    def progress(self, jid: str) -> list[Any]:
        """The progress reports job ``jid`` made (``self.progress(...)``), oldest first: each a
        :class:`~django_cogworker.features.progress.api.Progress` (``eta`` None: not estimated here)."""
        with self._progress_lock:
            return list(self._progress.get(jid, ()))

    # the client interface
    def push(self, payload: dict[str, Any], *, at: float | None = None, on_commit: bool | None = None) -> str:
        return self.push_bulk([payload], at=at)[0]

    def push_bulk(self, items: Sequence[dict[str, Any]], *, at: float | None = None,
                  on_commit: bool | None = None) -> list[str]:
        scope = _scope.batch.get()
        if scope is not None:  # (on the caller's payloads, as the client does: a workflow reads their jids)
            jids = scope.next_jids(len(items))
            for item, jid in zip(items, jids, strict=True):
                item["jid"] = jid
                item["bid"] = scope.bid
            scope.add(jids)
        now = time.time()
        taken = []
        for item in items:
            payload = json.loads(json.dumps(item))
            if at is not None:
                payload["at"] = float(at)
            payload.setdefault("enqueued_at", now)
            taken.append(payload)
        self._take(taken)
        return [payload["jid"] for payload in taken]

    def deliver(self, payload: dict[str, Any]) -> None:
        """Take a batch's callback its step fired (features/batches/delivery.py): as it was made at
        ``on()``, of no ``jobs()`` block open here, as a worker's delivery pushes it to its queue."""
        self._take([json.loads(json.dumps(payload))])

    def _take(self, payloads: list[dict[str, Any]]) -> None:
        raise NotImplementedError


class FakeJobs(_StandIn):
    """The jobs pushed while fake mode is on, in push order."""

    def __init__(self) -> None:
        super().__init__()
        self.pushed: collections.deque[dict[str, Any]] = collections.deque()

    def _take(self, payloads: list[dict[str, Any]]) -> None:
        self.pushed.extend(payloads)

    # what tests read
    def jobs(self, job_class: type[Job] | None = None) -> list[dict[str, Any]]:
        """Payloads not yet drained, optionally of one class only."""
        return [p for p in self.pushed if job_class is None or p["class"] == job_class.name]

    def args(self, job_class: type[Job]) -> list[list[Any]]:
        # (a job that encrypts: its arguments opened, as its perform would get them)
        return [list(perform_arguments(job_class(p), p, _ring())[0]) if "encrypted" in p else p["args"]
                for p in self.jobs(job_class)]

    def __len__(self) -> int:
        return len(self.pushed)

    def clear(self) -> None:
        self.pushed.clear()

    def drain(self, job_class: type[Job] | None = None) -> int:
        """Run the collected jobs (and any they push, and the callbacks of the batches they settle)
        until none is left; return how many ran. A job's exception is raised (that job removed first)."""
        ran = 0
        while True:
            todo = self.jobs(job_class)
            if not todo:
                return ran
            payload = todo[0]
            self.pushed.remove(payload)
            self.runner.run(payload)
            ran += 1


class InlineJobs(_StandIn):
    """Runs every push at once, in the caller's thread (scheduled ones too).

    A push made while a job runs here (a job's own pushes, its batch's callbacks, a chain's next
    step) waits until that job is settled, then runs, before the outermost push returns: as in a
    worker, a job's failure is not its parent's, nor a callback's that of the job whose settlement
    fired it, and a chain of any length runs without nesting one step's run inside the last's.
    The first exception raised is raised to that push's caller once every job waiting has run.
    """

    def __init__(self) -> None:
        super().__init__()
        self._local = threading.local()  # (per thread: a live server's thread runs its own pushes)

    def _take(self, payloads: list[dict[str, Any]]) -> None:
        local = self._local
        waiting: collections.deque[dict[str, Any]] | None = getattr(local, "waiting", None)
        if waiting is not None:  # (a job runs here: it goes after it)
            waiting.extend(payloads)
            return
        waiting = local.waiting = collections.deque(payloads)
        first: Exception | None = None
        try:
            while waiting:
                try:
                    self.runner.run(waiting.popleft())
                except Exception as exc:  # (the others waiting run all the same, as a worker would run them)
                    if first is None:
                        first = exc
        finally:
            del local.waiting
        if first is not None:
            raise first


def _ring() -> KeyRing | None:
    """The settings' keys (a sealed job's arguments are opened as a worker opens them)."""
    keys = runtime.get_config().encryption_keys
    return ring_for(keys) if keys else None
