"""The object model over Redis that the admin, the CLI and ``manage.py shell`` use.

    from django_cogworker import api
    q = api.Queue("mail")
    q.size(), q.latency(), q.paused, q.jobs(page=1, per_page=25)
    q.pause(); q.unpause(); q.clear()
    [q.name for q in api.Queue.all()]

    dead = api.DeadSet()
    page = dead.page(1, 25, job="shop.jobs.SendReceipt", substring="timeout")
    entry = dead.find(page.items[0].token)       # or dead.entry(jid), dead.entry((score, raw))
    entry.retry_now(); entry.delete()            # RetrySet entries also: entry.kill()
    api.RetrySet().retry_all(); api.ScheduledSet().delete_all()

    for process in api.ProcessSet(): process.quiet()   # or stop(), dump()
    api.Workers(), api.PeriodicEntry.all(), api.QuarantinedKey.all(), api.Stats()

Objects take an optional ``redis`` client (bytes responses, as the runtime's)
and ``keys``; by default the project's (``runtime``).

Every read is bounded, so a page stays fast on a set of millions: lists and
sorted sets are paged by rank (LRANGE, ZRANGE), and a filter or a lookup by jid
is a ZSCAN MATCH that examines at most SCAN_LIMIT entries and keeps at most
MATCH_LIMIT matches (``Page.complete`` says whether it saw the whole set).
ZSCAN walks the set in storage order, not by time, so on a larger set a filter
shows the matches among the entries it examined, sorted by time. The
quarantine listing is bounded the same way (KEYSPACE_SCAN_LIMIT keys).

Every write that moves a job is one script from ``scripts`` that writes the
destination before it removes the source, so an error in between leaves the
job in both places, never in neither.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import math
import re
import time
import zoneinfo
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import redis as redis_lib
from croniter import croniter

from . import payload as payloads
from . import scripts, unique
from .engine.stats import day_of
from .errors import CogworkerError, PayloadError
from .keys import Keys

SCAN_LIMIT = 50_000  # entries a filter or a jid lookup examines at most (keeps a page under 200 ms)
MATCH_LIMIT = 1_000  # matches a filter keeps at most
SCAN_COUNT = 1_000  # the COUNT hint of each ZSCAN / SCAN call
MAX_PER_PAGE = 500
BATCH = 500  # entries per script call of retry_all
KEYSPACE_SCAN_LIMIT = 200_000  # keys examined at most looking for quarantined keys
QUARANTINE_LIMIT = 200  # quarantined keys listed at most
SAMPLE_ITEMS = 5
SAMPLE_CHARS = 200
KILLED_REASON = "killed from the admin"
SIGNAL_TTL = 60  # as the process hash: a signal for a process gone is dropped with it


class ActionRefused(CogworkerError):
    """An action that can't be done on this object (an entry that names no queue, a key that exists)."""


