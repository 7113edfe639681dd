"""Fetch strategies: how a process takes jobs from its queues and settles them.

Built by the launcher (one per process) and called by the manager's fetcher
thread (``retrieve``) and by processor threads (``ack``, ``file``). At
shutdown the manager calls ``requeue`` once, from the main thread.

* :class:`ReliableFetch` (the default): each job moves atomically from its
  queue into ``in_progress:<identity>`` and is acknowledged by removing it
  from there; a job never exists only in this process's memory, so a crash
  loses nothing (orphan recovery requeues the list).
* :class:`BasicFetch`: BRPOP. What runs is known only from this process's
  memory: a kill -9 loses the jobs it was running (at-most-once for those).

Redis load when idle: one blocking call per BLOCK_TIMEOUT (2 s) with a single
active queue. With several, one script that looks at all of them, then a
blocking move on the first, with a wait that doubles from 50 ms up to
FETCH_IDLE_MAX_INTERVAL: two commands per FETCH_IDLE_MAX_INTERVAL per process
at rest, whatever the concurrency (one fetcher thread per process).
"""

from __future__ import annotations

import collections
import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis as redis_lib

from .. import payload as payloads
from .. import scripts
from ..conf import Config
from ..errors import UNAVAILABLE_CODES, RedisUnavailable, error_code, is_unavailable
from ..keys import Keys
from .retry import Filing

logger = logging.getLogger(__name__)

BLOCK_TIMEOUT = 2.0
IDLE_START = 0.05
UNFETCHABLE_LOG_EVERY = 60.0


@dataclass(slots=True)
class Unit:
    """One fetched job: the payload bytes exactly as stored, and the queue it came from."""

    raw: bytes
    queue: str


class Fetch:
    reliable = False

    def __init__(self, config: Config, redis: Any, keys: Keys, identity: str, rng: random.Random | None = None):
        self.config = config
        self.redis = redis
        self.keys = keys
        self.identity = identity
        self.rng = rng or random.Random()
        self.in_progress = keys.in_progress(identity)
        self._weighted = [name for name, weight in config.queues for _ in range(weight)]
        self._idle_wait = IDLE_START
        self._logged_unfetchable: dict[str, float] = {}
        self.unfetchable: set[str] = set()  # queues the last batch fetch failed on (wrong type)
        timeout = (redis.connection_pool.connection_kwargs.get("socket_timeout")
                   if hasattr(redis, "connection_pool") else None)
        # A block longer than the socket timeout would read as a lost connection.
        self.block_cap = BLOCK_TIMEOUT if not timeout else max(min(BLOCK_TIMEOUT, timeout - 0.5), 0.01)

    def queue_order(self, paused: frozenset[str] = frozenset()) -> list[str]:
        """Queues to look at, in order: as listed when strict, else weighted random, paused left out."""
        if self.config.strict_queues:
            return [q for q in self.config.queue_names if q not in paused]
        shuffled = self._weighted[:]
        self.rng.shuffle(shuffled)
        return [q for q in dict.fromkeys(shuffled) if q not in paused]

    def _block_wait(self, queues: Sequence[str]) -> float:
        if len(queues) == 1:
            return self.block_cap
        wait = self._idle_wait
        self._idle_wait = min(self._idle_wait * 2, self.config.fetch_idle_max_interval)
        return min(wait, self.block_cap)

    def _parse(self, result: Sequence[Any], order: Sequence[str]) -> list[Unit]:
        """Read a batch script's reply; note the queues that failed in ``self.unfetchable``.

        Raise RedisUnavailable when Redis refused the moves server-wide (a
        replica, OOM) and nothing was fetched: read as a queue that can't be
        fetched from, it was logged as one for the key guard to quarantine.
        """
        units = []
        self.unfetchable = set()
        refused: RedisUnavailable | None = None
        for i in range(0, len(result), 2):
            index, value = result[i], result[i + 1]
            if index < 0:
                queue = order[-index - 1]
                if error_code(value) in UNAVAILABLE_CODES:
                    refused = refused or RedisUnavailable(f"{_text(value)} (fetching queue {queue!r})")
                    continue
                self.unfetchable.add(queue)
                self._log_unfetchable(queue, value)
            else:
                units.append(Unit(value, order[index - 1]))
        if units:
            self._idle_wait = IDLE_START
        elif refused is not None:
            raise refused
        return units

    def _waitable(self, order: Sequence[str]) -> list[str]:
        """The queues to block on: not the ones the batch script just failed on.

        A blocking call that names a key of the wrong type fails at once, so the
        fetcher never waited and spun on Redis until the key guard's next round.
        With none left, wait here instead, as long as the blocking call would have.
        """
        waitable = [q for q in order if q not in self.unfetchable]
        if not waitable:
            time.sleep(self._block_wait(order))
        return waitable

    def _log_unfetchable(self, queue: str, message: Any) -> None:
        now = time.monotonic()
        if now - self._logged_unfetchable.get(queue, -UNFETCHABLE_LOG_EVERY) >= UNFETCHABLE_LOG_EVERY:
            self._logged_unfetchable[queue] = now
            # Only a key of the wrong type is the key guard's to move aside.
            then = "; the key guard will quarantine it" if error_code(message) == "WRONGTYPE" else ""
            logger.error("queue %r can't be fetched from (%s)%s", queue, _text(message), then)

    def file(self, raw: bytes, filing: Filing, trim: tuple[float, int] | None) -> None:
        """File a failed job in retry or dead and drop it from the in-progress list, atomically."""
        target = self.keys.retry if filing.target == "retry" else self.keys.dead
        below, cap = trim if trim else ("", "")
        scripts.FILE_FAILURE(self.redis, [self.in_progress, target], [raw, filing.score, filing.raw(), below, cap])

    def ack(self, raw: bytes) -> None:
        raise NotImplementedError

    def retrieve(self, n: int, paused: frozenset[str] = frozenset(), acks: Sequence[bytes] = (),
                 before_block: Callable[[], None] | None = None) -> list[Unit]:
        raise NotImplementedError

    def ack_many(self, raws: Sequence[bytes]) -> None:
        for raw in raws:
            self.ack(raw)

    def requeue(self, units: Iterable[Unit], acks: Sequence[bytes] = (), keep: Sequence[bytes] = ()) -> int:
        raise NotImplementedError

    def hand_back(self, units: Sequence[Unit]) -> int:
        """Put back just ``units`` (fetched, never started) at the head of their queues."""
        raise NotImplementedError


