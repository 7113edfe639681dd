"""Test helpers for projects that use django-cogworker: fake and inline modes.

Fake mode collects pushes in memory, per job class; ``drain`` runs them. Inline mode runs each
job at push time, in the caller's thread; its exceptions reach the caller. Both JSON round-trip
the payload first, so a test sees exactly what a worker would, and run a job through the
worker's own path (runner.py): the features' hooks run as a worker runs them, so a batch's
callbacks, a chain's steps, a group and a chord run under both, and an encrypted job's
arguments are opened. Neither waits for transaction commit nor uses the outbox: a push is
recorded (or run) when it is made.

    from django_cogworker import testing

    def test_checkout(client):
        with testing.fake() as jobs:
            client.post("/checkout/")
            assert jobs.args(SendReceipt) == [[42]]
            jobs.drain()

A plain job needs no Redis. A batch or a workflow keeps its bookkeeping in the project's Redis
(``COGWORKER_REDIS_URL`` / ``REDIS_URL``) under the helpers too.

pytest fixtures ``cogworker_fake`` and ``cogworker_inline`` are installed with
the package (a pytest plugin); for ``unittest`` / Django ``TestCase`` use
:class:`FakeJobsMixin` or :class:`InlineJobsMixin`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..push import runtime
from .stand_ins import FakeJobs, InlineJobs

__all__ = ["FakeJobs", "FakeJobsMixin", "InlineJobs", "InlineJobsMixin", "fake", "inline"]


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