def _defaults(redis: Any, keys: Keys | None) -> tuple[Any, Keys]:
    if redis is None or keys is None:
        from . import runtime

        redis = redis if redis is not None else runtime.get_redis()
        keys = keys if keys is not None else Keys(runtime.get_config().key_prefix)
    return redis, keys


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str, bytes)):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _glob_escape(text: str) -> str:
    """Escape Redis MATCH's special characters: the user's text is matched literally."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def _clamp_page(page: int, per_page: int) -> tuple[int, int]:
    return max(int(page), 1), min(max(int(per_page), 1), MAX_PER_PAGE)


@dataclasses.dataclass
class Page:
    """One page of a list, ``number`` counted from 1.

    ``total`` is the size of the whole list, or for a filter the matches found;
    ``complete`` is False when a filter stopped at SCAN_LIMIT or MATCH_LIMIT.
    """

    items: list[Any]
    number: int
    per_page: int
    total: int
    filtered: bool = False
    scanned: int = 0
    complete: bool = True

    @property
    def pages(self) -> int:
        return max(math.ceil(self.total / self.per_page), 1)

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def has_next(self) -> bool:
        return self.number < self.pages


class JobRecord:
    """One stored payload, read leniently: an unreadable one is still shown, as ``(unparseable)``."""

    def __init__(self, raw: bytes | str, *, position: int | None = None):
        self.raw = raw if isinstance(raw, bytes) else raw.encode()
        self.position = position
        self.parse_error: str | None = None
        try:
            self.payload: dict[str, Any] = payloads.decode(self.raw)
        except PayloadError as exc:
            self.parse_error = str(exc)
            try:
                loaded = json.loads(self.raw)
            except (ValueError, RecursionError):
                loaded = None
            self.payload = loaded if isinstance(loaded, dict) else {}

    def get(self, name: str, default: Any = None) -> Any:
        return self.payload.get(name, default)

    @property
    def text(self) -> str:
        return self.raw.decode("utf-8", "replace")

    @property
    def jid(self) -> str | None:
        jid = self.payload.get("jid")
        return jid if isinstance(jid, str) else None

    @property
    def ident(self) -> str:
        """The jid, or for a payload without one a digest of its bytes."""
        return self.jid or "sha1:" + hashlib.sha1(self.raw).hexdigest()[:16]

    @property
    def display_class(self) -> str:
        klass = self.payload.get("class")
        return klass if isinstance(klass, str) else payloads.UNPARSEABLE_CLASS

    @property
    def queue(self) -> str | None:
        queue = self.payload.get("queue")
        return queue if isinstance(queue, str) and queue else None

    @property
    def args(self) -> Any:
        return self.payload.get("args", [])

    @property
    def kwargs(self) -> Any:
        return self.payload.get("kwargs", {})

    @property
    def error_class(self) -> str | None:
        return self.payload.get("error_class")

    @property
    def error_message(self) -> str | None:
        return self.payload.get("error_message")

    @property
    def backtrace(self) -> list[str]:
        lines = self.payload.get("error_backtrace")
        return [str(line) for line in lines] if isinstance(lines, list) else []

    @property
    def retry_count(self) -> int | None:
        count = self.payload.get("retry_count")
        return count if isinstance(count, int) and not isinstance(count, bool) else None

    def time(self, name: str) -> float | None:
        """A timestamp field (``created_at``, ``enqueued_at``, ``failed_at``, ``retried_at``) as epoch seconds."""
        return _number(self.payload.get(name))


# -- queues -------------------------------------------------------------------


class Queue:
    """One queue: its waiting jobs, and whether processes fetch from it."""

    def __init__(self, name: str, *, redis: Any = None, keys: Keys | None = None):
        if not isinstance(name, str) or not name:
            raise ValueError(f"a queue name must be a non-empty string, got {name!r}")
        self.name = name
        self.redis, self.keys = _defaults(redis, keys)
        self.key = self.keys.queue(name)

    @classmethod
    def all(cls, *, redis: Any = None, keys: Keys | None = None) -> list[Queue]:
        redis, keys = _defaults(redis, keys)
        names = {m.decode() for m in redis.smembers(keys.queues)} | {m.decode() for m in
                                                                      redis.smembers(keys.paused_queues)}
        return [cls(name, redis=redis, keys=keys) for name in sorted(names)]

    def size(self) -> int:
        return int(self.redis.llen(self.key))

    def latency(self, now: float | None = None) -> float:
        """Seconds the oldest waiting job has waited (0 when empty)."""
        oldest = self.redis.lindex(self.key, -1)
        if oldest is None:
            return 0.0
        try:
            enqueued = float(json.loads(oldest).get("enqueued_at"))
        except (ValueError, TypeError, AttributeError):
            return 0.0
        return max((time.time() if now is None else now) - enqueued, 0.0)

    @property
    def paused(self) -> bool:
        return bool(self.redis.sismember(self.keys.paused_queues, self.name))

    def pause(self) -> None:
        """No process fetches from this queue once its next heartbeat has read the paused set."""
        self.redis.sadd(self.keys.paused_queues, self.name)

    def unpause(self) -> None:
        self.redis.srem(self.keys.paused_queues, self.name)

    def clear(self) -> int:
        """Delete every waiting job; return how many there were."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.llen(self.key)
        pipe.delete(self.key)
        return int(pipe.execute()[0])

    def jobs(self, page: int = 1, per_page: int = 25) -> Page:
        """Waiting jobs by rank, the newest first (the fetch takes from the other end)."""
        page, per_page = _clamp_page(page, per_page)
        start = (page - 1) * per_page
        pipe = self.redis.pipeline(transaction=False)
        pipe.llen(self.key)
        pipe.lrange(self.key, start, start + per_page - 1)
        total, raws = pipe.execute()
        items = [JobRecord(raw, position=start + i) for i, raw in enumerate(raws)]
        return Page(items, page, per_page, int(total))


