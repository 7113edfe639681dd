"""Job results: what a job that opts in (every task; a Job class with ``result_ttl``) leaves in Redis.

A result is the hash ``result:<jid>`` (:meth:`Keys.result`), kept ``result_ttl`` seconds after
its last change:

=====================  ==================================================================
field                  meaning
=====================  ==================================================================
name                   the job's registered name (a task's module path)
args, kwargs, queue    as pushed (JSON)
encrypted              "1" for a job whose arguments are sealed (encrypt): args and kwargs are then
                       empty (the sealed blob is not copied here; docs/encryption.md)
status                 READY (queued, or waiting for a retry), RUNNING, SUCCESSFUL, FAILED
enqueued_at            epoch seconds of the push (of the first start, for a class job)
started_at             the first attempt's start; ``last_attempted_at`` the latest one's
finished_at            when it succeeded or failed for good
return_value           the value returned, as JSON (SUCCESSFUL only)
errors                 JSON list of ``{"exception_class_path", "traceback"}``, one per failure
worker_ids             JSON list of the worker processes (identities) of each attempt
backend, priority,     a task's own (django.tasks)
run_after
=====================  ==================================================================

Nothing here costs a job that doesn't opt in: the processor looks at one class attribute. A
task's READY record is written before its push (see :mod:`django_cogworker.tasks`); a class
job's record is made when it first starts (its push pays nothing).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

from ...broker.keys import Keys, Want
from ...broker.quarantine import guarded
from ...broker.types import RedisClient
from ...push import payload as payloads

READY, RUNNING, SUCCESSFUL, FAILED = "READY", "RUNNING", "SUCCESSFUL", "FAILED"
STATUSES = (READY, RUNNING, SUCCESSFUL, FAILED)
# The task fields a payload carries under "task", copied to the record.
TASK_FIELDS = ("backend", "priority", "run_after")


@dataclasses.dataclass(frozen=True)
class JobResult:
    """A result read back: see the module's table for each field (times as aware UTC datetimes)."""

    jid: str
    name: str
    status: str
    args: list[Any]
    kwargs: dict[str, Any]
    queue: str
    enqueued_at: dt.datetime | None
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    last_attempted_at: dt.datetime | None
    errors: list[dict[str, str]]
    worker_ids: list[str]
    task: dict[str, Any]
    _return_value: Any = None
    encrypted: bool = False  # (args and kwargs sealed in the job: not kept here)

    @property
    def return_value(self) -> Any:
        """The value returned; raises ValueError unless SUCCESSFUL (None is a value a job may return)."""
        if self.status != SUCCESSFUL:
            raise ValueError(f"job {self.jid} has no return value: it is {self.status}")
        return self._return_value

    @property
    def is_finished(self) -> bool:
        return self.status in (SUCCESSFUL, FAILED)

    @classmethod
    def from_record(cls, jid: str, record: Mapping[Any, Any]) -> JobResult:
        """Build from the hash as HGETALL returns it (bytes or str, a flat list or a mapping)."""
        if not isinstance(record, Mapping):
            items = list(record)
            record = dict(zip(items[::2], items[1::2], strict=True))
        fields = {_text(k): _text(v) for k, v in record.items()}
        return cls(
            jid=jid, name=fields.get("name", ""), status=fields.get("status", READY),
            args=_json(fields.get("args"), []), kwargs=_json(fields.get("kwargs"), {}),
            queue=fields.get("queue", ""),
            enqueued_at=_time(fields.get("enqueued_at")), started_at=_time(fields.get("started_at")),
            finished_at=_time(fields.get("finished_at")), last_attempted_at=_time(fields.get("last_attempted_at")),
            errors=_json(fields.get("errors"), []), worker_ids=_json(fields.get("worker_ids"), []),
            task={name: _json(fields[name], None) for name in TASK_FIELDS if fields.get(name, "") != ""},
            _return_value=_json(fields.get("return_value"), None),
            encrypted=fields.get("encrypted") == "1",
        )


def record_fields(payload: dict[str, Any], status: str | None = None) -> list[str]:
    """The record's fields taken from a payload, as a flat field, value list (for HSET and the scripts)."""
    fields = ["name", str(payload.get("class", "")),
              "args", payloads.encode(payload.get("args", [])),
              "kwargs", payloads.encode(payload.get("kwargs") or {}),
              "queue", str(payload.get("queue", "")),
              "enqueued_at", repr(float(payload.get("enqueued_at") or payload.get("created_at") or 0.0)),
              "worker_ids", "[]", "errors", "[]"]
    if "encrypted" in payload:  # (its args and kwargs above are what is clear: none, or a callback's status)
        fields += ["encrypted", "1"]
    task = payload.get("task")
    if isinstance(task, dict):
        for name in TASK_FIELDS:
            if task.get(name) is not None:
                fields += [name, payloads.encode(task[name])]
    if status is not None:
        fields += ["status", status]
    return fields


def write_ready(redis: RedisClient, keys: Keys, payload: dict[str, Any], ttl: float, now: float) -> None:
    """Write a new READY record for ``payload`` (a task about to be pushed), in one round trip."""
    key = keys.result(payload["jid"])
    fields = record_fields({**payload, "enqueued_at": now}, status=READY)
    pipe = redis.pipeline(transaction=True)
    pipe.delete(key)
    pipe.hset(key, mapping=dict(zip(fields[::2], fields[1::2], strict=True)))
    pipe.expire(key, max(1, int(ttl)))
    pipe.execute()


def read(redis: RedisClient, keys: Keys, jid: str) -> JobResult | None:
    """The result of ``jid``, or None when there is none (never recorded, or expired; or its key
    held the wrong type: moved to quarantine)."""
    key = keys.result(jid)
    record = guarded(redis, keys, {key: Want("hash")}, lambda: redis.hgetall(key))
    return JobResult.from_record(jid, record) if record else None


def get_result(jid: str) -> JobResult | None:
    """The result of the job ``jid`` (a task's or a ``result_ttl`` job's), or None; uses the settings' Redis."""
    from ...push import runtime

    return read(runtime.get_redis(), Keys(runtime.get_config().key_prefix), jid)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _json(text: str | None, default: Any) -> Any:
    if text is None or text == "":
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default


def _time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        return dt.datetime.fromtimestamp(float(text), tz=dt.UTC)
    except (ValueError, OverflowError, OSError):
        return None
