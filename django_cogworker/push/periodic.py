"""Periodic entries: what runs on a cron schedule, declared in settings or on job classes.

Settings::

    COGWORKER["PERIODIC"] = [
        {"name": "nightly-report", "cron": "0 3 * * *", "job": "reports.jobs.NightlyReport",
         "args": [], "kwargs": {}, "queue": "reports", "tz": "Europe/Paris",
         "until_executed": True, "catch_up": True},
    ]

On a job class (discovered with the jobs)::

    @periodic("*/5 * * * *", name="sync-feeds", until_executed=True)
    class SyncFeeds(Job): ...

Entries are validated at startup: an invalid cron, an unknown job or a
duplicate name fails naming the entry.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import zoneinfo
from collections.abc import Mapping, Sequence
from typing import Any, cast

from croniter import croniter

from ..errors import ConfigError
from .arguments import check_json_native
from .job import Job, registered

ENTRY_KEYS = frozenset({"name", "cron", "job", "args", "kwargs", "queue", "tz", "until_executed", "catch_up",
                        "retry"})

_declared: list[dict[str, Any]] = []


@dataclasses.dataclass(frozen=True)
class Entry:
    """One validated periodic entry: its cron in its zone, the job it pushes and how.

    Built by :func:`build_entries` at startup (from the settings and ``@periodic``); read by the
    ticker, which asks it for slots (``latest_slot``, ``slots_after``). Immutable: no thread of
    its own, nothing to start or stop.
    """

    name: str
    cron: str
    job: str  # registered job name
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    queue: str | None = None
    tz: str = "UTC"
    until_executed: bool = False
    catch_up: bool | None = None  # None: COGWORKER["PERIODIC_CATCH_UP"]
    retry: Any = None

    @property
    def pjid(self) -> str:
        return self.name

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.tz)

    def latest_slot(self, now: float) -> int:
        """The epoch second of the latest slot at or before ``now``."""
        start = dt.datetime.fromtimestamp(now, self.zone)
        return int(croniter(self.cron, start + dt.timedelta(microseconds=1)).get_prev(float))

    def slots_after(self, after: int, until: float, limit: int) -> list[int]:
        """Slots in (after, until], oldest first, at most ``limit`` (the newest ones)."""
        itr = croniter(self.cron, dt.datetime.fromtimestamp(after, self.zone))
        slots: list[int] = []
        while True:
            slot = int(itr.get_next(float))
            if slot > until:
                return slots[-limit:]
            slots.append(slot)
            if len(slots) > 10 * limit:
                slots = slots[-limit:]

    def slot_text(self, slot: int) -> str:
        """The slot as a time in the entry's zone, for log lines: "2026-12-04 03:00:00+01:00 (Europe/Paris)"."""
        try:
            return f"{dt.datetime.fromtimestamp(slot, self.zone).isoformat(' ')} ({self.tz})"
        except (OverflowError, OSError, ValueError):  # (a slot no datetime holds: shown as it is)
            return str(slot)

    def wall_clock(self, slot: int) -> dt.datetime:
        """The slot's local time without zone (two slots with one wall-clock time are one slot)."""
        return dt.datetime.fromtimestamp(slot, self.zone).replace(tzinfo=None, fold=0)


def periodic(cron: str, *, name: str | None = None, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
             queue: str | None = None, tz: str | None = None, until_executed: bool = False,
             catch_up: bool | None = None):
    """Class decorator: declare a periodic entry for this job class."""

    def decorate(cls: type[Job]) -> type[Job]:
        entry = {"name": name or cls.name, "cron": cron, "job": cls.name, "args": list(args),
                 "kwargs": dict(kwargs or {}), "queue": queue, "until_executed": until_executed,
                 "catch_up": catch_up}
        if tz is not None:
            entry["tz"] = tz
        _declared.append(entry)
        return cls

    return decorate


def build_entries(from_settings: Sequence[Mapping[str, Any]], default_tz: str) -> list[Entry]:
    """Validate settings + decorated entries; raise ConfigError naming each bad entry."""
    errors: list[str] = []
    entries: list[Entry] = []
    seen: set[str] = set()
    for i, raw in enumerate([*from_settings, *_declared]):
        where = f'COGWORKER["PERIODIC"][{i}]' if i < len(from_settings) else "@periodic entry"
        entry = _build(raw, default_tz, where, errors)
        if entry is None:
            continue
        if entry.name in seen:
            errors.append(f"{where}: duplicate periodic entry name {entry.name!r}")
            continue
        seen.add(entry.name)
        entries.append(entry)
    if errors:
        raise ConfigError(errors)
    return entries


def _build(raw: Mapping[str, Any], default_tz: str, where: str, errors: list[str]) -> Entry | None:
    if not isinstance(raw, Mapping):
        errors.append(f"{where} must be a dict, got {raw!r}")
        return None
    name = raw.get("name")
    label = f"{where} ({name!r})" if name else where
    bad = len(errors)
    unknown = set(raw) - ENTRY_KEYS
    if unknown:
        errors.append(f"{label}: unknown key(s) {sorted(unknown)}; allowed: {sorted(ENTRY_KEYS)}")
    if not isinstance(name, str) or not name or ":" in name:
        errors.append(f"{label}: 'name' must be a non-empty string without ':', got {name!r}")
    cron = raw.get("cron")
    if not isinstance(cron, str) or not croniter.is_valid(cron):
        errors.append(f"{label}: 'cron' is not a valid cron expression: {cron!r}")
    job = raw.get("job")
    job_name = job.name if isinstance(job, type) and issubclass(job, Job) else job
    if not isinstance(job_name, str) or registered(job_name) is None:
        errors.append(f"{label}: 'job' {job!r} is not a registered job (a Job subclass in an app's jobs.py)")
    tz = raw.get("tz") or default_tz
    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
        errors.append(f"{label}: 'tz' is not a known time zone: {tz!r}")
    args, kwargs = raw.get("args", ()), raw.get("kwargs") or {}
    if not isinstance(args, (list, tuple)) or not isinstance(kwargs, Mapping):
        errors.append(f"{label}: 'args' must be a list and 'kwargs' a dict")
    else:
        # Checked here, not at the first slot: an argument that can't be sent
        # would otherwise fail every tick of the entry, found only in the log.
        try:
            check_json_native(list(args), "'args'")
            check_json_native(dict(kwargs), "'kwargs'")
        except TypeError as exc:
            errors.append(f"{label}: {exc}")
    queue = raw.get("queue")
    if queue is not None and (not isinstance(queue, str) or not queue):
        errors.append(f"{label}: 'queue' must be a non-empty string, got {queue!r}")
    for flag in ("until_executed", "catch_up"):
        if raw.get(flag) is not None and not isinstance(raw.get(flag), bool):
            errors.append(f"{label}: {flag!r} must be True or False, got {raw.get(flag)!r}")
    if len(errors) > bad:
        return None
    # (validated above: the three are strings)
    return Entry(name=cast(str, name), cron=cast(str, cron), job=cast(str, job_name), args=tuple(args),
                 kwargs=dict(kwargs),
                 queue=raw.get("queue"), tz=tz, until_executed=bool(raw.get("until_executed")),
                 catch_up=raw.get("catch_up"), retry=raw.get("retry"))