# -- scheduled, retry and dead ------------------------------------------------


class SortedEntry(JobRecord):
    """A payload in a sorted set, with its score (when it is due, or when it died)."""

    def __init__(self, parent: SortedSet, raw: bytes | str, score: float, **kwargs: Any):
        super().__init__(raw, **kwargs)
        self.parent = parent
        self.score = float(score)

    @property
    def token(self) -> str:
        """A stable reference to this entry for forms and URLs; see :meth:`SortedSet.find`."""
        return f"{self.score!r}|{self.ident}"

    def delete(self) -> bool:
        """Remove it; False if it was no longer there. A unique job's lock goes with it."""
        removed = bool(self.parent.redis.zrem(self.parent.key, self.raw))
        if removed and self.payload.get("unique_digest") and self.jid:
            unique.release(self.parent.redis, self.parent.keys, self.payload)
        return removed

    def enqueue_now(self, now: float | None = None) -> bool:
        """Move it to the end of its queue now; False if it was no longer there (the poller took it)."""
        queue = self.queue
        if self.parse_error or queue is None:
            raise ActionRefused(f"{self.display_class} {self.ident} names no queue it could run from")
        payload = dict(self.payload, enqueued_at=time.time() if now is None else now)
        payload.pop("at", None)
        p = self.parent
        return bool(scripts.CLAIM_AND_REQUEUE(p.redis, [p.key, p.keys.queues, p.keys.queue(queue)],
                                              [self.raw, queue, payloads.encode(payload)]))

    retry_now = enqueue_now

    def kill(self, now: float | None = None) -> bool:
        """Move it to the dead set (retries only); False if it was no longer there."""
        p = self.parent
        if not p.can_kill:
            raise ActionRefused(f"entries of {p.name} can't be killed")
        now = time.time() if now is None else now
        if self.parse_error:
            dead = payloads.dead_letter(self.raw, f"{KILLED_REASON} ({self.parse_error})", now)
        else:
            dead = dict(self.payload, dead_reason=KILLED_REASON)
            dead.setdefault("failed_at", now)
        below, cap = p.dead_limits(now)
        return bool(scripts.MOVE_BETWEEN_ZSETS(p.redis, [p.key, p.keys.dead],
                                               [self.raw, now, payloads.encode(dead), below, cap]))


