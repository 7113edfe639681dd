"""Test helpers for projects that use django-cogworker: fake and inline modes.

Fake mode collects pushes in memory, per job class, without Redis; ``drain``
runs them. Inline mode runs each job at push time, in the caller's thread;
its exceptions reach the caller. Both JSON round-trip the payload first, so a
test sees exactly what a worker would. Neither waits for transaction commit:
a push is recorded (or run) when it is made.

    from django_cogworker import testing

    def test_checkout(client):
        with testing.fake() as jobs:
            client.post("/checkout/")
            assert jobs.args(SendReceipt) == [[42]]
            jobs.drain()

pytest fixtures ``cogworker_fake`` and ``cogworker_inline`` are installed with
the package (a pytest plugin); for ``unittest`` / Django ``TestCase`` use
:class:`FakeJobsMixin` or :class:`InlineJobsMixin`.
"""

from __future__ import annotations

import collections
import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

from .errors import UnknownJobError
from .features.encryption.codec import perform_arguments
from .features.encryption.keys import KeyRing, ring_for
from .push import runtime
from .push.job import Job, call_perform, registered


def _run(payload: dict[str, Any]) -> Any:
    job_class = registered(payload["class"])
    if job_class is None:
        raise UnknownJobError(f"no job is registered as {payload['class']!r}")
    job = job_class(payload)
    try:
        args, kwargs = perform_arguments(job, payload, _ring())
        return call_perform(job, args, kwargs)
    except BaseException:
        # A task's failure is final here (these modes retry nothing): django.tasks is told, as a
        # worker tells it of a task out of retries (tasks.py).
        failed = getattr(job, "_cogworker_failed", None)
        if failed is not None:
            failed(retried=False)
        raise


def _ring() -> KeyRing | None:
    """The settings' keys (a sealed job's arguments are opened as a worker opens them)."""
    keys = runtime.get_config().encryption_keys
    return ring_for(keys) if keys else None


class FakeJobs:
    """The jobs pushed while fake mode is on, in push order."""

    def __init__(self) -> None:
        self.pushed: collections.deque[dict[str, Any]] = collections.deque()

    # the client interface
    def push(self, payload: dict[str, Any], *, at: float | None = None, on_commit: bool | None = None) -> str:
        payload = json.loads(json.dumps(payload))
        if at is not None:
            payload["at"] = float(at)
        payload.setdefault("enqueued_at", time.time())
        self.pushed.append(payload)
        return payload["jid"]

    def push_bulk(self, items: list[dict[str, Any]], *, at: float | None = None,
                  on_commit: bool | None = None) -> list[str]:
        return [self.push(item, at=at) for item in items]

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
        """Run the collected jobs (and any they push) until none is left; return how many ran."""
        ran = 0
        while True:
            todo = self.jobs(job_class)
            if not todo:
                return ran
            payload = todo[0]
            self.pushed.remove(payload)
            _run(payload)
            ran += 1


class InlineJobs:
    """Runs every push at once, in the caller's thread (scheduled ones too)."""

    def push(self, payload: dict[str, Any], *, at: float | None = None, on_commit: bool | None = None) -> str:
        payload = json.loads(json.dumps(payload))
        _run(payload)
        return payload["jid"]

    def push_bulk(self, items: list[dict[str, Any]], *, at: float | None = None,
                  on_commit: bool | None = None) -> list[str]:
        return [self.push(item) for item in items]


@contextlib.contextmanager
def fake() -> Iterator[FakeJobs]:
    jobs = FakeJobs()
    previous = runtime.set_override(jobs)
    try:
        yield jobs
    finally:
        runtime.set_override(previous)


@contextlib.contextmanager
def inline() -> Iterator[InlineJobs]:
    jobs = InlineJobs()
    previous = runtime.set_override(jobs)
    try:
        yield jobs
    finally:
        runtime.set_override(previous)


class FakeJobsMixin:
    """For ``unittest`` / Django ``TestCase``: fake mode for each test, as ``self.jobs``."""

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        context = fake()
        self.jobs = context.__enter__()
        self.addCleanup(context.__exit__, None, None, None)  # type: ignore[attr-defined]


class InlineJobsMixin:
    """For ``unittest`` / Django ``TestCase``: inline mode for each test."""

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        context = inline()
        context.__enter__()
        self.addCleanup(context.__exit__, None, None, None)  # type: ignore[attr-defined]
