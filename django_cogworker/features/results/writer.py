"""Recording the results of the jobs that opt in (tasks; Job classes with ``result_ttl``).

The processor calls :class:`ResultWriter` only for a job class whose ``result_ttl`` is set:
one attribute read is all a job that doesn't opt in pays. For one that does, two round trips
per attempt: RESULT_STARTED before it runs (so a reader sees RUNNING, and a task's context its
attempt number), RESULT_FINISHED once its filing is decided (SUCCESSFUL; READY again when a
retry is filed; FAILED when it goes to dead or is discarded).

A result is a record for readers, not the job: a write that fails (Redis away) is logged and
the job runs and settles all the same. The finish is written before the settlement, so a
reader never sees a job settled and still RUNNING; a process killed in between has the job
recovered as an orphan and run again (RUNNING, then its new outcome).
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from typing import Any

from ...broker.keys import Keys, Want
from ...broker.quarantine import run_script
from ...broker.types import RedisClient
from ...push import payload as payloads
from . import records as results
from . import scripts

logger = logging.getLogger(__name__)


class ResultWriter:
    """Writes result records for one worker process.

    Created by the Launcher with the Redis client, the keys and the process identity (the
    worker id of each attempt); shared by the processor threads (stateless, redis-py's pool
    is thread-safe).
    """

    def __init__(self, redis: RedisClient, keys: Keys, identity: str, clock: Any = time.time):
        self.redis = redis
        self.keys = keys
        self.worker_id = json.dumps(identity)
        self.clock = clock

    def started(self, payload: dict[str, Any], ttl: float) -> results.JobResult | None:
        """Mark an attempt RUNNING; return the record (None if it couldn't be written)."""
        jid = str(payload.get("jid"))
        try:
            key = self.keys.result(jid)
            reply = run_script(scripts.RESULT_STARTED, self.redis, self.keys, [key],
                               [repr(self.clock()), self.worker_id, _seconds(ttl), *results.record_fields(payload)],
                               {key: Want("hash")})
            return results.JobResult.from_record(str(jid), reply)
        except Exception as exc:
            logger.error("jid=%s: its result could not be marked RUNNING (%s: %s); the job runs all the same",
                         payloads.printable(jid), type(exc).__name__, payloads.printable(exc))
            return None

    def finished(self, payload: dict[str, Any], ttl: float, *, value: str | None = None,
                 error: BaseException | None = None, target: str | None = None) -> None:
        """Record how an attempt ended: ``value`` (JSON text) for a success, else ``error`` and where
        the job went (``target``: "retry", or "schedule" for a job over a limit, leaves it READY;
        anything else is FAILED)."""
        now = self.clock()
        if error is None:
            status, finished_at, encoded_error = results.SUCCESSFUL, repr(now), ""
        else:
            status = results.READY if target in ("retry", "schedule") else results.FAILED
            finished_at = "" if status == results.READY else repr(now)
            encoded_error = payloads.encode({"exception_class_path": _class_path(error),
                                             "traceback": _traceback(error)})
        jid = str(payload.get("jid"))
        try:
            key = self.keys.result(jid)
            run_script(scripts.RESULT_FINISHED, self.redis, self.keys, [key],
                       [status, finished_at, _seconds(ttl), value or "", encoded_error], {key: Want("hash")})
        except Exception as exc:
            logger.error("jid=%s: its result (%s) could not be written (%s: %s)", payloads.printable(jid), status,
                         type(exc).__name__, payloads.printable(exc))


def encode_return(value: Any) -> str:
    """The return value as JSON; raises TypeError (the job's failure) for one JSON can't hold."""
    try:
        return payloads.encode(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"the job's return value can't be stored as JSON: {exc}") from None


def _class_path(error: BaseException) -> str:
    """``builtins.ValueError``, not the dead set's ``ValueError``: django.tasks imports it back from this path."""
    cls = type(error)
    return payloads.safe_string(f"{cls.__module__}.{cls.__qualname__}", payloads.ERROR_MESSAGE_LIMIT)


def _seconds(ttl: float) -> int:
    return max(1, int(ttl))


def _traceback(error: BaseException) -> str:
    """The formatted traceback, cut at 20,000 characters (its end: the frames nearest the error)."""
    try:
        text = "".join(traceback.format_exception(error))
    except BaseException:  # noqa: BLE001 - a broken __str__ must not cost the job its record
        text = f"{payloads.error_class(error)}: {payloads.error_message(error)}"
    return payloads.safe_string(text[-20000:], 20000)