class SortedSet:
    """Base of the scheduled, retry and dead sets: paging, filters, lookups and bulk actions."""

    name: ClassVar[str]  # the Keys attribute
    newest_first: ClassVar[bool] = False
    can_kill: ClassVar[bool] = False

    def __init__(self, *, redis: Any = None, keys: Keys | None = None, config: Any = None):
        self.redis, self.keys = _defaults(redis, keys)
        self._config = config
        self.key = getattr(self.keys, self.name)

    def size(self) -> int:
        return int(self.redis.zcard(self.key))

    def _entry(self, raw: bytes, score: float, **kwargs: Any) -> SortedEntry:
        return SortedEntry(self, raw, score, **kwargs)

    def page(self, page: int = 1, per_page: int = 25, job: str | None = None,
             substring: str | None = None) -> Page:
        """One page by rank; with ``job`` (a class name) or ``substring`` (in the stored JSON), a bounded filter."""
        page, per_page = _clamp_page(page, per_page)
        if job or substring:
            return self._filtered_page(page, per_page, job or None, substring or None)
        start = (page - 1) * per_page
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcard(self.key)
        if self.newest_first:
            pipe.zrevrange(self.key, start, start + per_page - 1, withscores=True)
        else:
            pipe.zrange(self.key, start, start + per_page - 1, withscores=True)
        total, rows = pipe.execute()
        items = [self._entry(raw, score, position=start + i) for i, (raw, score) in enumerate(rows)]
        return Page(items, page, per_page, int(total))

    def _filtered_page(self, page: int, per_page: int, job: str | None, substring: str | None) -> Page:
        def wanted(entry: SortedEntry) -> bool:
            return ((job is None or entry.payload.get("class") == job)
                    and (substring is None or substring.encode() in entry.raw))

        pattern = (f"*{_glob_escape(substring)}*" if substring
                   else f'*"class":{_glob_escape(payloads.encode(job))}*')
        found, scanned, complete = self._scan(pattern, wanted, MATCH_LIMIT)
        found.sort(key=lambda e: e.score, reverse=self.newest_first)
        start = (page - 1) * per_page
        return Page(found[start:start + per_page], page, per_page, len(found), filtered=True, scanned=scanned,
                    complete=complete)

    def _scan(self, pattern: str, wanted: Callable[[SortedEntry], bool],
              limit: int) -> tuple[list[SortedEntry], int, bool]:
        """ZSCAN MATCH: up to ``limit`` wanted entries among at most SCAN_LIMIT examined."""
        cursor, scanned, found, seen = 0, 0, [], set()
        while True:
            cursor, rows = self.redis.zscan(self.key, cursor, match=pattern, count=SCAN_COUNT)
            scanned += SCAN_COUNT  # COUNT is about how many entries one call examines
            for raw, score in rows:
                if raw in seen:
                    continue  # ZSCAN may return an entry twice while the set is rehashed
                seen.add(raw)
                entry = self._entry(raw, score)
                if wanted(entry):
                    found.append(entry)
            if int(cursor) == 0:
                return found, min(scanned, max(len(seen), self.size())), True
            if scanned >= SCAN_LIMIT or len(found) >= limit:
                return found, scanned, False

    def entry(self, ref: str | tuple[float, bytes | str]) -> SortedEntry | None:
        """The entry with this jid (a bounded scan), or this exact ``(score, raw)``; None if absent."""
        if isinstance(ref, tuple):
            score, raw = ref
            raw = raw if isinstance(raw, bytes) else raw.encode()
            stored = self.redis.zscore(self.key, raw)
            return self._entry(raw, stored) if stored is not None and float(stored) == float(score) else None
        found, _, _ = self._scan(f'*"jid":{_glob_escape(payloads.encode(ref))}*', lambda e: e.jid == ref, 1)
        return found[0] if found else None

    def find(self, token: str) -> SortedEntry | None:
        """The entry a ``SortedEntry.token`` names: exact, and O(log n) (ZRANGEBYSCORE on its score).

        Many entries may share a score (a bulk push scheduled for one time):
        those are read SCAN_COUNT at a time, at most SCAN_LIMIT of them.
        """
        score_text, sep, ident = token.partition("|")
        score = _number(score_text)
        if not sep or score is None:
            return None
        for offset in range(0, SCAN_LIMIT, SCAN_COUNT):
            rows = self.redis.zrangebyscore(self.key, score, score, start=offset, num=SCAN_COUNT, withscores=True)
            for raw, stored in rows:
                entry = self._entry(raw, stored)
                if entry.ident == ident:
                    return entry
            if len(rows) < SCAN_COUNT:
                break
        return None

    def delete_all(self) -> int:
        """Empty the set; return how many entries it had."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.zcard(self.key)
        pipe.unlink(self.key)
        return int(pipe.execute()[0])

    def retry_all(self, now: float | None = None) -> int:
        """Move every entry that names a queue to it, BATCH at a time (push, then remove); return how many.

        Entries that can't move (no queue, unreadable, a queue key of the wrong
        type) stay, in front. One pass: it looks at about as many entries as
        the set had when it began, so entries added meanwhile can't keep it going.
        """
        moved, skipped, budget = 0, 0, self.size() + BATCH
        while budget > 0:
            rows = self.redis.zrange(self.key, skipped, skipped + BATCH - 1)
            if not rows:
                break
            budget -= len(rows)
            queue_keys: dict[str, int] = {}
            args: list[Any] = []
            stamp = time.time() if now is None else now
            for raw in rows:
                entry = self._entry(raw, 0.0)
                if entry.parse_error or entry.queue is None:
                    skipped += 1
                    continue
                payload = dict(entry.payload, enqueued_at=stamp)
                payload.pop("at", None)
                index = queue_keys.setdefault(entry.queue, len(queue_keys) + 3)
                args += [raw, index, entry.queue, payloads.encode(payload)]
            if not args:
                continue
            keys = [self.key, self.keys.queues, *(self.keys.queue(q) for q in queue_keys)]
            batch_moved, failed = scripts.REQUEUE_FROM_ZSET_BATCH(self.redis, keys, args)
            moved += int(batch_moved)
            skipped += int(failed)
        return moved

    def dead_limits(self, now: float) -> tuple[Any, Any]:
        """(drop dead entries scored below this, keep at most this many), as the engine trims."""
        config = self._config
        if config is None:
            try:
                from . import runtime

                config = runtime.get_config()
            except Exception:  # no Django settings (a bare shell): no trim, rather than refusing
                return "", ""
        return now - config.dead_timeout, config.dead_max_jobs


class ScheduledSet(SortedSet):
    """Jobs pushed with perform_in / perform_at, soonest first."""

    name = "schedule"


class RetrySet(SortedSet):
    """Failed jobs waiting for their next attempt, soonest first."""

    name = "retry"
    can_kill = True


class DeadSet(SortedSet):
    """Jobs that won't run again without a human, the latest death first."""

    name = "dead"
    newest_first = True


