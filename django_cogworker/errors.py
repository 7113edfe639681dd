"""The one exception hierarchy of django-cogworker.

Redis errors are mapped at the boundary (``raise ... from exc``) only where the
caller must tell Redis being unavailable (away, or refusing every write for a
while: retry at once, back nothing off) from a deterministic failure (a key of
the wrong type: back off, quarantine).
"""

from __future__ import annotations

from typing import Any

import redis.exceptions


class CogworkerError(Exception):
    """Base of every error this package raises on purpose."""


class InvalidArgument(CogworkerError, TypeError, ValueError):
    """A value a call can't take, refused at the call before anything is written to Redis: its
    message names the parameter and the value (a type, a number past what Redis or a float holds,
    nesting too deep, text UTF-8 can't carry; the bounds are push/arguments.py's).

    Also a TypeError and a ValueError: the checks it took over raised one or the other, and code
    that caught those must still catch it.
    """


class NotRetried(CogworkerError):
    """A failure no retry can mend (a job's arguments sealed with a key no worker has): the retry
    policy files the job in dead at once, with the error's message as its reason, whatever its
    ``retry`` says, and keeps it there even with ``dead=False`` (nobody saw it run)."""


class BatchError(CogworkerError):
    """A batch used in a way it can't be: jobs added to a finished batch, a callback that is no job."""


class BatchNotFound(BatchError, LookupError):
    """No batch of that bid: it was never created, or its data expired (BATCH_TTL)."""

    def __init__(self, bid: str):
        super().__init__(f"no batch {bid!r}: never created, or its data expired (BATCH_TTL)")
        self.bid = bid


class ConfigError(CogworkerError):
    """Invalid configuration: the message names the setting and the value given."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__("; ".join(self.errors))


class PayloadError(CogworkerError):
    """A payload that cannot be decoded, or names no registered job."""


class UnknownJobError(PayloadError):
    """The payload's ``class`` is not a registered job name."""


class WrongTypeError(CogworkerError, redis.exceptions.ResponseError):
    """A push refused because its key (``key``) holds the wrong type of value.

    Redis says only ``WRONGTYPE Operation against a key holding the wrong kind of value``, naming
    no key. Still a ``ResponseError``, for code that caught redis-py's error before.
    """

    def __init__(self, key: str, kind: str):
        self.key = key
        # (Not "the key guard will fix it": it checks the queues its workers serve and those listed
        # in ``queues``, which a push that failed here never listed.)
        super().__init__(f"{key} holds the wrong type of value (not a {kind}): nothing was pushed. A worker's "
                         f"key guard moves such a key aside to quarantine when it checks it (every "
                         f"KEY_GUARD_INTERVAL); or inspect it and delete it yourself")


class JobTimeout(BaseException):
    """A job ran past its ``timeout``: raised in the job's thread at its next bytecode.

    A BaseException, as KeyboardInterrupt is: a job's ``except Exception`` (a retry loop, a
    "log and carry on") must not swallow it and run on. It is filed as the job's failure.
    Raised without arguments (an exception class is all a thread can be sent), through a
    subclass of the same name that knows the ``seconds`` (:func:`timeout_error`), so its
    message says the limit.
    """

    seconds: float | None = None

    def __str__(self) -> str:
        if self.args:
            return super().__str__()
        limit = f" of {self.seconds:g}s" if self.seconds is not None else ""
        return f"the job ran past its timeout{limit}"


_timeout_errors: dict[float, type[JobTimeout]] = {}


def timeout_error(seconds: float) -> type[JobTimeout]:
    """The JobTimeout class to raise for a limit of ``seconds`` (one per limit, made once)."""
    cls = _timeout_errors.get(seconds)
    if cls is None:
        # (Same module and name: its stored class path reads django_cogworker.errors.JobTimeout.)
        cls = _timeout_errors[seconds] = type("JobTimeout", (JobTimeout,), {
            "seconds": seconds, "__module__": __name__, "__qualname__": "JobTimeout"})
    return cls


class OverLimit(CogworkerError):
    """A limiter refused: at fetch for a job's ``limits``, or ``Limiter.within`` after its ``wait``.

    Raised out of a job's ``perform`` it is no failure: the job goes back to the schedule with a
    backoff and keeps its retry count, until OVER_LIMIT_MAX reschedules (features/limits/gate.py).
    ``retry_after``: seconds until the limiter may admit one more, when it can tell (None: a
    concurrency limit, which frees when a holder ends).
    """

    def __init__(self, key: str, kind: str, retry_after: float | None = None):
        self.key, self.kind, self.retry_after = key, kind, retry_after
        after = f"; a place may free in {retry_after:.3g}s" if retry_after is not None else ""
        super().__init__(f"over the limit of {kind} limiter {key!r}{after}")

    def __reduce__(self) -> Any:
        return type(self), (self.key, self.kind, self.retry_after)


class LimitError(CogworkerError):
    """A job's limits could not be taken for good (not an outage: waiting would change nothing);
    the job is filed as failed (retry, then dead), never rescheduled for ever."""


