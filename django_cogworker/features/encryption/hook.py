"""Encryption on the job's path: a job whose payload is sealed (``encrypt``) has its arguments
opened for its run only, by the worker's keys (``ENCRYPTION_KEYS``), around the run.

The clear arguments go on the job (``job.arguments``, read by the innermost step of the server
chain), never into the payload: that stays sealed, and is what a failure files in retry or dead.
One that can't be opened (a key no worker has, a blob tampered with) fails with KeyUnavailable or
SealBroken: dead at once, never retried (errors.NotRetried).
"""

from __future__ import annotations

from typing import Any

from ...engine.run.hooks import AsyncCall, Call, Feature, JobRun
from .codec import FIELD, open_arguments
from .keys import KeyRing


class Encryption(Feature):
    """Every class: a payload sealed by ``set(encrypt=True)`` may be of any class."""

    name = "encryption"
    fields = ("encrypted",)

    def __init__(self, ring: KeyRing | None):
        self.ring = ring

    def around(self, run: JobRun, call: Call) -> Any:
        if FIELD in run.payload:  # (a job that doesn't encrypt: one dict lookup)
            run.job.arguments = open_arguments(run.payload, self.ring)
        return call()

    async def around_async(self, run: JobRun, call: AsyncCall) -> Any:
        if FIELD in run.payload:
            run.job.arguments = open_arguments(run.payload, self.ring)
        return await call()
