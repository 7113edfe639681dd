"""Processes and what they run: ``Process`` (one live worker, and its remote signals), ``ProcessSet``,
and ``Workers``, the ``Work`` every live process runs now."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any, cast

from ..broker.keys import Keys, presence_ttl
from ..broker.types import RedisClient
from ._base import _defaults, _number, _text
from .records import JobRecord

DEFAULT_HEARTBEAT_INTERVAL = 5.0  # (for a process that doesn't publish its own)


class Process:
    """One live worker process, as its last heartbeat described it."""

    def __init__(self, identity: str, fields: dict[bytes, bytes], *, redis: RedisClient, keys: Keys):
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

    def __repr__(self) -> str:
        quiet = " quiet" if self.is_quiet else ""
        return f"<Process {self.identity} busy={self.busy}/{self.concurrency} queues={self.queues}{quiet}>"

    hostname = property(lambda self: self.info.get("hostname"))
    pid = property(lambda self: self.info.get("pid"))
    tag = property(lambda self: self.info.get("tag") or "")
    @property
    def queues(self) -> list[str]:
        queues = self.info.get("queues")
        return [q if isinstance(q, str) else json.dumps(q) for q in queues] if isinstance(queues, list) else []

    @property
    def concurrency(self) -> int | None:
        """Threads, or None when the info holds no finite number ("abc", [1], 1e999)."""
        number = _number(self.info.get("concurrency"))
        return int(number) if number is not None else None

    @property
    def async_concurrency(self) -> int:
        """Places on its event loop for async jobs (0: none, or a process from before it had one)."""
        number = _number(self.info.get("async_concurrency"))
        return int(number) if number is not None else 0

    rss_kb = property(lambda self: self.info.get("rss_kb"))

    @property
    def supervisor(self) -> str:
        """The identity of the supervisor that forked it (``runcogworker --processes N``), or ""."""
        supervisor = self.info.get("supervisor")
        return supervisor if isinstance(supervisor, str) else ""

    @property
    def index(self) -> int | None:
        """Its slot (0 … N-1) under its supervisor, or None."""
        number = _number(self.info.get("index"))
        return int(number) if number is not None else None
    @property
    def generation(self) -> int | None:
        """Its generation under its supervisor: 0 from the start, one more at each rolling restart (HUP)."""
        number = _number(self.info.get("generation"))
        return int(number) if number is not None else None

    started_at = property(lambda self: _number(self.info.get("started_at")))
    version = property(lambda self: self.info.get("version"))

    def signal(self, name: str) -> None:
        """Send a remote signal; the process reads it at its next heartbeat."""
        from ..engine.process.heartbeat import SIGNALS

        if name not in SIGNALS:
            raise ValueError(f"unknown signal {name!r}; one of {SIGNALS}")
        pipe = self.redis.pipeline(transaction=True)
        pipe.lpush(self.keys.signals(self.identity), name)
        # As the process hash: a signal for a process gone is dropped with it, and one for a
        # process beating every 90 s must still be there at its next beat.
        interval = _number(self.info.get("heartbeat_interval")) or DEFAULT_HEARTBEAT_INTERVAL
        pipe.expire(self.keys.signals(self.identity), presence_ttl(min(max(interval, 0.0), 3600.0)))
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

    def __init__(self, *, redis: RedisClient | None = None, keys: Keys | None = None):
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
        fields = cast(dict[bytes, bytes], self.redis.hgetall(self.keys.process(identity)))  # (a bytes client)
        return Process(identity, fields, redis=self.redis, keys=self.keys) if fields.get(b"info") else None

    def size(self) -> int:
        return sum(1 for _ in self)

    def readers(self) -> dict[str, int]:
        """Queue name -> how many live processes fetch from it (a quiet one fetches nothing): a
        queue no process reads has jobs that wait forever, which the queues page says."""
        counts: dict[str, int] = {}
        for process in self:
            if not process.is_quiet:
                for name in set(process.queues):
                    counts[name] = counts.get(name, 0) + 1
        return counts


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

    def __init__(self, *, redis: RedisClient | None = None, keys: Keys | None = None):
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
