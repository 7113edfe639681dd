"""Demo jobs that push jobs, and a chain's step: what tests/test_push_from_jobs.py runs through real
workers to count every child's and every step's runs."""

from __future__ import annotations

import time

from django_cogworker import Job
from django_cogworker.push.runtime import get_redis


class CountedChildJob(Job):
    """Counts its run: HINCRBY `key` `name` 1 (a child run twice shows as 2)."""

    def perform(self, key: str, name: str) -> None:
        get_redis().hincrby(key, name, 1)


class UniqueCountedChildJob(CountedChildJob):
    """CountedChildJob as a unique job (its own arguments: no duplicate among the test's)."""

    unique_for = 600


class PushFiveJob(Job):
    """Pushes five CountedChildJobs named ``<n>:<i>``: two plain, one unique, and two into its own
    batch (``self.batch.jobs()``: the job must belong to a batch).

    ``wave``: first sleep to the next multiple of that many seconds, as a job waiting on I/O does,
    so that the threads push together after a quiet moment (what a connection shared by the
    threads failed at: tests/test_push_from_jobs.py).
    """

    def perform(self, key: str, n: int, wave: float = 0.0) -> None:
        if wave:
            time.sleep(wave - time.time() % wave)
        CountedChildJob.perform_async(key, f"{n}:0")
        CountedChildJob.perform_async(key, f"{n}:1")
        UniqueCountedChildJob.perform_async(key, f"{n}:2")
        with self.batch.jobs():
            CountedChildJob.perform_async(key, f"{n}:3")
            CountedChildJob.perform_async(key, f"{n}:4")


class ChainStepJob(Job):
    """A chain's step: returns ``previous + add`` (a group's values: their sum), after RPUSHing
    `name` onto `key` and setting field `name` of hash ``<key>:value`` to that value."""

    def perform(self, previous: int | list[int] | None, add: int, name: str, key: str) -> int:
        value = (sum(previous) if isinstance(previous, list) else previous or 0) + add
        get_redis().rpush(key, name)
        get_redis().hset(f"{key}:value", name, value)
        return value
