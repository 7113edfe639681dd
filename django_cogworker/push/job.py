"""Job classes, their options, and the registry the worker resolves names through.

Subclassing :class:`Job` registers the class under a stable name (its module
and qualified name, or ``name = "..."``). A payload carries that name and the
worker looks it up here only: nothing read from Redis is ever imported.
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

from ..bounds import check_seconds, check_text
from ..errors import BatchError, CogworkerError, InvalidArgument
from ..features.encryption import codec as _sealing
from ..features.encryption.keys import KeyRing, sealing_ring
from . import discovery
from . import payload as payloads
from . import scope as _scope
from .arguments import check_call, check_json_native, check_limits, check_unique, epoch

logger = logging.getLogger(__name__)

_registry: dict[str, type[Job]] = {}
_registry_lock = threading.Lock()

# Options that may be given per push with Job.set(...).
PUSH_OPTIONS = frozenset({"queue", "retry", "dead", "backtrace", "on_commit", "unique_for", "unique_until",
                          "expires_in", "encrypt"})


def registered(name: str) -> type[Job] | None:
    """Return the job class registered as ``name``, or None."""
    return _registry.get(name)


def registry() -> dict[str, type[Job]]:
    return dict(_registry)


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


def push_ring(job_class: type[Job]) -> KeyRing:
    """The ring a push seals with (the settings' ENCRYPTION_KEYS); NoEncryptionKeys if there is none."""
    global _runtime
    if _runtime is None:
        from . import runtime as _runtime
    return sealing_ring(_runtime.get_config().encryption_keys, getattr(job_class, "name", job_class.__qualname__))


class Job:
    """Base class of every job. Subclass it in an app's ``jobs.py``::

        class SendReceipt(Job):
            queue = "mail"
            retry = 5
            def perform(self, order_id): ...

    Options (class attributes, or per push with ``set(...)``):
    ``queue`` (``"default"``), ``retry`` (True: MAX_RETRIES; False or 0: none;
    an int), ``dead`` (False: a job out of retries is discarded, not kept),
    ``backtrace`` (True or a number of lines to keep with the error),
    ``result_ttl`` (keep a result record this many seconds: ``get_result``),
    ``timeout`` (seconds a run may take; past it the run fails with JobTimeout),
    ``expires_in`` (seconds after it is due that a job still waiting is dropped, never run),
    ``limits`` (a list of :class:`~django_cogworker.Limiter`: places taken before each run;
    class only), ``encrypt`` (True: the arguments are stored AES-256-GCM encrypted with
    ENCRYPTION_KEYS, docs/encryption.md; ``perform`` gets them clear, ``self.payload`` has them sealed).
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
    # Seconds to keep a result record (status, return value, errors; features/results/writer.py) after
    # its last change; None: no record, and nothing paid for one.
    result_ttl: ClassVar[float | None] = None
    # Seconds a run may take before JobTimeout is raised in it (engine/run/timeouts.py); None: no limit.
    timeout: ClassVar[float | None] = None
    # Seconds after it is due (pushed, or its perform_at time) that a job still waiting is
    # dropped at fetch, never run (features/expiry/hook.py); None: never.
    expires_in: ClassVar[float | None] = None
    # Limiters each run takes a place in first (features/limits/): over one, the job is rescheduled.
    limits: ClassVar[Sequence[Any]] = ()
    # True: arguments sealed in every payload, opened only for its run (features/encryption/).
    encrypt: ClassVar[bool] = False
    _cogworker_startup: ClassVar[bool] = True
    # False for the package's hand-over jobs (batches/: a chain's next step, a child batch telling
    # its parent): a chain or a batch waits for each, and cancelled, it waited for ever. ``cancel``
    # refuses them (NotCancellable, saying why: ``cancel_refusal``); a worker ignores a request for one.
    cancellable: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        where = f"{cls.__module__}.{cls.__qualname__}"
        check_unique(cls.unique_for, cls.unique_until, where)
        for option in ("result_ttl", "timeout", "expires_in"):
            check_seconds(getattr(cls, option), f"{where}.{option}")
        cls.limits = check_limits(cls.limits, f"{where}.limits")
        if not isinstance(cls.encrypt, bool):
            raise InvalidArgument(f"{where}.encrypt must be True or False, got {cls.encrypt!r}")
        if cls.encrypt and any(getattr(limiter, "key_fn", None) is not None for limiter in cls.limits):
            # (A limiter's key is found before the run, from the payload's arguments: sealed, it has none.)
            raise InvalidArgument(f"{where}: a job that encrypts its arguments can't have a limit keyed by "
                                  f"them (its limiters' key functions would see none)")
        check_text(cls.queue, f"{where}.queue")
        if "name" not in cls.__dict__:
            cls.name = where
        # Whether every worker defines it too (its first push asks: discovery.check).
        cls._cogworker_startup = discovery.defined_with_worker_imports()
        with _registry_lock:
            existing = _registry.get(cls.name)
            if existing is not None and (existing.__module__, existing.__qualname__) != (
                    cls.__module__, cls.__qualname__):
                raise CogworkerError(
                    f"job name {cls.name!r} is taken by {existing.__module__}.{existing.__qualname__}; "
                    f"give {cls.__module__}.{cls.__qualname__} a distinct `name`")
            _registry[cls.name] = cls

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
        return _scope.open_batch(bid)  # (batches/ imports push/, not the other way: it sets this)

    @property
    def cancelled(self) -> bool:
        """Whether this run was asked to stop (``Job.cancel``): a job that can stop between its
        steps reads it there. Asks Redis at most once a second; the heartbeat tells it too."""
        return bool(_scope.cancel_hook("asked")(self.payload))

    @classmethod
    def cancel(cls, jid: str, interrupt: bool = False) -> str:
        """Cancel job ``jid`` (of any class): "removed" if it waited, "signalled" if it runs (it
        stops when it reads ``cancelled``, or at once with ``interrupt``); JobNotFound otherwise."""
        return str(_scope.cancel_hook("cancel")(jid, interrupt=interrupt))

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
        return Signature(cls, args, kwargs)

    @classmethod
    def set(cls, **options: Any) -> JobSetter:
        """Return a pusher with per-push options: ``queue``, ``retry``, ``dead``, ``backtrace``, ``on_commit``."""
        return JobSetter(cls, options)

    @classmethod
    def perform_async(cls, *args: Any, **kwargs: Any) -> str | None:
        setter = _plain_setters.get(cls)
        if setter is None:
            setter = _plain_setters[cls] = JobSetter(cls, {})
        return setter._push_now(args, kwargs)

    @classmethod
    def perform_in(cls, delay: float | dt.timedelta, *args: Any, **kwargs: Any) -> str | None:
        return JobSetter(cls, {}).perform_in(delay, *args, **kwargs)

    @classmethod
    def perform_at(cls, when: float | dt.datetime, *args: Any, **kwargs: Any) -> str | None:
        return JobSetter(cls, {}).perform_at(when, *args, **kwargs)

    @classmethod
    def perform_bulk(cls, items: Iterable[Sequence[Any]]) -> list[str]:
        return JobSetter(cls, {}).perform_bulk(items)


class JobSetter:
    """A job class plus per-push options; what ``Job.set(...)`` returns."""

    def __init__(self, job_class: type[Job], options: dict[str, Any]):
        if job_class not in _known:  # (one set lookup a push: the verdict is kept per class)
            discovery.check(job_class)
            _known.add(job_class)
        if options:  # (Job.perform_* make one with none on every push: nothing to check)
            unknown = set(options) - PUSH_OPTIONS
            if unknown:
                raise TypeError(f"unknown push option(s) {sorted(unknown)}; allowed: {sorted(PUSH_OPTIONS)}")
            if "queue" in options:
                check_text(options["queue"], "queue")
            if "encrypt" in options and not isinstance(options["encrypt"], bool):
                raise InvalidArgument(f"encrypt must be True or False, got {options['encrypt']!r}")
            # (Checked here too, not only when a payload is built: a workflow's step is built in a worker.)
            name = getattr(job_class, "name", job_class.__qualname__)
            if options.get("expires_in") is not None:
                check_seconds(options["expires_in"], f"{name}: expires_in")
            if options.get("unique_for") is not None:
                check_unique(options["unique_for"], options.get("unique_until", job_class.unique_until), name)
        self.job_class = job_class
        self.options = options

    def build(self, args: Sequence[Any], kwargs: dict[str, Any], now: float | None = None, *,
              head: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
        """Return a new payload for these arguments, checking they are JSON-native; sealed if the
        job encrypts (its first ``len(head)`` arguments left clear, each the (kind, bound) its seal
        names: a batch callback's status, codec.open_arguments)."""
        args = list(args)
        check_json_native(args, "args")
        if kwargs or type(kwargs) is not dict:  # (most pushes have none: nothing to walk)
            check_json_native(kwargs, "kwargs")
        payload = self._payload(args, kwargs, time.time() if now is None else now)
        if self.encrypts:
            self._seal(payload, head)
        return payload

    @property
    def encrypts(self) -> bool:
        return bool(self.options.get("encrypt", self.job_class.encrypt)) if self.options else self.job_class.encrypt

    def _seal(self, payload: dict[str, Any], head: Sequence[tuple[str, str]] = ()) -> None:
        """Seal ``payload``'s arguments (and key its unique digest, which hashes them) in place."""
        ring = push_ring(self.job_class)
        if "unique_digest" in payload:
            payload["unique_digest"] = ring.unique_digest(payload["unique_digest"])
        _sealing.seal_payload(payload, ring, head)

    def _payload(self, args: list[Any], kwargs: Any, created_at: float) -> dict[str, Any]:
        """The payload for arguments already checked."""
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
        expires_in = opts.get("expires_in", cls.expires_in)
        if expires_in is not None:  # (checked by the class or set(); perform_at moves it to its due time)
            payload["expires_at"] = created_at + expires_in
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
        payload = self.build(args, kwargs)
        if "expires_at" in payload:
            payload["expires_at"] += max(at - payload["created_at"], 0.0)
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
        encrypts = self.encrypts
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
            if encrypts:  # (the copies are of the sealed first: each given its own args, then sealed)
                self._seal(payload)
            built.append(payload)
        for payload, jid in zip(built, payloads.new_jids(len(built)), strict=True):
            payload["jid"] = jid
        return self._client().push_bulk(built, on_commit=self.options.get("on_commit"))


class Signature:
    """One job with its arguments: ``MyJob.s(1, 2)``."""

    def __init__(self, job_class: type[Job], args: Sequence[Any], kwargs: dict[str, Any],
                 options: dict[str, Any] | None = None, takes_previous: bool = False):
        if not (isinstance(job_class, type) and issubclass(job_class, Job)) or job_class is Job:
            raise BatchError(f"a workflow step must be a Job class (a subclass of Job), got {job_class!r}")
        self.job_class = job_class
        self.args = list(args)
        self.kwargs = dict(kwargs)
        self.options = dict(options or {})
        self.takes_previous = takes_previous
        check_json_native(self.args, "args")
        check_json_native(self.kwargs, "kwargs")
        JobSetter(job_class, self.options)  # (checks the options)

    def check(self) -> Signature:
        """Raise TypeError if ``perform`` can't take these arguments (and the previous value, when
        asked for): called by the workflow taking this step, as ``with_previous`` may come after."""
        check_call(self.job_class, [None, *self.args] if self.takes_previous else self.args, self.kwargs,
                   f"{self.job_class.name}.s(...): ")
        return self

    def set(self, **options: Any) -> Signature:
        """The same step with push options (queue, retry, ...)."""
        return Signature(self.job_class, self.args, self.kwargs, {**self.options, **options}, self.takes_previous)

    def with_previous(self) -> Signature:
        """The same step, given the previous step's return value as its first argument."""
        return Signature(self.job_class, self.args, self.kwargs, self.options, True)

    def describe(self) -> str:
        return self.job_class.name.rsplit(".", 1)[-1]

    def launch(self, previous: Any, keep: bool) -> str | None:
        setter = JobSetter(self.job_class, self.options)
        return setter._client().push(self._build(setter, previous, keep))

    @staticmethod
    def launch_many(signatures: Sequence[Signature], previous: Any, keep: bool) -> list[str | None]:
        """Push these steps as ``launch`` would each, in one ``push_bulk`` (one round trip, and the
        batch counts them in one step: a group of 10,000 pushed one at a time took two round trips
        a job); return their jids, in order (None for one a middleware stopped)."""
        if not signatures:
            return []
        built = []
        for signature in signatures:
            setter = JobSetter(signature.job_class, signature.options)
            built.append(signature._build(setter, previous, keep))
        pushed = set(setter._client().push_bulk(built))
        return [payload["jid"] if payload["jid"] in pushed else None for payload in built]

    def _build(self, setter: JobSetter, previous: Any, keep: bool) -> dict[str, Any]:
        payload = setter.build([previous, *self.args] if self.takes_previous else self.args, self.kwargs)
        if keep:
            payload["keep_result"] = True
        return payload

    def dump(self) -> dict[str, Any]:
        """The step as stored in its workflow's batch data; sealed (``"e"``) if its job encrypts, its
        clear options and ``with_previous`` bound to the seal: changed in Redis, ``"p"`` put the previous
        step's value before its sealed arguments, and ``"o"`` ``{"encrypt": false}`` pushed them in clear."""
        data = {"t": "sig", "c": self.job_class.name, "a": self.args, "k": self.kwargs, "o": self.options,
                "p": self.takes_previous}
        if JobSetter(self.job_class, self.options).encrypts:
            bound = _sealing.binding([self.options, bool(self.takes_previous)])
            data.update(a=[], k={}, e=_sealing.seal(self.args, self.kwargs, self.job_class.name,
                                                     push_ring(self.job_class), bound=bound))
        return data

    @classmethod
    def load(cls, job_class: type[Job], data: dict[str, Any]) -> Signature:
        """The step ``dump`` stored (opened with the settings' keys if sealed)."""
        args, kwargs = data["a"], data["k"]
        if "e" in data:
            args, kwargs = _sealing.unseal(data["e"], job_class.name, push_ring(job_class),
                                           _sealing.binding([data["o"], bool(data["p"])]))
        return cls(job_class, args, kwargs, data["o"], data["p"])


def _digest(payload: dict[str, Any]) -> str:
    from .unique import digest

    return digest(payload)


_runtime: Any = None  # django_cogworker.push.runtime, once a push has imported it

# Job.perform_async's setter per class: it has no options, and reads the class's when it
# builds a payload, so one serves every push (instead of one made per push).
_plain_setters: dict[type[Job], JobSetter] = {}
# The job classes some worker defines (discovery.check let them through): checked once each.
_known: set[type[Job]] = set()
