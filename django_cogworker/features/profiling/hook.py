"""Profiling on the job's path: a job whose payload has a ``profile`` label runs under a profiler,
and what the profiler found is kept a day (records.py), with the job's error if it raised.

The innermost feature's ``around`` (features/standard.py puts it last): what it measures is the
job's run through the server middleware, not the other features' work around it (a result
written, a limit's wait). Each run of a marked job is profiled: a retry carries the label, and its
profile is kept beside the first one's with its attempt number.

A job not asked pays nothing: ``fields`` names ``profile``, so a payload without it runs through
its class's plan without this feature (engine/run/hooks.py, ``Plan.for_payload``).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from ...broker.keys import Keys
from ...broker.types import RedisClient
from ...engine.run.hooks import Call, Feature, JobRun
from ...push import payload as payloads
from . import profilers, records
from .declaration import FIELD

logger = logging.getLogger(__name__)


class Profiling(Feature):
    """Made by features/standard.py, one per worker process, shared by its processor threads (each
    run's profiler is its own, on its own thread). ``prefer`` picks the profiler ("cProfile",
    "pyinstrument"; None: pyinstrument when importable)."""

    name = "profiling"
    fields = (FIELD,)

    def __init__(self, redis: RedisClient, keys: Keys, identity: str, prefer: str | None = None,
                 clock: Callable[[], float] = time.time):
        self.redis = redis
        self.keys = keys
        self.identity = identity
        self.prefer = prefer
        self.clock = clock

    def applies(self, job_class: Any) -> bool:
        return job_class is not None

    def around(self, run: JobRun, call: Call) -> Any:
        label = run.payload.get(FIELD)
        if not isinstance(label, str) or not label:  # (a field no push of ours wrote: run as pushed)
            return call()
        started, began = self.clock(), time.perf_counter()
        session, said = profilers.start(self.prefer)
        if session is None:
            logger.warning("jid=%s class=%s: run unprofiled (profile %s asked): %s", run.jid, run.shown_class,
                           payloads.printable(label), said)
        error: BaseException | None = None
        try:
            return call()
        except BaseException as exc:
            error = exc
            raise
        finally:
            elapsed = time.perf_counter() - began
            self._keep(run, label, started, elapsed, session, "" if session is not None else said, error)

    def _keep(self, run: JobRun, label: str, started: float, elapsed: float, session: profilers.Session | None,
              skipped: str, error: BaseException | None) -> None:
        """Stop the profiler and write what it found: never raises into the run (a profile lost is
        logged; the job settles as it ran)."""
        try:
            top: list[dict[str, Any]] = []
            html = None
            if session is not None:
                session.stop()
                top, html = session.top(), session.html()
            payload = run.payload
            attempt = payload.get("retry_count")
            profile = records.Profile(
                id=secrets.token_hex(8), label=label[:200], jid=str(payload.get("jid")), job_class=run.shown_class,
                queue=run.unit.queue, attempt=attempt + 2 if type(attempt) is int and attempt >= 0 else 1,
                started=started, elapsed=round(elapsed, 6), profiler=session.name if session is not None else "",
                skipped=skipped, identity=self.identity, top=top,
                error="" if error is None else payloads.safe_string(
                    f"{payloads.error_class(error)}: {payloads.error_message(error)}", payloads.ERROR_MESSAGE_LIMIT))
            records.save(self.redis, self.keys, profile, html)
        except Exception:
            logger.exception("jid=%s class=%s: its profile could not be kept", run.jid, run.shown_class)
            return
        logger.info("jid=%s class=%s: profiled (%s, %s) in %.3fs: profile %s", run.jid, run.shown_class,
                    payloads.printable(label), profile.profiler or "unprofiled", elapsed, profile.id)