# -- processes and what they run ----------------------------------------------


class Process:
    """One live worker process, as its last heartbeat described it."""

    def __init__(self, identity: str, fields: dict[bytes, bytes], *, redis: Any, keys: Keys):
        self.identity = identity
        self.redis, self.keys = redis, keys
        try:
            info = json.loads(fields.get(b"info") or b"{}")
        except ValueError:
            info = {}
        self.info: dict[str, Any] = info if isinstance(info, dict) else {}
        self.busy = int(_number(fields.get(b"busy")) or 0)
        self.is_quiet = _text(fields.get(b"quiet", b"")) == "true"
        self.beat = _number(fields.get(b"beat"))

    hostname = property(lambda self: self.info.get("hostname"))
    pid = property(lambda self: self.info.get("pid"))
    tag = property(lambda self: self.info.get("tag") or "")
    queues = property(lambda self: list(self.info.get("queues") or []))
    concurrency = property(lambda self: self.info.get("concurrency"))
    rss_kb = property(lambda self: self.info.get("rss_kb"))
    started_at = property(lambda self: _number(self.info.get("started_at")))
    version = property(lambda self: self.info.get("version"))

    def signal(self, name: str) -> None:
        """Send a remote signal; the process reads it at its next heartbeat."""
        from .engine.heartbeat import SIGNALS

        if name not in SIGNALS:
            raise ValueError(f"unknown signal {name!r}; one of {SIGNALS}")
        pipe = self.redis.pipeline(transaction=True)
        pipe.lpush(self.keys.signals(self.identity), name)
        pipe.expire(self.keys.signals(self.identity), SIGNAL_TTL)
        pipe.execute()

    def quiet(self) -> None:
        """Stop fetching new jobs; the process stays up and finishes what it runs."""
        self.signal("quiet")

    def stop(self) -> None:
        """Shut down as on TERM: finish or hand back running jobs within the shutdown timeout."""
        self.signal("stop")

    def dump(self) -> None:
        """Log every thread's stack (in the process's log)."""
        self.signal("dump")


class ProcessSet:
    """The live processes (those whose process hash hasn't expired), sorted by identity."""

    def __init__(self, *, redis: Any = None, keys: Keys | None = None):
        self.redis, self.keys = _defaults(redis, keys)

    def identities(self) -> list[str]:
        return sorted(_text(m) for m in self.redis.smembers(self.keys.processes))

    def __iter__(self) -> Iterator[Process]:
        identities = self.identities()
        pipe = self.redis.pipeline(transaction=False)
        for identity in identities:
            pipe.hgetall(self.keys.process(identity))
        for identity, fields in zip(identities, pipe.execute(), strict=True):
            if fields.get(b"info"):
                yield Process(identity, fields, redis=self.redis, keys=self.keys)

    def get(self, identity: str) -> Process | None:
        fields = self.redis.hgetall(self.keys.process(identity))
        return Process(identity, fields, redis=self.redis, keys=self.keys) if fields.get(b"info") else None

    def size(self) -> int:
        return sum(1 for _ in self)


@dataclasses.dataclass
class Work:
    """One job running now: which process and thread, since when."""

    identity: str
    thread: str
    queue: str | None
    run_at: float | None
    job: JobRecord


