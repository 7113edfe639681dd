"""The fetch strategies on a Redis Cluster, where each queue has its own slot (broker/keys/).

A script can't span slots, so what one script does across every queue on a lone Redis is
done here queue by queue: the batch fetch runs ``FETCH_RELIABLE`` (or ``FETCH_BASIC``) on one
queue at a time, in the same order (strict or weighted), until it has ``n`` jobs, with the
acks of that queue riding on its call; the blocking wait is on one queue, as with several
queues on a lone Redis. The reliable fetch keeps one in-progress list per queue
(``{cogworker:q:<q>}:in_progress:<identity>``), so take, ack and requeue stay in the queue's
slot; filing a failure crosses to the home slot in two steps (crossings.py). Which queue a
job came from is remembered from the fetch to its ack (its payload's queue, or every list
tried, when it isn't).

Chosen by :func:`~.registry.make_fetch` when ``keys.spread``; a lone Redis never runs this code.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

import redis as redis_lib

from ...broker import crossings, scripts
from ...errors import RedisUnavailable, is_unavailable
from ..settle.retry import Filing
from .basic import BasicFetch
from .contract import IDLE_START, Unit
from .reliable import ReliableFetch, _queue_of

if TYPE_CHECKING:
    from ..settle.outgoing import Outgoing

logger = logging.getLogger(__name__)


class ShardedReliableFetch(ReliableFetch):
    """Reliable fetch over per-queue in-progress lists; the threads that call it are :class:`~.fetch.Fetch`'s."""

    # (One script per queue's slot: the held steps run first, alone, rather than ride a pipeline
    # that would span slots.)
    rides = False

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.in_progress = self.keys.in_progress(self.identity, "*")  # (for the logs: every list of ours)
        # raw -> the queue it was fetched from, until acknowledged or filed (several threads).
        self._held: dict[bytes, str] = {}
        self._held_lock = threading.Lock()

    def list_of(self, queue: str) -> str:
        return self.keys.in_progress(self.identity, queue)

    def retrieve(self, n: int, paused: frozenset[str] = frozenset(), outgoing: Outgoing | None = None) -> list[Unit]:
        order = self.queue_order(paused)
        acks = outgoing.acks if outgoing is not None else []
        by_queue = self._by_queue(acks)
        if not order:  # (every queue paused: the fetcher sleeps)
            self._ack_grouped(by_queue)
            return []
        units: list[Unit] = []
        unfetchable: set[str] = set()
        try:
            for queue in order:
                if len(units) >= n:
                    break
                mine = by_queue.pop(queue, [])
                reply = scripts.FETCH_RELIABLE(self.redis, [self.list_of(queue), self.keys.queue(queue)],
                                               [n - len(units), len(mine), *mine, self.step])
                self._forget(mine)
                units += self._parse(reply, [queue])
                unfetchable |= self.unfetchable
            self._ack_grouped(by_queue)  # (acks of the queues not fetched from this time: one pipeline)
        except RedisUnavailable:
            if units or acks:
                return self._hold(units)  # what was taken is ours; the next call raises
            raise
        self.unfetchable = unfetchable
        if units:
            self._idle_wait = IDLE_START
        return self._hold(units)

    def wait(self, paused: frozenset[str] = frozenset()) -> list[Unit]:
        waitable = self._waitable(self.queue_order(paused))
        if not waitable:
            return []
        queue = waitable[0]
        try:
            raw = self.redis.blmove(self.keys.queue(queue), self.list_of(queue),
                                    self._block_wait(waitable), "RIGHT", "LEFT")  # type: ignore[arg-type]
        except redis_lib.exceptions.ResponseError as exc:
            if is_unavailable(exc):
                raise
            self._log_unfetchable(queue, exc)
            return []
        if raw is None:
            return []
        self._idle_wait = IDLE_START
        return self._hold(self._placed(Unit(cast(bytes, raw), queue), self.list_of(queue)))

    def still_ours(self, unit: Unit) -> bool:
        """As on a lone Redis, in two steps: the stamp (home slot), then the list (the queue's)."""
        ours = bool(scripts.CONFIRM_HELD(self.redis, self._beat_keys(), [self.identity, unit.raw, repr(time.time())]))
        # (looked at after the stamp: a recovery that takes the lock from then on sees this process alive)
        ours = ours and self.redis.lpos(self.list_of(unit.queue), unit.raw) is not None  # type: ignore[arg-type]
        if not ours:
            self._forget([unit.raw])
        return ours

    # -- which list a job is on ---------------------------------------------------------------

    def _hold(self, units: list[Unit]) -> list[Unit]:
        with self._held_lock:
            for unit in units:
                self._held[unit.raw] = unit.queue
        return units

    def _forget(self, raws: Iterable[bytes]) -> None:
        with self._held_lock:
            for raw in raws:
                self._held.pop(raw, None)

    def _queue_for(self, raw: bytes) -> str | None:
        with self._held_lock:
            queue = self._held.get(raw)
        return queue or _queue_of(raw)

    def _by_queue(self, raws: Sequence[bytes]) -> dict[str, list[bytes]]:
        """``raws`` by the queue whose list holds them; one whose queue isn't known under "" (every list tried)."""
        grouped: dict[str, list[bytes]] = {}
        for raw in raws:
            grouped.setdefault(self._queue_for(raw) or "", []).append(raw)
        return grouped

    def _ack_in(self, queue: str, raws: Sequence[bytes]) -> None:
        """LREM ``raws`` from ``queue``'s list (queue "": from every configured queue's list)."""
        self._ack_grouped({queue: list(raws)})

    def _ack_grouped(self, by_queue: dict[str, list[bytes]]) -> None:
        """LREM each queue's raws from its list, all in one pipeline (one round trip per node)."""
        if not any(by_queue.values()):
            return
        pipe = self.redis.pipeline(transaction=False)
        for queue, raws in by_queue.items():
            lists = [self.list_of(queue)] if queue else [self.list_of(q) for q in self.config.queue_names]
            for raw in raws:
                for key in lists:
                    pipe.lrem(key, 1, raw)  # type: ignore[arg-type]  # (redis-py takes bytes)
        pipe.execute()
        for raws in by_queue.values():
            self._forget(raws)

    # -- settling ------------------------------------------------------------------------------

    def ack(self, raw: bytes) -> None:
        self._ack_in(self._queue_for(raw) or "", [raw])

    def ack_many(self, raws: Sequence[bytes]) -> None:
        self._ack_grouped(self._by_queue(raws))

    def file(self, raw: bytes, filing: Filing, trim: tuple[float, int] | None) -> None:
        """File in retry or dead (home slot), then take it off its list: a crash between the two
        runs it once more (orphan recovery requeues it), never loses it."""
        target = self.keys.filed_in(filing.target)
        below, cap = trim if trim else ("", "")
        queue = self._queue_for(raw)
        crossings.file_from_list(self.redis, self.list_of(queue) if queue else self.in_progress, target, raw,
                                 filing.score, filing.raw(), below, cap)
        if not queue:  # (its list unknown: off whichever holds it)
            self._ack_in("", [raw])
        self._forget([raw])

    def park(self, raw: bytes, unsettled: str, record: str) -> None:
        """Hand a filing over to ``unsettled`` (home), then take the job off its list."""
        queue = self._queue_for(raw) or ""
        crossings.park_from_list(self.redis, self.list_of(queue) if queue else self.in_progress, unsettled,
                                 raw, record)
        if not queue:
            self._ack_in("", [raw])

    # -- handing back --------------------------------------------------------------------------

    def _listed_by_queue(self) -> dict[str, collections.Counter[bytes]]:
        pipe = self.redis.pipeline(transaction=False)
        names = self.config.queue_names
        for queue in names:
            pipe.lrange(self.list_of(queue), 0, -1)
        return {q: collections.Counter(cast(list[bytes], got)) for q, got in zip(names, pipe.execute(), strict=True)}

    def _listed(self) -> collections.Counter[bytes]:
        total: collections.Counter[bytes] = collections.Counter()
        for counted in self._listed_by_queue().values():
            total.update(counted)
        return total

    def requeue(self, units: Iterable[Unit], acks: Sequence[bytes] = (), keep: Sequence[bytes] = ()) -> int:
        """REQUEUE queue by queue: each of our lists has its unsettled entries but ``keep`` put back
        on its queue, ``acks`` dropped."""
        keep_left, acks_left = collections.Counter(keep), collections.Counter(acks)
        moved = 0
        for queue, listed in self._listed_by_queue().items():
            kept = listed & keep_left
            keep_left -= kept
            listed -= kept
            dropped = listed & acks_left
            acks_left -= dropped
            listed -= dropped
            moved += self._requeue_in(queue, listed, list(dropped.elements()))
        self._forget(u.raw for u in units)
        self._forget(acks)
        return moved

    def _requeue_in(self, queue: str, raws: collections.Counter[bytes], acks: Sequence[bytes] = ()) -> int:
        moves = [(raw, raw) for raw in raws.elements()]
        if not moves and not acks:
            return 0
        moved = crossings.requeue_in_slot(self.redis, self.keys, self.list_of(queue), queue, acks, moves)
        if moved < len(moves):
            logger.error("%d job(s) could not be pushed back to queue %r (a key of the wrong type?); "
                         "left on %s for orphan recovery", len(moves) - moved, queue, self.list_of(queue))
        return moved

    def hand_back(self, units: Sequence[Unit]) -> int:
        moved = 0
        for queue in dict.fromkeys(u.queue for u in units):
            # (pushed last first: the first fetched comes out first again)
            moved += self._requeue_in(queue, collections.Counter(u.raw for u in reversed(units) if u.queue == queue))
        self._forget(u.raw for u in units)
        return moved

    def reconcile(self, known: collections.Counter[bytes], suspects: collections.Counter[bytes]
                  ) -> collections.Counter[bytes]:
        """As on a lone Redis (:meth:`ReliableFetch.reconcile`), over our list of each queue."""
        by_queue = self._listed_by_queue()
        listed: collections.Counter[bytes] = collections.Counter()
        for counted in by_queue.values():
            listed.update(counted)
        listed.subtract(known)
        unknown = +listed
        stale = unknown & suspects
        moved = 0
        for queue, counted in by_queue.items():
            here = counted & stale
            stale -= here
            moved += self._requeue_in(queue, here) if here else 0
        if moved:
            logger.warning("requeued %d job(s) found on %s that this process never received", moved, self.in_progress)
        return unknown - (unknown & suspects)

    def forget_if_empty(self) -> bool:
        """Leave the orphan registry once every list of ours is empty (each in its queue's slot)."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in self.config.queue_names:
            pipe.llen(self.list_of(queue))
        if any(int(length) for length in pipe.execute()):
            return False
        k = self.keys
        return bool(scripts.FORGET_IDENTITY(self.redis, [k.in_progress_identities, k.last_beat,
                                                         k.orphan_lock(self.identity)], [self.identity]))


class ShardedBasicFetch(BasicFetch):
    """Basic fetch with each queue in its own slot: the batch pop queue by queue, BRPOP on one."""

    def retrieve(self, n: int, paused: frozenset[str] = frozenset(), outgoing: Outgoing | None = None) -> list[Unit]:
        order = self.queue_order(paused)
        units: list[Unit] = []
        unfetchable: set[str] = set()
        for queue in order:
            if len(units) >= n:
                break
            units += self._parse(scripts.FETCH_BASIC(self.redis, [self.keys.queue(queue)], [n - len(units), self.step]),
                                 [queue])
            unfetchable |= self.unfetchable
        self.unfetchable = unfetchable
        if units:
            self._idle_wait = IDLE_START
        return units

    def wait(self, paused: frozenset[str] = frozenset()) -> list[Unit]:
        waitable = self._waitable(self.queue_order(paused))
        if not waitable:
            return []
        queue = waitable[0]
        try:
            popped = self.redis.brpop([self.keys.queue(queue)], timeout=self._block_wait(waitable))
        except redis_lib.exceptions.ResponseError as exc:
            if is_unavailable(exc):
                raise
            self._log_unfetchable(queue, exc)
            return []
        if popped is None:
            return []
        return self._placed(Unit(cast(bytes, popped[1]), queue), None)
