"""Job classes, their options, and the registry the worker resolves names through.

Subclassing :class:`Job` registers the class under a stable name (its module
and qualified name, or ``name = "..."``). A payload carries that name and the
worker looks it up here only: nothing read from Redis is ever imported.

The options a class may set are the core's (``queue``, ``retry``, ``dead``, ``backtrace``,
``unique_for``, ``unique_until``) and those its features declare (django_cogworker/declarations.py:
``result_ttl``, ``timeout``, ``expires_in``, ``limits``, ``encrypt``, ``cancellable``), each checked
as the class is defined and set on it (its default when it gives none). Pushing is
:class:`JobSetter`'s: what a feature does to a payload as it is pushed (an ``expires_at``, a
seal) is that feature's push hook, asked once per setter. A workflow step (``Job.s``) is the
batches feature's (features/batches/signature.py).
"""

from __future__ import annotations

import datetime as dt
import inspect
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from asgiref.sync import async_to_sync

from ..bounds import check_queue
from ..declarations import declared, provided
from ..errors import CogworkerError, InvalidArgument
from . import discovery
from . import payload as payloads
from .arguments import check_call, check_json_native, check_unique, epoch

logger = logging.getLogger(__name__)

_registry: dict[str, type[Job]] = {}
_registry_lock = threading.Lock()


def registered(name: str) -> type[Job] | None:
    """Return the job class registered as ``name``, or None."""
    return _registry.get(name)


def registry() -> dict[str, type[Job]]:
    return dict(_registry)


def register(cls: type[Job]) -> None:
    """Register ``cls`` under ``cls.name``; CogworkerError if another class holds that name."""
    with _registry_lock:
        existing = _registry.get(cls.name)
        if existing is not None and (existing.__module__, existing.__qualname__) != (
                cls.__module__, cls.__qualname__):
            raise CogworkerError(
                f"job name {cls.name!r} is taken by {existing.__module__}.{existing.__qualname__}; "
                f"give {cls.__module__}.{cls.__qualname__} a distinct `name`")
        _registry[cls.name] = cls


