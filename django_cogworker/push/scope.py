"""What a push needs to know of where it is made: inside a batch's ``jobs()`` block, inside a job.

Two context variables, set by their owners and read by the client on each push:

- ``batch``: the innermost open ``Batch.jobs()`` block (features/batches/batch.py), or None. A push made
  in one carries the batch's bid, and the batch counts the job before it is written (and stops
  counting it if it wasn't).
- ``running``: the job this thread (or task) runs (:class:`Running`), set by the processor around
  its run. A batch opened inside a job knows it from this (features/batches/batch.py); a limiter's holder
  token names its jid, and ``Job.cancelled`` reads whether it was asked to stop.

What a job asks of a feature (``Job.batch``, ``Job.cancel``) is served by the feature's declaration
(declarations.py), not set here by the feature as it is imported.

Context variables, not thread locals: an ``async def perform`` run through ``async_to_sync``
sees the values of the thread that runs it.
"""

from __future__ import annotations

import threading
from contextvars import ContextVar
from typing import Any, Protocol


class BatchScope(Protocol):
    """An open ``jobs()`` block, as the client sees it."""

    bid: str

    def next_jids(self, n: int) -> list[str]: ...

    def add(self, jids: list[str]) -> None: ...

    def remove(self, jids: list[str]) -> None: ...


class Running:
    """The job a processor runs: its payload, and how many jobs() blocks it opened on each batch
    (a block's owner token is made of the job's jid, the bid and that number: the same in a run
    again of the job, so it adds the same jobs instead of others)."""

    __slots__ = ("payload", "blocks", "cancelled", "checked", "stopping", "extras")

    def __init__(self, payload: dict[str, Any], stopping: threading.Event | None = None):
        self.payload = payload
        # Set once the worker is stopping (its TERM, a rolling restart's retirement): a job that
        # can stop between two steps of its own (an iterable job, at its next item) does so and
        # goes back to its queue. None: a run no worker stops (the test helpers').
        self.stopping = stopping
        # What a feature keeps for the job's own use while it runs, under the feature's name (its
        # progress tracker, its iteration state): the job reads it through the feature's API.
        self.extras: dict[str, Any] = {}
        self.blocks: dict[str, int] | None = None
        # Asked to stop (engine/run/cancels.py, or Job.cancelled reading Redis, at most every second).
        self.cancelled = False
        self.checked = 0.0  # (monotonic) when Job.cancelled last asked Redis

    def next_block(self, bid: str) -> int:
        blocks = self.blocks
        if blocks is None:
            blocks = self.blocks = {}
        n = blocks[bid] = blocks.get(bid, -1) + 1
        return n


batch: ContextVar[BatchScope | None] = ContextVar("cogworker_batch", default=None)
running: ContextVar[Running | None] = ContextVar("cogworker_running_job", default=None)


# The worker process's identity, once runcogworker started (features/limits/ names lease holders by it).
identity: str | None = None
