"""The heartbeat: this process's presence in Redis, and the chores that ride on each beat.

Created by the Launcher; ``beat_until_ok`` runs on the main thread at startup
(nothing is fetched before the first good beat), then ``start`` runs a beat
every ``HEARTBEAT_INTERVAL`` on its own thread until ``stop``.

Each beat writes the process hash (``info`` JSON, ``busy``, ``quiet``): the
one essential write, what makes the process alive to everyone else. The
process registry, the workers hash, the in-progress registry and the last-beat
stamp are each written best-effort: one shared key of the wrong type used to
fail every beat of every process, so no process could start anywhere in the
fleet. A lost connection still fails the beat as a whole. The same round trip
reads the paused queues and the remote signals.

Then the chores (flush stats, retry pending settlements, prune the registry,
the launcher's, and those each feature asks for: ``Feature.chores``, such as the
cancellation's read of the cancel requests) are poked, never run: each group
runs on a thread of its own (chores.py), so a slow one never delays a beat.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...broker.keys import Keys, presence_ttl
from ...broker.types import RedisClient
from ...conf import Config
from ...errors import is_unavailable
from ..fetch.contract import Fetch
from ..fetch.stall import clock as stall_clock
from ..loops import BACKOFF_MAX, LoopThread, Watchdog, redis_time
from ..run.hooks import Feature
from ..settle.stats import Stats
from .chores import Chores
from .manager import Manager

logger = logging.getLogger(__name__)

SIGNALS = ("quiet", "stop", "dump")


def rss_kb() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    except (OSError, ValueError, IndexError):
        try:
            import resource

            return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        except Exception:
            return 0


class Heartbeat(LoopThread):
    """Beats every HEARTBEAT_INTERVAL: this process's presence, then the chores that ride on it.

    Created by the Launcher with the manager (what runs, quiet, the paused
    queues it is told, its pending settlements), the fetch (its own writes to
    each beat: ``heartbeat_writes``), the stats (flushed after each beat), extra
    chores (the Launcher's periodic-lock renewal and reconcile) and the
    features, whose chores it asks for. ``beat_until_ok`` runs on the main thread before
    anything starts; ``start`` then beats on the ``cogworker-heartbeat``
    daemon thread, under a Watchdog, until ``stop``; quiet doesn't stop it (a
    quiet process is still alive). Each good beat pokes the chores, which run
    on the ``cogworker-chores`` and ``cogworker-feature-chores`` threads
    (started and stopped with this one); ``run_chores`` runs them once on the
    caller's thread. ``clear`` leaves the registry at a clean exit.
    """

    def __init__(self, config: Config, redis: RedisClient, keys: Keys, identity: str, manager: Manager, fetch: Fetch,
                 stats: Stats, on_signal: Callable[[str], None], version: str, started_at: float | None = None,
                 extra_chores: tuple[Callable[[Any], None], ...] = (), extra_info: Mapping[str, Any] | None = None,
                 on_beat: Callable[[], None] | None = None, features: Sequence[Feature] = ()):
        self.config = config
        self.redis = redis
        self.keys = keys
        self.identity = identity
        self.manager = manager
        self.fetch = fetch
        self.stats = stats
        self.on_signal = on_signal
        self.chores = (
            Chores("cogworker-chores", (("stats", lambda: self.stats.flush(self.redis)),
                                        ("pending settlements", self.manager.retry_pending_settlements),
                                        ("stale processes", self.prune_processes),
                                        *self._named(extra_chores))),
            # (a feature's: this package doesn't know how long they take, so they hold back no core one)
            Chores("cogworker-feature-chores", self._named(tuple(c for f in features for c in f.chores()))))
        self._init_thread("cogworker-heartbeat")
        self.process_count = 1
        self.beats = 0
        hostname = socket.gethostname()
        self.info = {
            "hostname": hostname, "pid": os.getpid(), "tag": config.tag, "identity": identity,
            "started_at": started_at or time.time(), "queues": list(config.queue_names),
            "weights": dict(config.queues), "concurrency": config.concurrency,
            "async_concurrency": config.async_concurrency, "fetch": config.fetch,
            "version": version, "heartbeat_interval": config.heartbeat_interval,
            **(extra_info or {}),  # (a supervised process's supervisor and index)
        }
        self._next_prune = 0.0
        self.ttl = presence_ttl(config.heartbeat_interval)  # of the process and workers hashes
        # Redis's time of the first beat of the current run of good beats; None while beats fail.
        # Until it is old enough, silence in Redis may be Redis's own doing (an outage, OOM,
        # READONLY), which every process suffered alike: orphan recovery gives no verdicts then.
        self.steady_since: float | None = None
        self.last_beat: float | None = None  # Redis's time of the last good beat
        # This process's own clock (monotonic) at its last good beat, for the health probes and the
        # caps; ``on_beat`` is told of each (the supervisor's report: engine/process/report.py).
        self.last_ok: float | None = None
        self.on_beat = on_beat
        self.failing = False  # whether the last beat failed (readiness: engine/process/health.py)

    def _named(self, chores: tuple[Callable[[Any], None], ...]) -> tuple[tuple[str, Callable[[], object]], ...]:
        return tuple((getattr(c, "__name__", "chore"), lambda c=c: c(self.redis)) for c in chores)

    def start(self) -> None:
        for chores in self.chores:
            chores.start()
        super().start()

    def stop(self) -> None:
        for chores in self.chores:
            chores.ask_stop()  # (all at once: a chore stuck in a call costs one wait, not one per group)
        super().stop()
        for chores in self.chores:
            chores.stop()

    def run_chores(self) -> None:
        """Run every chore once on the caller's thread, as the chore threads do after a beat."""
        for chores in self.chores:
            chores.run_round()

    def beat_until_ok(self, give_up: threading.Event) -> bool:
        """Beat until one succeeds (startup waits for it); False if ``give_up`` was set first."""
        watchdog = self._watchdog(give_up)
        while not give_up.is_set():
            if self._beat_once(watchdog):
                return True
        return False

    def _run(self) -> None:
        watchdog = self._watchdog(self.stop_event)
        while not self.stop_event.wait(self.config.heartbeat_interval):
            self._beat_once(watchdog)

    def _watchdog(self, stop: threading.Event) -> Watchdog:
        # Backing off no longer than a beat: once Redis is back, every live process has beaten
        # again within about two intervals, which orphan recovery counts on (steady_since).
        return Watchdog("heartbeat", stop, backoff_max=min(BACKOFF_MAX, self.config.heartbeat_interval))

    def _beat_once(self, watchdog: Watchdog) -> bool:
        if watchdog.run_step(self.beat):
            self.failing = False
            return True
        self.failing = True
        self.steady_since = None
        return False

    def beat(self) -> None:
        r, k, manager = self.redis, self.keys, self.manager
        sent = stall_clock()
        now = self._redis_now()
        info = dict(self.info, rss_kb=rss_kb())
        workers = manager.workers_snapshot()
        fetch_writes = self.fetch.heartbeat_writes(now)
        pipe = r.pipeline(transaction=False)
        pipe.hset(k.process(self.identity), mapping={
            "info": json.dumps(info), "busy": str(len(workers)), "quiet": str(manager.quiet).lower(),
            "beat": repr(now)})
        pipe.expire(k.process(self.identity), self.ttl)
        secondary = [("process registry", lambda p: p.sadd(k.processes, self.identity)),
                     ("process count", lambda p: p.scard(k.processes)),
                     ("workers hash", lambda p: p.delete(k.workers(self.identity))),
                     ("workers hash", lambda p: p.hset(k.workers(self.identity), mapping=workers) if workers
                      else p.exists(k.workers(self.identity))),
                     ("workers expiry", lambda p: p.expire(k.workers(self.identity), self.ttl)),
                     # LPUSHed by the sender: RPOP, so they are acted on in the order sent.
                     ("remote signals", lambda p: p.rpop(k.signals(self.identity), 10)),
                     ("paused queues", lambda p: p.smembers(k.paused_queues)),
                     # Reliable fetch: the in-progress registry and the last-beat stamp, for orphan recovery.
                     *fetch_writes]
        for _what, add in secondary:
            add(pipe)
        results = pipe.execute(raise_on_error=False)
        for result in results[:2]:
            if isinstance(result, Exception):
                raise result  # the essential write: the beat as a whole failed
        named = dict(zip(range(2, len(results)), secondary, strict=True))
        stamped, fetch_first = True, len(results) - len(fetch_writes)  # (the fetch's writes come last)
        for i, result in enumerate(results[2:], start=2):
            what = named[i][0]
            if isinstance(result, Exception):
                if is_unavailable(result):
                    raise result
                stamped = stamped and i < fetch_first
                logger.error("heartbeat: %s not written: %s: %s", what, type(result).__name__, result)
                if what == "paused queues":
                    manager.paused = frozenset()  # unreadable: count as none paused, logged
            elif what == "process count":
                self.process_count = max(int(result), 1)
            elif what == "remote signals" and result:
                for sig in result:
                    self._signal(sig.decode() if isinstance(sig, bytes) else str(sig))
            elif what == "paused queues":
                manager.paused = frozenset(m.decode() if isinstance(m, bytes) else m for m in result)
        if stamped:  # (what orphan recovery reads went through: nobody takes this process for dead for a while)
            self.fetch.stall.stamped(sent)
        self.beats += 1
        gap = None if self.last_beat is None else now - self.last_beat
        if gap is not None and gap > self.config.orphan_threshold:
            logger.warning("this process went %.0fs without a beat (more than ORPHAN_THRESHOLD): others may have "
                           "taken it for dead and requeued the jobs it was running, which then run twice (those "
                           "it took ahead start only if still its own)", gap)
        if self.steady_since is None or (gap is not None and gap > self.overdue_after()):
            # The first good beat after failed ones, or one that hung (Redis stalled for less than
            # the socket timeout) and then went through: the others' beats hung alike, so the
            # grace starts again.
            self.steady_since = now
        self.last_beat = now
        self.last_ok = time.monotonic()
        if self.on_beat is not None:
            self.on_beat()
        for chores in self.chores:
            chores.poke()

    def overdue_after(self) -> float:
        """Seconds after which this process's own last beat is late: two intervals and a second."""
        return 2 * self.config.heartbeat_interval + 1.0

    def steady_at(self, now: float) -> float | None:
        """``steady_since``, or None while this process's own last beat is overdue at ``now``
        (Redis's time): then Redis may be stalling every process alike, this one included, and
        the poller may have got through before the heartbeat."""
        if self.last_beat is None or now - self.last_beat > self.overdue_after():
            return None
        return self.steady_since

    def prune_processes(self) -> None:
        """Drop registry entries whose process hash has expired, at most once per ``ttl``.

        A process killed without a goodbye (kill -9, a lost host) leaves its
        identity in ``processes`` forever otherwise: the admin lists it, and
        every poll interval (average x process count) grows with each crash.
        """
        if time.monotonic() < self._next_prune:
            return
        self._next_prune = time.monotonic() + self.ttl
        members = list(self.redis.smembers(self.keys.processes))
        pipe = self.redis.pipeline(transaction=False)
        for member in members:
            pipe.exists(self.keys.process(member.decode() if isinstance(member, bytes) else member))
        gone = [m for m, alive in zip(members, pipe.execute(), strict=True) if not alive]
        if gone:
            self.redis.srem(self.keys.processes, *gone)
            logger.info("removed %d process(es) gone without a goodbye from %s", len(gone), self.keys.processes)

    def _signal(self, name: str) -> None:
        if name not in SIGNALS:
            logger.warning("ignoring unknown remote signal %r", name)
            return
        logger.info("remote signal: %s", name)
        self.on_signal(name)

    def _redis_now(self) -> float:
        """Redis's clock for the stamps (:func:`redis_time`); a method, so a test can move it."""
        return redis_time(self.redis)

    def clear(self) -> None:
        """At clean exit: leave the registry at once instead of waiting for the hashes to expire."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.srem(self.keys.processes, self.identity)
        # (DEL as a raw command: redis-py's cluster pipeline takes one key per delete call)
        pipe.execute_command("DEL", self.keys.process(self.identity), self.keys.workers(self.identity),
                             self.keys.signals(self.identity))
        pipe.execute(raise_on_error=False)