def call_perform(job: Job, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """Run ``job.perform``. An ``async def perform`` is run to completion here, on an event loop of
    its own, through asgiref's ``async_to_sync`` as Django runs async code from sync code: the
    ORM's thread-sensitive calls stay on this thread (and its connection handling). Without
    this, a coroutine was created, never awaited, and the job counted as done."""
    result = job.perform(*args, **kwargs)
    if result is not None and inspect.isawaitable(result):  # (most return None: 3 µs a job saved)
        result = async_to_sync(_await)(result)
    return result


async def _await(awaitable: Any) -> Any:
    return await awaitable


class Job:
    """Base class of every job. Subclass it in an app's ``jobs.py``::

        class SendReceipt(Job):
            queue = "mail"
            retry = 5
            def perform(self, order_id): ...

    Options (class attributes, or per push with ``set(...)``):
    ``queue`` (``"default"``), ``retry`` (True: MAX_RETRIES; False or 0: none;
    an int), ``dead`` (False: a job out of retries is discarded, not kept),
    ``backtrace`` (True or a number of lines to keep with the error), ``unique_for`` and
    ``unique_until``; and the features': ``result_ttl`` (keep a result record this many seconds:
    ``get_result``), ``timeout`` (seconds a run may take; past it the run fails with JobTimeout),
    ``expires_in`` (seconds after it is due that a job still waiting is dropped, never run),
    ``limits`` (a list of :class:`~django_cogworker.Limiter`: places taken before each run;
    class only), ``encrypt`` (True: the arguments are stored AES-256-GCM encrypted with
    ENCRYPTION_KEYS, docs/encryption.md; ``perform`` gets them clear, ``self.payload`` has them
    sealed), ``cancellable`` (False: ``cancel`` refuses it). Each feature's folder says what its
    options do (features/<feature>/declaration.py).
    A running job reads ``self.cancelled`` to stop when asked (``Job.cancel``).
    Override ``retry_in(count, exc)`` to choose the delay before retry
    ``count`` (return seconds, or None for the default backoff).
    """

    name: ClassVar[str]
    queue: ClassVar[str] = "default"
    retry: ClassVar[bool | int] = True
    dead: ClassVar[bool] = True
    backtrace: ClassVar[bool | int] = False
    unique_for: ClassVar[float | None] = None
    unique_until: ClassVar[str] = "success"
    _cogworker_startup: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        where = f"{cls.__module__}.{cls.__qualname__}"
        check_unique(cls.unique_for, cls.unique_until, where)
        features = declared()
        for option in features.options:  # (each checked, and set: its default if the class gives none)
            value = getattr(cls, option.name, option.default)
            setattr(cls, option.name, value if option.check is None else option.check(value, f"{where}.{option.name}"))
        for rule in features.rules:
            rule(cls, where)
        check_queue(cls.queue, f"{where}.queue")
        if "name" not in cls.__dict__:
            cls.name = where
        # Whether every worker defines it too (its first push asks: discovery.check).
        cls._cogworker_startup = discovery.defined_with_worker_imports()
        register(cls)

    # The clear arguments of a run whose payload is sealed (perform_arguments), else None.
    arguments: tuple[list[Any], dict[str, Any]] | None = None

    def __init__(self, payload: dict[str, Any] | None = None):
        self.payload = payload or {}
        self.jid: str | None = self.payload.get("jid")

    @property
    def batch(self) -> Any:
        """The batch this job belongs to (a ``Batch`` to add jobs to, ``with self.batch.jobs():``), or None."""
        bid = self.payload.get("bid")
        if not isinstance(bid, str):
            return None
        return provided("open_batch")(bid)  # (features/declared.py, the batches' declaration)

    @property
    def cancelled(self) -> bool:
        """Whether this run was asked to stop (``Job.cancel``): a job that can stop between its
        steps reads it there. Asks Redis at most once a second; the heartbeat tells it too."""
        return bool(provided("cancel_asked")(self.payload))  # (features/cancellation/declaration.py)

    def progress(self, done: float, total: float | None = None, note: str = "") -> None:
        """Report how far this run got: ``done`` of ``total`` (None: unknown), and a short ``note``,
        for the admin's busy page, ``cogworker busy --json`` and ``get_progress(jid)``. Cheap to call
        for every item: written at most once a second, the last report at the run's end; a write
        that fails is logged, never raised. ValueError for a negative ``done``, a ``total`` <= 0, a
        ``note`` that isn't text (one over 200 characters is clipped). Outside a worker's run (a job
        made by hand) it does nothing; under the test helpers it is recorded (``jobs.progress(jid)``).
        The note is stored and shown in clear (admin, CLI), also for a job whose arguments are sealed:
        put no secret in it."""
        provided("progress")(self.payload, done, total, note)  # (features/progress/declaration.py)

    @classmethod
    def cancel(cls, jid: str, interrupt: bool = False) -> str:
        """Cancel job ``jid`` (of any class): "removed" if it waited, "signalled" if it runs (it
        stops when it reads ``cancelled``, or at once with ``interrupt``); JobNotFound otherwise."""
        return str(provided("cancel")(jid, interrupt=interrupt))

    @classmethod
    def cancel_refusal(cls, payload: dict[str, Any]) -> str:
        """Why ``cancel`` refuses the job ``payload`` of a class that isn't ``cancellable``."""
        return f"job {payload.get('jid')!r} is a {cls.name} job, which can't be cancelled"

    def perform(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.perform is not defined")

    def retry_in(self, count: int, exc: BaseException) -> float | None:
        """Return seconds to wait before retry ``count`` (0-based), or None for the default."""
        return None

    # -- pushing -------------------------------------------------------------

    @classmethod
    def s(cls, *args: Any, **kwargs: Any) -> Any:
        """A workflow step of this job with these arguments (features/batches/workflows.py: chain, group, chord)."""
        return provided("signature")(cls, args, kwargs)  # (features/batches/signature.py)

    @classmethod
    def set(cls, **options: Any) -> JobSetter:
        """Return a pusher with per-push options: ``queue``, ``retry``, ``dead``, ``backtrace``, ``on_commit``."""
        return JobSetter(cls, options)

    @classmethod
    def perform_async(cls, *args: Any, **kwargs: Any) -> str | None:
        return plain_setter(cls)._push_now(args, kwargs)

    @classmethod
    def perform_in(cls, delay: float | dt.timedelta, *args: Any, **kwargs: Any) -> str | None:
        return JobSetter(cls, {}).perform_in(delay, *args, **kwargs)

    @classmethod
    def perform_at(cls, when: float | dt.datetime, *args: Any, **kwargs: Any) -> str | None:
        return JobSetter(cls, {}).perform_at(when, *args, **kwargs)

    @classmethod
    def perform_bulk(cls, items: Iterable[Sequence[Any]]) -> list[str]:
        return JobSetter(cls, {}).perform_bulk(items)


# Options that may be given per push with Job.set(...), the features' apart (django_cogworker/declarations.py).
CORE_PUSH_OPTIONS = frozenset({"queue", "retry", "dead", "backtrace", "on_commit", "unique_for", "unique_until"})


def push_options() -> frozenset[str]:
    """Every option ``set(...)`` takes: the core's and the features' (``Option.push``)."""
    return CORE_PUSH_OPTIONS | declared().push_options


class JobSetter:
    """A job class plus per-push options; what ``Job.set(...)`` returns."""

    def __init__(self, job_class: type[Job], options: dict[str, Any]):
        if job_class not in _known:  # (one set lookup a push: the verdict is kept per class)
            discovery.check(job_class)
            _known.add(job_class)
        features = declared()
        if options:  # (Job.perform_* make one with none on every push: nothing to check)
            unknown = set(options) - CORE_PUSH_OPTIONS - features.push_options
            if unknown:
                allowed = sorted(CORE_PUSH_OPTIONS | features.push_options)
                raise TypeError(f"unknown push option(s) {sorted(unknown)}; allowed: {allowed}")
            if "queue" in options:
                check_queue(options["queue"], "queue")
            # (Checked here too, not only when a payload is built: a workflow's step is built in a worker.)
            name = getattr(job_class, "name", job_class.__qualname__)
            for option in features.options:
                if option.push and option.name in options and option.check_push is not None:
                    option.check_push(options[option.name], name, job_class)
            if options.get("unique_for") is not None:
                check_unique(options["unique_for"], options.get("unique_until", job_class.unique_until), name)
        self.job_class = job_class
        self.options = options
        self.push_hooks = features.push_hooks(job_class, options)

    def build(self, args: Sequence[Any], kwargs: dict[str, Any], now: float | None = None, *,
              head: Sequence[tuple[str, str]] = (), due: float | None = None) -> dict[str, Any]:
        """Return a new payload for these arguments, checking they are JSON-native, as the features'
        push hooks leave it (sealed if the job encrypts: its first ``len(head)`` arguments left clear,
        each the (kind, bound) its seal names: a batch callback's status, codec.open_arguments);
        ``due``: when it is to run (perform_at), if later than now."""
        args = list(args)
        check_json_native(args, "args")
        if kwargs or type(kwargs) is not dict:  # (most pushes have none: nothing to walk)
            check_json_native(kwargs, "kwargs")
        payload = self._payload(args, kwargs, time.time() if now is None else now)
        for hook in self.push_hooks:  # (most pushes: none)
            hook(payload, self.job_class, self.options, head, due)
        return payload

    def _payload(self, args: list[Any], kwargs: Any, created_at: float) -> dict[str, Any]:
        """The payload for arguments already checked, before the features' push hooks."""
        cls, opts = self.job_class, self.options
        payload: dict[str, Any] = {
            "jid": payloads.new_jid(),
            "class": cls.name,
            "args": args,
            "kwargs": kwargs,
            "queue": opts.get("queue", cls.queue),
            "retry": opts.get("retry", cls.retry),
            "created_at": created_at,
        }
        dead = opts.get("dead", cls.dead)
        if dead is not True:
            payload["dead"] = bool(dead)
        trace = opts.get("backtrace", cls.backtrace)
        if trace:
            payload["backtrace"] = trace
        unique_for = opts.get("unique_for", cls.unique_for)
        if unique_for is not None:  # (0 is refused, not taken for "not unique": None is that)
            unique_until = opts.get("unique_until", cls.unique_until)
            check_unique(unique_for, unique_until, cls.name)
            payload.update(unique_for=unique_for, unique_until=unique_until)
            payload["unique_digest"] = _digest(payload)
        return payload

    def _client(self) -> Any:
        global _runtime
        if _runtime is None:
            # Imported on first push, not with this module: the engine imports the job
            # registry and stays free of Django (runtime is the Django edge).
            from . import runtime as _runtime
        return _runtime.get_client()

    def perform_async(self, *args: Any, **kwargs: Any) -> str | None:
        return self._push_now(args, kwargs)

    def push(self, *args: Any, **kwargs: Any) -> Any:
        """Push now as ``perform_async`` does; return what it came to, a ``PushOutcome``: ``status``
        "pushed", "replaced", "dropped" or "deferred", ``jid`` and ``other`` (docs/fairness.md)."""
        client = self._client()
        client.forget_outcome()
        return client.outcome(self._push_now(args, kwargs))

    def _push_now(self, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
        # (One frame for Job.perform_async and this class's: every call is paid on every push.)
        client = self._client() if _runtime is None else _runtime.get_client()
        payload = self.build(args, kwargs)
        check_call(self.job_class, args, kwargs)  # (after build: the JSON check names a bad value first)
        return client.push(payload, on_commit=self.options.get("on_commit"))

    def perform_in(self, delay: float | dt.timedelta, *args: Any, **kwargs: Any) -> str | None:
        if isinstance(delay, dt.timedelta):
            delay = delay.total_seconds()
        if not isinstance(delay, (int, float)) or isinstance(delay, bool):
            raise InvalidArgument(f"perform_in takes seconds or a timedelta, got {delay!r}")
        try:
            delay = float(delay)
        except OverflowError:  # (10**400)
            raise InvalidArgument("perform_in's delay must be finite, got an int past what a float holds") from None
        return self.perform_at(time.time() + delay, *args, **kwargs)

    def perform_at(self, when: float | dt.datetime, *args: Any, **kwargs: Any) -> str | None:
        at = epoch(when)
        payload = self.build(args, kwargs, due=at)
        check_call(self.job_class, args, kwargs)
        return self._client().push(payload, at=at, on_commit=self.options.get("on_commit"))

    def perform_bulk(self, items: Iterable[Sequence[Any]]) -> list[str]:
        """Push one job per argument sequence in ``items``, in one round trip.

        Every job of the call has the same ``created_at`` (as in Sidekiq's push_bulk): the
        options are read once, for the first job, and the others' payloads are copies of its
        with their own jid, args and unique digest.
        """
        built = []
        first: dict[str, Any] | None = None
        hooks, bulk_hooks = declared().bulk_push_hooks(self.job_class, self.options) if self.push_hooks else ((), ())
        for i, args in enumerate(items):
            kind = type(args)
            if kind is not tuple and kind is not list and (
                    isinstance(args, (str, bytes, dict)) or not isinstance(args, Sequence)):
                raise TypeError(f"perform_bulk items must be argument lists or tuples; item {i} is {args!r}")
            args = list(args)
            try:
                check_json_native(args, "args")
            except TypeError as exc:  # (of the same class: a nesting too deep is an InvalidArgument)
                raise type(exc)(f"perform_bulk item {i}: {exc}") from None
            check_call(self.job_class, args, {}, f"perform_bulk item {i}: ")
            if first is None:
                payload = first = self._payload(args, {}, time.time())
                unique = "unique_digest" in first
            else:
                payload = first.copy()
                payload["args"] = args
                payload["kwargs"] = {}
                if unique:
                    payload["unique_digest"] = _digest(payload)
            for hook in hooks:  # (the copies are of the first as hooked: each given its own args, then hooked)
                hook(payload, self.job_class, self.options, (), None)
            built.append(payload)
        for payload, jid in zip(built, payloads.new_jids(len(built)), strict=True):
            payload["jid"] = jid
        for bulk_hook in bulk_hooks:  # (once on them all, jids given: the tracing's one span for the push)
            bulk_hook(built, self.job_class, self.options)
        return self._client().push_bulk(built, on_commit=self.options.get("on_commit"))


def plain_setter(job_class: Any) -> JobSetter:
    """``Job.perform_async``'s setter for ``job_class``: it has no options, and reads the class's when it
    builds a payload, so one serves every push (instead of one made per push)."""
    setter = _plain_setters.get(job_class)
    if setter is None:
        setter = _plain_setters[job_class] = JobSetter(job_class, {})
    return setter


def _digest(payload: dict[str, Any]) -> str:
    from .unique import digest

    return digest(payload)


_runtime: Any = None  # django_cogworker.push.runtime, once a push has imported it

_plain_setters: dict[Any, JobSetter] = {}
# The job classes some worker defines (discovery.check let them through): checked once each.
_known: set[Any] = set()
