"""Periodic entries: ``PeriodicEntry``, an entry as its processes published it, its next run,
enable / disable, and a run pushed now."""

from __future__ import annotations

import datetime as dt
import json
import time
import zoneinfo
from typing import Any

from croniter import croniter

from ..broker import scripts
from ..broker.keys import Keys
from ..broker.types import RedisClient
from ._base import ActionRefused, _defaults, _number, _text

# An entry not published again for this long (each process publishes its own every minute) is
# declared by no live process.
STALE_AFTER = 600.0


class PeriodicEntry:
    """A periodic entry as its processes published it in ``periodic:schedule``, with its state."""

    def __init__(self, pjid: str, spec: dict[str, Any], *, enabled: bool, last_slot: float | None,
                 redis: RedisClient, keys: Keys):
        self.pjid = pjid
        self.spec = spec
        self.enabled = enabled
        self.last_slot = last_slot
        self.redis, self.keys = redis, keys

    cron = property(lambda self: str(self.spec.get("cron", "")))
    tz = property(lambda self: str(self.spec.get("tz") or "UTC"))
    job = property(lambda self: str(self.spec.get("job", "")))
    queue = property(lambda self: self.spec.get("queue"))
    args = property(lambda self: list(self.spec.get("args") or []))
    kwargs = property(lambda self: dict(self.spec.get("kwargs") or {}))
    until_executed = property(lambda self: bool(self.spec.get("until_executed")))
    published_at = property(lambda self: _number(self.spec.get("published_at")))

    def __repr__(self) -> str:
        state = "enabled" if self.enabled else "disabled"
        return f"<PeriodicEntry {self.pjid} {self.cron!r} {self.tz} {self.job} {state}>"

    def stale(self, now: float | None = None) -> bool:
        """Whether no process has published it for STALE_AFTER: no live process declares it (it was
        removed from the settings, or the whole fleet is down). Unknown (False) for an entry
        published without a time."""
        published = self.published_at
        return published is not None and (time.time() if now is None else now) - published > STALE_AFTER

    def forget(self) -> None:
        """Take it off the published list (a live process that declares it publishes it again
        within a minute). Its ``last_slot`` and ``enabled_at`` stay, so an entry that comes back
        doesn't catch up slots it ran already, or that fell due while it was disabled."""
        self.redis.hdel(self.keys.periodic_schedule, self.pjid)

    @classmethod
    def all(cls, *, redis: RedisClient | None = None, keys: Keys | None = None) -> list[PeriodicEntry]:
        redis, keys = _defaults(redis, keys)
        published = sorted((_text(k), v) for k, v in redis.hgetall(keys.periodic_schedule).items())
        disabled = {_text(m) for m in redis.smembers(keys.periodic_disabled)}
        pipe = redis.pipeline(transaction=False)
        for pjid, _ in published:
            pipe.get(keys.periodic_last_slot(pjid))
        entries = []
        for (pjid, raw), last in zip(published, pipe.execute(), strict=True):
            try:
                spec = json.loads(raw)
            except ValueError:
                spec = {}
            entries.append(cls(pjid, spec if isinstance(spec, dict) else {}, enabled=pjid not in disabled,
                               last_slot=_number(last), redis=redis, keys=keys))
        return entries

    @classmethod
    def get(cls, pjid: str, *, redis: RedisClient | None = None, keys: Keys | None = None) -> PeriodicEntry | None:
        return next((e for e in cls.all(redis=redis, keys=keys) if e.pjid == pjid), None)

    def next_run(self, now: float | None = None) -> float | None:
        """Epoch seconds of the next slot after ``now``; None if the cron or zone can't be read."""
        try:
            start = dt.datetime.fromtimestamp(time.time() if now is None else now, zoneinfo.ZoneInfo(self.tz))
            return float(croniter(self.cron, start).get_next(float))
        except (ValueError, KeyError, zoneinfo.ZoneInfoNotFoundError, TypeError):
            return None

    def enable(self, now: float | None = None) -> None:
        """The tickers run it again from its next slot: none that fell due while it was disabled,
        also on a process started meanwhile (the time is recorded in ``periodic:enabled_at``)."""
        scripts.PERIODIC_ENABLE(self.redis, [self.keys.periodic_disabled, self.keys.periodic_enabled_at],
                                [self.pjid, time.time() if now is None else now])
        self.enabled = True

    def disable(self) -> None:
        """The tickers skip it (without advancing ``last_slot``) until it is enabled again."""
        self.redis.sadd(self.keys.periodic_disabled, self.pjid)
        self.enabled = False

    def enqueue_now(self, client: Any = None) -> str | None:
        """Push one run now, outside the schedule (no slot is claimed); return its jid.

        Through the project's client, so client middleware applies; the job must
        be registered in this process.
        """
        from ..push.job import JobSetter, registered

        job_class = registered(self.job)
        if job_class is None:
            raise ActionRefused(f"periodic entry {self.pjid!r} names {self.job!r}, which is not a registered job here")
        options = {"queue": self.queue} if isinstance(self.queue, str) and self.queue else {}
        payload = JobSetter(job_class, options).build(self.args, self.kwargs)
        if client is None:
            from ..push import runtime

            client = runtime.get_client()
        return client.push(payload, on_commit=False)