class Workers:
    """What every live process runs now, from its ``workers:<identity>`` hash."""

    def __init__(self, *, redis: Any = None, keys: Keys | None = None):
        self.redis, self.keys = _defaults(redis, keys)

    def __iter__(self) -> Iterator[Work]:
        identities = ProcessSet(redis=self.redis, keys=self.keys).identities()
        pipe = self.redis.pipeline(transaction=False)
        for identity in identities:
            pipe.hgetall(self.keys.workers(identity))
        for identity, threads in zip(identities, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(threads, Exception):
                continue  # a wrong-typed workers hash: the key guard moves it; list the others
            for thread, value in sorted(threads.items()):
                try:
                    work = json.loads(value)
                except ValueError:
                    work = {}
                work = work if isinstance(work, dict) else {}
                yield Work(identity, _text(thread), work.get("queue"), _number(work.get("run_at")),
                           JobRecord(str(work.get("payload", ""))))

    def size(self) -> int:
        return sum(1 for _ in self)


# -- periodic entries ---------------------------------------------------------


class PeriodicEntry:
    """A periodic entry as its processes published it in ``periodic:schedule``, with its state."""

    def __init__(self, pjid: str, spec: dict[str, Any], *, enabled: bool, last_slot: float | None,
                 redis: Any, keys: Keys):
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

    @classmethod
    def all(cls, *, redis: Any = None, keys: Keys | None = None) -> list[PeriodicEntry]:
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
    def get(cls, pjid: str, *, redis: Any = None, keys: Keys | None = None) -> PeriodicEntry | None:
        return next((e for e in cls.all(redis=redis, keys=keys) if e.pjid == pjid), None)

    def next_run(self, now: float | None = None) -> float | None:
        """Epoch seconds of the next slot after ``now``; None if the cron or zone can't be read."""
        try:
            start = dt.datetime.fromtimestamp(time.time() if now is None else now, zoneinfo.ZoneInfo(self.tz))
            return float(croniter(self.cron, start).get_next(float))
        except (ValueError, KeyError, zoneinfo.ZoneInfoNotFoundError, TypeError):
            return None

    def enable(self) -> None:
        self.redis.srem(self.keys.periodic_disabled, self.pjid)
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
        from .job import JobSetter, registered

        job_class = registered(self.job)
        if job_class is None:
            raise ActionRefused(f"periodic entry {self.pjid!r} names {self.job!r}, which is not a registered job here")
        options = {"queue": self.queue} if isinstance(self.queue, str) and self.queue else {}
        payload = JobSetter(job_class, options).build(self.args, self.kwargs)
        if client is None:
            from . import runtime

            client = runtime.get_client()
        return client.push(payload, on_commit=False)


# -- quarantined keys ---------------------------------------------------------


class Bounded(list):
    """A list from a bounded scan; ``complete`` is False when the scan stopped at its limit."""

    complete: bool = True


class QuarantinedKey:
    """A key the key guard moved aside because it held the wrong type (kept 30 days)."""

    def __init__(self, key: str, *, redis: Any, keys: Keys):
        self.key = key
        self.redis, self.keys = redis, keys
        # quarantine:<original key>:<unix time>:<random>; the original may hold colons itself.
        parts = key[len(keys.quarantine_prefix):].rsplit(":", 2)
        self.original = parts[0]
        self.quarantined_at = _number(parts[1]) if len(parts) == 3 else None
        self.type = "none"
        self.size: int | None = None
        self.ttl: int | None = None
        self.sample: list[str] = []

    @classmethod
    def all(cls, *, redis: Any = None, keys: Keys | None = None) -> Bounded:
        """Up to QUARANTINE_LIMIT keys, found among at most KEYSPACE_SCAN_LIMIT (SCAN MATCH on the prefix)."""
        redis, keys = _defaults(redis, keys)
        found, cursor, scanned = Bounded(), 0, 0
        pattern = _glob_escape(keys.quarantine_prefix) + "*"
        while True:
            cursor, names = redis.scan(cursor, match=pattern, count=SCAN_COUNT)
            scanned += SCAN_COUNT
            found.extend(cls(_text(n), redis=redis, keys=keys) for n in names if cls.is_name(_text(n), keys))
            if int(cursor) == 0:
                break
            if scanned >= KEYSPACE_SCAN_LIMIT or len(found) >= QUARANTINE_LIMIT:
                found.complete = False
                break
        unique_keys = {q.key: q for q in found}
        found[:] = sorted(unique_keys.values(), key=lambda q: (-(q.quarantined_at or 0), q.key))
        for q in found:
            q.load()
        return found

    @staticmethod
    def is_name(key: str, keys: Keys) -> bool:
        return key.startswith(keys.quarantine_prefix) and key[len(keys.quarantine_prefix):].count(":") >= 2

    @classmethod
    def get(cls, key: str, *, redis: Any = None, keys: Keys | None = None) -> QuarantinedKey | None:
        redis, keys = _defaults(redis, keys)
        if not cls.is_name(key, keys):
            return None
        q = cls(key, redis=redis, keys=keys)
        q.load()
        return q if q.type != "none" else None

    def load(self) -> None:
        """Read type, size, TTL and the first few elements."""
        r, k, n = self.redis, self.key, SAMPLE_ITEMS
        self.type = _text(r.type(k))
        self.ttl = int(r.ttl(k))
        reads: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
            "string": (lambda: r.strlen(k), lambda: [r.getrange(k, 0, SAMPLE_CHARS - 1)]),
            "list": (lambda: r.llen(k), lambda: r.lrange(k, 0, n - 1)),
            "set": (lambda: r.scard(k), lambda: r.sscan(k, 0, count=n)[1][:n]),
            "zset": (lambda: r.zcard(k), lambda: [f"{_text(m)} ({s!r})" for m, s in
                                                   r.zrange(k, 0, n - 1, withscores=True)]),
            "hash": (lambda: r.hlen(k), lambda: [f"{_text(f)}: {_text(v)}" for f, v in
                                                 list(r.hscan(k, 0, count=n)[1].items())[:n]]),
            "stream": (lambda: r.xlen(k), lambda: [f"{_text(i)} {fields}" for i, fields in r.xrange(k, count=n)]),
        }
        if self.type in reads:
            size, sample = reads[self.type]
            self.size = int(size())
            self.sample = [_text(item)[:SAMPLE_CHARS] for item in sample()]

    def delete(self) -> bool:
        return bool(self.redis.delete(self.key))

    def restore(self) -> bool:
        """Rename it back, without its expiry, only if the original key is absent; False otherwise.

        The key guard moves it again at its next check if it still holds the
        wrong type: fix it (or read it) first.
        """
        result = int(scripts.RESTORE_QUARANTINED(self.redis, [self.key, self.original], []))
        if result < 0:
            raise ActionRefused(f"{self.key} is gone (deleted, or expired)")
        return result == 1


