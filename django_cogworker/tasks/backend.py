"""A ``django.tasks`` backend: ``@task`` functions pushed and run as cogworker jobs.

::

    TASKS = {"default": {"BACKEND": "django_cogworker.tasks.CogworkerBackend",
                         "QUEUES": ["default", "mail"],
                         "OPTIONS": {"RESULT_TTL": 86400, "RETRY": 3, "TIMEOUT": 300}}}

Each task function is a job: at its decoration a Job class is registered under the task's
module path (``myapp.tasks.send_mail``), with the task's and the backend's options, so a task
gets everything a Job gets (the client middleware, on-commit pushes, the JSON check, reliable
fetch, orphan recovery, retries, the dead set, unique and periodic use, the admin). A worker
knows only the tasks of the modules it imported at startup (each installed app's ``tasks.py``
and ``OPTIONS["MODULES"]``): a payload naming any other path is dead on arrival, nothing imported.

Every task keeps a result record (:mod:`django_cogworker.features.results.records`), read by ``get_result``.

A task that raises is FAILED, as Django's API has it: no retries unless asked for, per task
(``@task(retry=3)``) or per backend (``OPTIONS["RETRY"]``). A task out of retries goes where a job
does: the dead set.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import logging
import time
from collections.abc import Mapping
from typing import Any

from ..bounds import check_seconds
from ..broker.keys import Keys
from ..errors import CogworkerError, ConfigError, InvalidArgument
from ..features.limits.declaration import check_limits
from ..features.results import records as results
from ..push.job import Job, JobSetter, registered
from . import options
from .api import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
    task_finished,
    task_started,
)

logger = logging.getLogger(__name__)



@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CogworkerTask(Task):
    """A task with cogworker's options (``@task(retry=3, timeout=60)``, Django 6.1 and the backport).

    ``retry``: retries after a failed attempt, as a Job's (a count; True: MAX_RETRIES; False or 0:
    none); default the backend's ``OPTIONS["RETRY"]``, itself 0. ``timeout``: seconds, default
    ``OPTIONS["TIMEOUT"]``. ``unique_for`` and ``unique_until``: as a Job's. ``dead``: False
    discards a task out of retries (kept in the dead set by default). ``limits``: limiters each run
    takes a place in first (``Limiter``, docs/flow-control.md); ``expires_in``: seconds after it is
    due that a task still waiting is dropped unrun (its result then reads FAILED, JobExpired).
    ``encrypt``: its arguments stored encrypted with ENCRYPTION_KEYS (docs/encryption.md); its result
    record keeps none of them.
    """

    retry: bool | int | None = None
    timeout: float | None = None
    unique_for: float | None = None
    unique_until: str = "success"
    dead: bool = True
    limits: tuple[Any, ...] = ()
    expires_in: float | None = None
    encrypt: bool = False

    def __post_init__(self) -> None:
        Task.__post_init__(self)  # (validate_task; zero-argument super() fails in a slots dataclass)
        if self.retry is not None and not options.valid_retry(self.retry):
            raise InvalidTask(f"{self.module_path}: @task(retry=...) must be True, False or a count >= 0, "
                              f"got {self.retry!r}")
        try:
            object.__setattr__(self, "limits", check_limits(self.limits, f"{self.module_path}: @task(limits=...)"))
            check_seconds(self.expires_in, f"{self.module_path}: @task(expires_in=...)")
            if not isinstance(self.encrypt, bool):
                raise InvalidArgument(f"{self.module_path}: @task(encrypt=...) must be True or False, "
                                      f"got {self.encrypt!r}")
        except CogworkerError as exc:
            raise InvalidTask(str(exc)) from None
        job_class_for(self)


def job_class_for(task: Any) -> type[Job]:
    """The Job class that runs ``task`` (registered under its module path at its first sight)."""
    name = task.module_path
    existing = registered(name)
    known = getattr(existing, "task", None)
    if existing is not None and known is not None and known.func is task.func:
        return existing
    backend = task.get_backend()
    attrs = {
        "__module__": task.func.__module__, "__qualname__": task.func.__qualname__, "__doc__": task.func.__doc__,
        "name": name, "task": task, "queue": task.queue_name,
        "retry": backend.retry if getattr(task, "retry", None) is None else task.retry,
        "timeout": backend.timeout if getattr(task, "timeout", None) is None else task.timeout,
        "result_ttl": backend.result_ttl,
        "unique_for": getattr(task, "unique_for", None), "unique_until": getattr(task, "unique_until", "success"),
        "dead": getattr(task, "dead", True),
        "limits": getattr(task, "limits", ()), "expires_in": getattr(task, "expires_in", None),
        "encrypt": getattr(task, "encrypt", False),
    }
    runner = AsyncTaskRunner if inspect.iscoroutinefunction(task.func) else TaskRunner
    return type(task.func.__name__, (runner, Job), attrs)


class TaskRunner:
    """What the Job classes :func:`job_class_for` makes run: the task's function.

    A mixin, not a Job: a Job subclass would be registered itself, a name a payload could give.
    """

    task: Any
    payload: dict[str, Any]
    jid: str | None
    _cogworker_result: results.JobResult | None = None  # the record at this attempt's start (features/results/hook.py)
    arguments: tuple[list[Any], dict[str, Any]] | None  # (Job's: opened, if sealed)

    def perform(self, *args: Any, **kwargs: Any) -> Any:
        task = type(self).task
        running = self._started()
        # A failure is told (task_finished) by _cogworker_failed, once the processor has filed it:
        # only then is it known whether the task runs again.
        if task.takes_context:
            value = task.call(TaskContext(task_result=running), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        return self._finished(value)

    def _started(self) -> Any:
        running = self.task_result(TaskResultStatus.RUNNING)
        _signal(task_started, running)
        return running

    def _finished(self, value: Any) -> Any:
        finished = self.task_result(TaskResultStatus.SUCCESSFUL)
        object.__setattr__(finished, "_return_value", value)
        _signal(task_finished, finished)
        return value

    def _cogworker_failed(self, retried: bool) -> None:
        """Send task_finished FAILED for an attempt that raised, unless a retry was filed.

        A retried task has not finished: its result reads READY, and the FAILED that Django's
        receiver logs (at ERROR, with the traceback) said otherwise. The processor calls this
        (features/results/hook.py) once the attempt is filed and recorded, inside its handler of the
        exception, so that receiver logs the traceback (sys.exc_info()); the testing modes call
        it with retried=False. A name of our own, as the engine looks it up on any job with a
        result: a user's Job keeps its own attribute names.
        """
        if not retried:
            _signal(task_finished, self.task_result(TaskResultStatus.FAILED))

    def task_result(self, status: Any) -> Any:
        """This attempt as a TaskResult (from its record; from the payload if Redis didn't answer)."""
        payload, record = self.payload, self._cogworker_result
        if record is None:
            count = payload.get("retry_count")
            attempts = count + 2 if type(count) is int and count >= 0 else 1
            # (A task that encrypts: its payload's arguments are sealed, the opened ones are the job's.)
            args, kwargs = self.arguments or (payload.get("args", []), payload.get("kwargs") or {})
            record = results.JobResult(
                jid=str(self.jid), name=type(self).task.module_path, status=status, args=list(args),
                kwargs=dict(kwargs), queue=payload.get("queue", ""), enqueued_at=None,
                started_at=None, finished_at=None, last_attempted_at=None, errors=[], worker_ids=["?"] * attempts,
                task=payload.get("task") or {})
        task = type(self).task
        return to_task_result(_on_queue(task, record.queue), record,
                              str((payload.get("task") or {}).get("backend", task.backend)), status)


class AsyncTaskRunner(TaskRunner):
    """The runner of an ``async def`` task: its perform is a coroutine, so the worker awaits it on its
    event loop (engine/loop/runner.py; on a thread through async_to_sync with ASYNC_CONCURRENCY 0)."""

    async def perform(self, *args: Any, **kwargs: Any) -> Any:
        task = type(self).task
        running = self._started()
        if task.takes_context:
            value = await task.acall(TaskContext(task_result=running), *args, **kwargs)
        else:
            value = await task.acall(*args, **kwargs)
        return self._finished(value)


def to_task_result(task: Any, record: results.JobResult, backend: str, status: Any = None) -> Any:
    """A django.tasks TaskResult from a result record."""
    result = TaskResult(
        task=task, id=record.jid, status=TaskResultStatus(status or record.status),
        enqueued_at=record.enqueued_at, started_at=record.started_at, finished_at=record.finished_at,
        last_attempted_at=record.last_attempted_at, args=record.args, kwargs=record.kwargs, backend=backend,
        errors=[TaskError(exception_class_path=e.get("exception_class_path", ""), traceback=e.get("traceback", ""))
                for e in record.errors if isinstance(e, dict)],
        worker_ids=list(record.worker_ids))
    if record.status == results.SUCCESSFUL:
        object.__setattr__(result, "_return_value", record._return_value)
    return result


class CogworkerBackend(BaseTaskBackend):
    """The ``TASKS`` backend; see the module's docstring and docs/tasks.md."""

    task_class = CogworkerTask
    supports_defer = True  # run_after: the schedule set
    supports_async_task = True  # awaited on the worker's event loop (or through async_to_sync on a thread)
    supports_get_result = True  # the result record
    # Task.priority (Django's -100..100, default 0) is the job's ``priority`` (features/fairness/): a
    # higher one runs first within its queue, 0 is a plain job. The queues keep their weights.
    supports_priority = True

    def __init__(self, alias: str, params: Mapping[str, Any]):
        # Bad options don't raise here (as Django starts: @task builds the backend); they are told
        # by manage.py check, runcogworker and a push (tasks/options.py).
        read = options.read(alias, params)
        given = {key: params[key] for key in ("BACKEND", "QUEUES") if key in params}
        if "QUEUES" in given and read.queues is None:
            given["QUEUES"] = []  # (bad: any queue, so that its @task functions decorate all the same)
        super().__init__(alias, {**given, "OPTIONS": dict(params.get("OPTIONS") or {}) if isinstance(
            params.get("OPTIONS"), Mapping) else {}})
        self.problems = read.problems
        self.result_ttl = read.result_ttl
        self.timeout = read.timeout
        self.retry = read.retry
        self.enqueue_on_commit = read.enqueue_on_commit
        self.modules = read.modules

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Push ``task`` as a job (on commit inside a transaction); return its READY TaskResult."""
        from ..push import runtime

        if self.problems:
            raise ConfigError(list(self.problems))
        self.validate_task(task)
        job_class = job_class_for(task)
        options: dict[str, Any] = {"queue": task.queue_name}
        if task.priority:  # (0, Django's default: no field, a plain job's payload)
            options["priority"] = task.priority
        payload = JobSetter(job_class, options).build(list(args), dict(kwargs))
        at = task.run_after.timestamp() if task.run_after is not None else None
        payload["task"] = {"backend": self.alias, "priority": task.priority, "run_after": at}
        now = time.time()
        client = runtime.get_client()
        redis = getattr(client, "redis", None)  # (None: a testing stand-in, which keeps no record)
        keys = Keys(runtime.get_config().key_prefix)
        # A deferred task's record outlives its wait: it is read while it waits.
        ttl = self.result_ttl + (max(0.0, at - now) if at is not None else 0.0)

        def send() -> None:
            # The READY record first: written after the push, it could land after a fast
            # worker's RUNNING and hide it.
            if redis is not None:
                results.write_ready(redis, keys, payload, ttl, now)
            try:
                pushed = client.push(payload, at=at, on_commit=False)
            except BaseException:
                _forget(redis, keys, payload["jid"])
                raise
            if pushed is None:  # stopped by a middleware, or a duplicate of a unique task
                _forget(redis, keys, payload["jid"])

        on_commit = runtime.get_config().enqueue_on_commit if self.enqueue_on_commit is None else self.enqueue_on_commit
        outbox = getattr(client, "outbox", None)
        alias = outbox.atomic_alias() if on_commit and outbox is not None else None
        if alias is not None:
            _enqueue_in_outbox(client, alias, redis, keys, payload, at, ttl, now)
        else:
            defer = getattr(client, "defer", None)
            if not (on_commit and defer is not None and defer(send, [payload])):
                send()
        result = TaskResult(task=task, id=payload["jid"], status=TaskResultStatus.READY,
                            enqueued_at=dt.datetime.fromtimestamp(now, tz=dt.UTC), started_at=None,
                            finished_at=None, last_attempted_at=None, args=list(args), kwargs=dict(kwargs),
                            backend=self.alias, errors=[], worker_ids=[])
        _signal(task_enqueued, result)
        return result

    def get_result(self, result_id: str) -> Any:
        """The TaskResult of ``result_id``; TaskResultDoesNotExist if it has no record (or it expired)."""
        from ..push import runtime

        record = results.read(runtime.get_redis(), Keys(runtime.get_config().key_prefix), str(result_id))
        if record is None:
            raise TaskResultDoesNotExist(result_id)
        job_class = registered(record.name)
        task = getattr(job_class, "task", None)
        if task is None:
            raise TaskResultDoesNotExist(f"{result_id}: its task {record.name!r} is not known to this process "
                                         f"(not in an app's tasks.py nor in OPTIONS['MODULES'])")
        return to_task_result(_on_queue(task, record.queue), record, str(record.task.get("backend", self.alias)))

    def check(self, **kwargs: Any) -> list[Any]:
        """Warn of a queue tasks may name that no worker of COGWORKER["QUEUES"] serves: its tasks would wait forever."""
        from django.core import checks

        from ..push import runtime

        try:
            served = set(runtime.get_config().queue_names)
        except Exception:  # (a bad COGWORKER is cogworker.E001's to report)
            return []
        return [checks.Warning(f'TASKS["{self.alias}"]["QUEUES"] names {queue!r}, which COGWORKER["QUEUES"] '
                               f"doesn't list: runcogworker won't run its tasks unless started with -q {queue}",
                               id="cogworker.W101") for queue in sorted(self.queues - served)]

    def validate_task(self, task: Any) -> None:
        super().validate_task(task)
        if not isinstance(task, CogworkerTask):
            raise InvalidTask(f"{task.module_path} was not made by this backend's @task")


def _signal(signal: Any, task_result: Any) -> None:
    """Send a django.tasks signal; a receiver that raises is logged. Its error must not fail a task
    that ran (it would run again) nor a push that went through (the caller would push again)."""
    for receiver, response in signal.send_robust(CogworkerBackend, task_result=task_result):
        if isinstance(response, Exception):
            logger.error("task signal receiver %r failed for task %s", receiver, task_result.id, exc_info=response)


def _on_queue(task: Any, queue: str) -> Any:
    """``task`` on the queue it was pushed to; as declared if that queue isn't valid here (this
    process's TASKS may list other queues than the pusher's: reading a result must not fail)."""
    if not queue or queue == task.queue_name:
        return task
    try:
        return task.using(queue_name=queue)
    except InvalidTask:
        return task


def _forget(redis: Any, keys: Keys, jid: str) -> None:
    """Drop the READY record of a task that wasn't pushed (best-effort: it expires anyway)."""
    if redis is None:
        return
    try:
        redis.delete(keys.result(jid))
    except Exception:
        logger.warning("the result record of task %s, not pushed, could not be deleted; it expires", jid)


def _enqueue_in_outbox(client: Any, alias: str, redis: Any, keys: Keys, payload: dict[str, Any], at: float | None,
                       ttl: float, now: float) -> None:
    """OUTBOX on, inside a transaction on ``alias``: the task is a row of it (outbox/), handed to
    Redis at commit or by a relay; its READY record is written at commit, before the hand-over
    (registered first), and only if Redis takes it then: a record can't outlive a rollback."""
    from django.db import transaction

    from ..errors import is_unavailable

    pushed: list[Any] = []

    def ready() -> None:
        if not pushed or pushed[0] is None:  # (stopped by a middleware: no job, no record)
            return
        try:
            results.write_ready(redis, keys, payload, ttl, now)
        except Exception as exc:  # noqa: BLE001 - committed: the job still runs (relayed), without it
            if not is_unavailable(exc):
                raise
            logger.warning("task %s: READY record not written at commit (%s: %s); the task waits in the outbox",
                           payload["jid"], type(exc).__name__, exc)

    transaction.on_commit(ready, using=alias)
    pushed.append(client.push(payload, at=at, on_commit=True))