class LimitKeyError(LimitError):
    """A limiter's key function raised, or returned something other than a non-empty string."""


class FeatureError(CogworkerError):
    """A feature's hook raised where the job's path can't do without its answer (``applies``,
    ``decide``): the job is filed as this failure (retry, then dead), its message naming the
    feature and the hook, the hook's own error as its ``__cause__``."""


class JobExpired(CogworkerError):
    """A job still waiting when its ``expires_in`` ran out: dropped at fetch, never run."""


class JobNotFound(CogworkerError, LookupError):
    """``cancel(jid)`` of a jid that is nowhere: not waiting, scheduled, retrying or running."""


class NotCancellable(CogworkerError):
    """``cancel(jid)`` of a job whose class can't be cancelled: the package's hand-over jobs, which
    a chain or a parent batch waits for. The message says why and what to cancel instead."""


class Cancelled(BaseException):
    """Raised in a running job's thread by ``cancel(jid, interrupt=True)`` (as JobTimeout is).

    A BaseException, so a job's ``except Exception`` doesn't swallow it. A cancelled job is
    acknowledged, never retried: counted in ``stat:cancelled``, and a task's result reads FAILED
    with this error.
    """

    def __str__(self) -> str:
        return super().__str__() or "the job was cancelled"


class PushLostAtCommit(CogworkerError):
    """A push waiting for its transaction's commit (OUTBOX off) failed at the commit: raised out of
    the ``atomic()`` block's exit, after the transaction committed. ``jobs``: (class, jid) of each
    job lost, this push's and those of the same commit that Django then never ran (it runs no
    ``on_commit`` callback after one that raises); ``database``: the alias committed; the push's own
    error is the ``__cause__``. ``COGWORKER["OUTBOX"] = True`` keeps them (docs/outbox.md)."""

    def __init__(self, message: str, jobs: list[tuple[str, str]], database: str):
        super().__init__(message)
        self.jobs, self.database = jobs, database

    def __reduce__(self) -> Any:
        return type(self), (str(self), self.jobs, self.database)


class RedisUnavailable(CogworkerError):
    """Redis refused, server-wide, a command a script ran with ``pcall`` (its reply was data, not an error)."""


# Replies with which Redis refuses commands server-wide until it recovers: a
# replica (a failover), out of memory, loading its data set, a script running
# too long, a blocking call cut by a failover, a cluster reconfiguring. They fix
# themselves; a per-entry backoff made the first slot after a 70 s READONLY
# period run a minute late. WRONGTYPE and NOPERM are not here: they don't.
UNAVAILABLE_CODES = frozenset({"READONLY", "OOM", "LOADING", "MASTERDOWN", "BUSY", "TRYAGAIN", "NOREPLICAS",
                               "CLUSTERDOWN", "UNBLOCKED"})
# redis-py's classes for some of them (BusyLoadingError is a ConnectionError; MasterDownError a ClusterDownError).
# SlotNotCoveredError: a cluster whose slot map has no node for our slot (mid-failover).
_UNAVAILABLE_TYPES = (redis.exceptions.ReadOnlyError, redis.exceptions.OutOfMemoryError,
                      redis.exceptions.TryAgainError, redis.exceptions.ClusterDownError,
                      redis.exceptions.SlotNotCoveredError)


def is_connection_error(exc: BaseException) -> bool:
    """Tell Redis being away (connection lost, timed out) from a command that failed."""
    return isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError))


def error_code(error: BaseException | bytes | str) -> str:
    """Return the code of a Redis error reply (``WRONGTYPE``, ``OOM``...), from an exception or a script's reply."""
    code = getattr(error, "status_code", None)
    if code:  # redis-py strips the codes it maps to a class (OOM, READONLY...) from the message
        return code
    text = error.decode(errors="replace") if isinstance(error, bytes) else str(error)
    return text.split(" ", 1)[0]


def is_unavailable(exc: BaseException) -> bool:
    """Tell Redis away or refusing every write for now (a replica, OOM...) from a command that failed."""
    if is_connection_error(exc) or isinstance(exc, (RedisUnavailable, *_UNAVAILABLE_TYPES)):
        return True
    return isinstance(exc, redis.exceptions.ResponseError) and error_code(exc) in UNAVAILABLE_CODES


def is_unsendable(exc: BaseException) -> bool:
    """Tell a write that can never go through as built (what it sends can't be encoded: a lone
    surrogate, a number JSON can't hold, a value redis-py refuses) from Redis away or refusing it.

    Trying the first again changes nothing: a failure message holding a surrogate, taken for an
    outage, kept its job on the in-progress list, retried every beat, forever. A command Redis
    refuses (WRONGTYPE: the key guard moves that key aside) is not one.
    """
    if is_unavailable(exc):
        return False
    return not isinstance(exc, redis.exceptions.RedisError) or isinstance(exc, redis.exceptions.DataError)