# -- stats --------------------------------------------------------------------


@dataclasses.dataclass
class Day:
    day: str
    processed: int
    failed: int


class Stats:
    """A snapshot of the counters, the sets' sizes, the queues and Redis itself, read at construction."""

    def __init__(self, *, redis: Any = None, keys: Keys | None = None, now: float | None = None,
                 days: int = 30):
        self.redis, self.keys = _defaults(redis, keys)
        now = time.time() if now is None else now
        k = self.keys
        self.days = [day_of(now - 86400 * back) for back in range(days - 1, -1, -1)]
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(k.stat_processed)
        pipe.get(k.stat_failed)
        pipe.mget([k.stat("processed", d) for d in self.days])
        pipe.mget([k.stat("failed", d) for d in self.days])
        pipe.zcard(k.schedule)
        pipe.zcard(k.retry)
        pipe.zcard(k.dead)
        processed, failed, per_day_processed, per_day_failed, scheduled, retries, dead = pipe.execute()
        self.processed = int(_number(processed) or 0)
        self.failed = int(_number(failed) or 0)
        self.history = [Day(d, int(_number(p) or 0), int(_number(f) or 0))
                        for d, p, f in zip(self.days, per_day_processed, per_day_failed, strict=True)]
        self.processed_today = self.history[-1].processed if self.history else 0
        self.failed_today = self.history[-1].failed if self.history else 0
        self.scheduled_size, self.retry_size, self.dead_size = int(scheduled), int(retries), int(dead)
        self.queues = Queue.all(redis=self.redis, keys=k)
        self.queue_sizes = {q.name: q.size() for q in self.queues}
        self.queue_latencies = {q.name: q.latency(now) for q in self.queues}
        self.enqueued = sum(self.queue_sizes.values())
        processes = list(ProcessSet(redis=self.redis, keys=k))
        self.process_count = len(processes)
        self.busy = sum(p.busy for p in processes)
        self.concurrency = sum(int(p.concurrency or 0) for p in processes)
        self.redis_info = self._redis_info()

    def _redis_info(self) -> dict[str, Any]:
        """Version, memory and clients; empty where INFO isn't allowed (some managed services)."""
        try:
            info = self.redis.info()
        except redis_lib.exceptions.ResponseError:
            return {}
        return {"version": info.get("redis_version"), "used_memory_human": info.get("used_memory_human"),
                "used_memory_peak_human": info.get("used_memory_peak_human"),
                "connected_clients": info.get("connected_clients"),
                "uptime_in_days": info.get("uptime_in_days")}