class ReliableFetch(Fetch):
    reliable = True

    def retrieve(self, n: int, paused: frozenset[str] = frozenset(), acks: Sequence[bytes] = (),
                 before_block: Callable[[], None] | None = None) -> list[Unit]:
        """Acknowledge ``acks`` and take up to ``n`` jobs, in one round trip; block briefly when idle.

        ``before_block`` is called before a blocking wait (the manager sends
        acks that arrive meanwhile on their own, rather than hold them).
        """
        order = self.queue_order(paused)
        if not order:
            if acks:
                self.ack_many(acks)
            return []
        queue_keys = [self.keys.queue(q) for q in order]
        try:
            units = self._parse(scripts.FETCH_RELIABLE(self.redis, [self.in_progress, *queue_keys],
                                                       [n, len(acks), *acks]), order)
        except RedisUnavailable:
            if acks:
                return []  # the acks went through: failing would have them settled again; the next call raises
            raise
        if units:
            return units
        if before_block is not None:
            before_block()
        # Nothing waiting anywhere: wait on one queue so a push wakes us at once.
        waitable = self._waitable(order)
        if not waitable:
            return []
        try:
            raw = self.redis.blmove(self.keys.queue(waitable[0]), self.in_progress, self._block_wait(waitable),
                                    "RIGHT", "LEFT")
        except redis_lib.exceptions.ResponseError as exc:
            if is_unavailable(exc):
                raise
            self._log_unfetchable(waitable[0], exc)
            return []
        if raw is None:
            return []
        self._idle_wait = IDLE_START
        return [Unit(raw, waitable[0])]

    def ack(self, raw: bytes) -> None:
        self.redis.lrem(self.in_progress, 1, raw)

    def ack_many(self, raws: Sequence[bytes]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for raw in raws:
            pipe.lrem(self.in_progress, 1, raw)
        pipe.execute()

    def requeue(self, units: Iterable[Unit], acks: Sequence[bytes] = (), keep: Sequence[bytes] = ()) -> int:
        """Put back everything on our in-progress list but ``keep``; drop ``acks``; one atomic step.

        ``units`` tells the queue of the jobs this process knows; anything else
        on the list (fetched, but the reply was lost) goes back to the queue its
        payload names. An entry that can't be read stays for orphan recovery.
        """
        listed = collections.Counter(self.redis.lrange(self.in_progress, 0, -1))
        listed.subtract(collections.Counter(keep))
        acks = [raw for raw in acks if listed[raw] > 0]
        listed.subtract(collections.Counter(acks))
        return self._requeue_counted(+listed, {u.raw: u.queue for u in units}, acks)

    def _requeue_counted(self, raws: collections.Counter[bytes], queues: dict[bytes, str],
                         acks: Sequence[bytes] = ()) -> int:
        """Drop ``acks`` and requeue ``raws`` (each as many times as counted) in one script."""
        moves: list[tuple[bytes, bytes, str, str]] = []
        for raw, count in raws.items():
            queue = queues.get(raw) or _queue_of(raw)
            if queue is None:
                logger.error("unreadable entry left on %s for orphan recovery: %.200r", self.in_progress, raw)
                continue
            moves += [(raw, raw, self.keys.queue(queue), queue)] * count
        keys, argv = scripts.requeue_args(self.in_progress, self.keys.queues, acks, moves)
        moved = int(scripts.REQUEUE(self.redis, keys, argv)) if acks or moves else 0
        listed_to_move = len(moves)
        if moved < listed_to_move:
            logger.error("%d job(s) could not be pushed back to their queue (a key of the wrong type?); "
                         "left on %s for orphan recovery", listed_to_move - moved, self.in_progress)
        return moved

    def hand_back(self, units: Sequence[Unit]) -> int:
        return self._requeue_counted(collections.Counter(u.raw for u in units), {u.raw: u.queue for u in units})

    def reconcile(self, known: collections.Counter[bytes], suspects: collections.Counter[bytes]
                  ) -> collections.Counter[bytes]:
        """Requeue what sits on our list without our knowing of it; return the new suspects.

        A fetch whose reply was lost (connection cut after Redis ran the move)
        leaves jobs on our list that no thread will run: orphan recovery won't
        see them while we live. This process's record is trusted over Redis:
        an entry on the list but not in ``known`` is a suspect, and one still
        unknown at the next reconcile (long after any reply in flight) is put
        back on its queue.
        """
        listed = collections.Counter(self.redis.lrange(self.in_progress, 0, -1))
        listed.subtract(known)
        unknown = +listed
        stale = unknown & suspects
        if stale:
            moved = self._requeue_counted(stale, {})
            logger.warning("requeued %d job(s) found on %s that this process never received", moved,
                           self.in_progress)
        return unknown - stale

    def forget_if_empty(self) -> bool:
        """Drop this identity from the orphan registry once its list is empty (clean exit)."""
        return bool(scripts.FORGET_IDENTITY(
            self.redis, [self.in_progress, self.keys.in_progress_identities, self.keys.last_beat,
                         self.keys.orphan_lock(self.identity)], [self.identity]))


class BasicFetch(Fetch):
    def retrieve(self, n: int, paused: frozenset[str] = frozenset(), acks: Sequence[bytes] = (),
                 before_block: Callable[[], None] | None = None) -> list[Unit]:
        """Pop up to ``n`` jobs (``acks`` need nothing: a popped job has left Redis already)."""
        order = self.queue_order(paused)
        if not order:
            return []
        queue_keys = [self.keys.queue(q) for q in order]
        units = self._parse(scripts.FETCH_BASIC(self.redis, queue_keys, [n]), order)
        if units:
            return units
        waitable = self._waitable(order)
        if not waitable:
            return []
        try:
            popped = self.redis.brpop([self.keys.queue(q) for q in waitable], timeout=self.block_cap)
        except redis_lib.exceptions.ResponseError as exc:
            if is_unavailable(exc):
                raise
            self._log_unfetchable(",".join(waitable), exc)
            return []
        if popped is None:
            return []
        key, raw = popped
        return [Unit(raw, self.keys.queue_name(key.decode() if isinstance(key, bytes) else key))]

    def ack(self, raw: bytes) -> None:
        """Nothing to do: the job left Redis when it was popped."""

    def hand_back(self, units: Sequence[Unit]) -> int:
        return self.requeue(units)

    def requeue(self, units: Iterable[Unit], acks: Sequence[bytes] = (), keep: Sequence[bytes] = ()) -> int:
        """Push the jobs this process holds back onto the end their queues are popped from.

        ``units`` in the order they were fetched; the last is pushed first, so the
        first comes out first again. One entry that can't be pushed is logged and
        skipped, never allowed to cost the others their requeue.
        """
        moved = 0
        for unit in reversed(list(units)):
            try:
                pipe = self.redis.pipeline(transaction=False)
                pipe.rpush(self.keys.queue(unit.queue), unit.raw)
                pipe.sadd(self.keys.queues, unit.queue)
                pipe.execute()
                moved += 1
            except Exception:
                logger.exception("could not requeue a job of queue %r (lost, basic fetch): %.500r",
                                 unit.queue, unit.raw)
        return moved


def _text(message: Any) -> str:
    return message.decode(errors="replace") if isinstance(message, bytes) else str(message)


def _queue_of(raw: bytes) -> str | None:
    try:
        queue = payloads.decode(raw).get("queue")
    except payloads.PayloadError:
        return None
    return queue if isinstance(queue, str) and queue else None


def make_fetch(config: Config, redis: Any, keys: Keys, identity: str) -> Fetch:
    return (ReliableFetch if config.fetch == "reliable" else BasicFetch)(config, redis, keys, identity)
