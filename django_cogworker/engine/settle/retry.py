"""What happens to a job that raised: retry with backoff, dead, or discard.

:class:`RetryPolicy` is built by the launcher with the config and the death
handlers; processors call :meth:`RetryPolicy.filing` for each failure. It only
decides and builds the new payload; the fetch files it (atomically with the ack).
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from ...conf import Config
from ...errors import NotRetried
from ...push import payload as payloads

logger = logging.getLogger(__name__)


# The longest delay before a retry: ten years (a retry_count pushed in the millions would make
# Sidekiq's count**4 overflow a float score).
MAX_DELAY = 10 * 365 * 86400.0


# The fields a failure sets on its payload (filing, exhausted).
FAILURE_FIELDS = ("retry_count", "failed_at", "retried_at", "error_class", "error_message", "error_backtrace",
                  "dead_reason")


@dataclass(frozen=True)
class Filing:
    """Where a failed job goes: ``target`` is "retry" or "dead", scored by ``score``.

    ``text``, when set, is the entry to write instead of ``payload`` encoded (see :meth:`as_stored`).
    """

    target: str
    score: float
    payload: dict[str, Any]
    text: str | None = None

    def raw(self) -> str:
        """The entry to write: ``text`` if set, else the payload encoded (raises if it can't be)."""
        return self.text if self.text is not None else payloads.encode(self.payload)

    def as_stored(self, raw: bytes) -> Filing:
        """This filing, written as ``raw`` (the payload as fetched) with the failure's fields appended.

        For a filing that can't be written as built: the job's real error is kept, made safe to
        encode, and the rest of the payload stays byte for byte as it came.
        """
        fields = {name: _writable(self.payload[name]) for name in FAILURE_FIELDS if name in self.payload}
        return Filing(self.target, self.score, self.payload,
                      payloads.append_fields(raw, {k: v for k, v in fields.items() if v is not None}).decode())


def _writable(value: Any) -> Any:
    """A failure field as JSON can hold it: text made safe, lists of text too, other numbers dropped (None)."""
    if isinstance(value, str):
        return payloads.safe_string(value, payloads.ERROR_MESSAGE_LIMIT)
    if isinstance(value, list):
        return [payloads.safe_string(item, payloads.ERROR_MESSAGE_LIMIT) for item in value]
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return value
    return None


def default_delay(count: int, rng: random.Random) -> float:
    """Sidekiq's backoff: count**4 + 15 + rand(10 * (count + 1)) seconds."""
    return count ** 4 + 15 + rng.randrange(10 * (count + 1))


class RetryPolicy:
    """Decides where a failed job goes, and builds its new payload; files nothing itself.

    Created by the Launcher with the config and the death handlers; the
    Launcher sets ``on_retry`` (the poller wakes for each retry's due time, and for each reschedule
    a feature tells ``wake``).
    Processor threads call ``filing`` and ``exhausted``; the Settler, the
    poller and orphan recovery ``dead_trim``. Stateless but for its rng and
    ``on_retry``: no thread, start or stop.
    """

    def __init__(self, config: Config, death_handlers: Sequence[Callable[[dict, BaseException | None], Any]] = (),
                 rng: random.Random | None = None, clock: Callable[[], float] = time.time):
        self.config = config
        self.death_handlers = list(death_handlers)
        self.rng = rng or random.Random()
        self.clock = clock
        # Told the due time of each retry decided here (the poller wakes for it), when set.
        self.on_retry: Callable[[float], Any] | None = None

    def filing(self, payload: dict[str, Any], exc: BaseException, job: Any = None,
               traceback: TracebackType | None = None) -> Filing | None:
        """Record the failure on ``payload``; return where it goes, or None to discard it.

        ``traceback``: the part of the error's traceback its ``error_backtrace`` keeps (the
        processor's: from the user's code in, engine/run/tracebacks.py); by default all of it."""
        now = self.clock()
        previous = payload.get("retry_count")
        if type(previous) is int and previous >= 0:
            count = previous + 1
            payload["retried_at"] = now
        else:
            if previous is not None:  # (a bool, a string, a negative count: counted afresh)
                logger.warning("jid=%s has an unreadable retry_count %.200r; counting from 0",
                               payloads.printable(payload.get("jid")), previous)
            count = 0
            payload["failed_at"] = now
        payload["retry_count"] = count
        payload["error_class"] = payloads.error_class(exc)
        payload["error_message"] = payloads.error_message(exc)
        lines = payload.get("backtrace")
        if lines:
            n = lines if isinstance(lines, int) and not isinstance(lines, bool) else payloads.BACKTRACE_DEFAULT_LINES
            payload["error_backtrace"] = payloads.backtrace(exc, n, traceback)
        if isinstance(exc, NotRetried):
            # (A worker that can't open a job's arguments now never will: no key of its list is the
            # one they were sealed with. Kept even with dead=False: nobody saw it run, and it is
            # retried from dead once the key is back.)
            payload.pop("dead", None)
            return self.exhausted(payload, exc, reason=payloads.error_message(exc))
        if count < payloads.max_retries(payload.get("retry"), self.config.max_retries):
            filing = Filing("retry", now + self._delay(job, count, exc), payload)
            self.wake(filing.score, payload.get("jid"))
            return filing
        return self.exhausted(payload, exc, reason="retries exhausted")

    def wake(self, due: float, jid: Any = None) -> None:
        """Tell the poller (``on_retry``, when set) that job ``jid``, filed to the retry or schedule
        set, comes due at ``due``: a retry decided here, or a reschedule a feature decided (a limit's,
        an iteration's), so it runs at its time rather than at the next timed round. A hint: one that
        raises is logged, naming the job, and never fails the filing."""
        if self.on_retry is None:
            return
        try:
            self.on_retry(due)
        except BaseException:  # noqa: BLE001 - a wake-up hint must never fail a filing
            logger.exception("on_retry hook failed for jid=%s", payloads.printable(jid))

    def exhausted(self, payload: dict[str, Any], exc: BaseException | None, reason: str) -> Filing | None:
        """The job won't run again: dead (or discarded with ``dead: false``); tell the death handlers."""
        payload.setdefault("failed_at", self.clock())
        payload["dead_reason"] = reason
        for handler in self.death_handlers:
            try:
                handler(payload, exc)
            except BaseException:  # noqa: BLE001 - even a SystemExit: the job is filed all the same
                logger.exception("death handler %r failed for jid=%s", handler, payloads.printable(payload.get("jid")))
        if payload.get("dead") is False:
            logger.warning("jid=%s %s: discarded (dead=False)", payloads.printable(payload.get("jid")),
                           payloads.printable(reason, payloads.ERROR_MESSAGE_LIMIT))
            return None
        return Filing("dead", self.clock(), payload)

    def _delay(self, job: Any, count: int, exc: BaseException) -> float:
        """Seconds until the retry: ``retry_in``'s choice if it is a number that can be a score,
        else the default backoff; at most MAX_DELAY (a count in the millions can't overflow)."""
        if job is not None:
            try:
                chosen = job.retry_in(count, exc)
                if chosen is not None:
                    delay = float(chosen)
                    if not math.isfinite(delay):
                        raise ValueError(f"retry_in returned {chosen!r}")
                    return min(delay, MAX_DELAY)
            except BaseException:  # noqa: BLE001 - a hook's SystemExit must not cost the job its filing
                logger.exception("retry_in failed for jid=%s; using the default backoff", payloads.printable(job.jid))
        return float(min(default_delay(count, self.rng), MAX_DELAY))

    def dead_trim(self) -> tuple[float, int]:
        """(drop dead entries scored below this, keep at most this many)."""
        return self.clock() - self.config.dead_timeout, self.config.dead_max_jobs
