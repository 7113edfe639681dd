"""Reliable fetch (the default): every job this process holds is also on its in-progress list.

Each job moves atomically from its queue into ``in_progress:<identity>``
(``FETCH_RELIABLE``, ``BLMOVE`` when idle) and is acknowledged by removing it
from there. A job never exists only in this process's memory: a crash loses
nothing, orphan recovery requeues the list of a process that stopped beating.
The list is registered for that with each beat (``heartbeat_writes``) and left
at a clean exit (``forget_if_empty``).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

import redis as redis_lib

from ...broker import scripts
from ...errors import RedisUnavailable, is_unavailable
from ...push import payload as payloads
from .contract import IDLE_START, BeatWrite, Fetch, Unit

if TYPE_CHECKING:
    from ..settle.outgoing import Outgoing

logger = logging.getLogger(__name__)


class ReliableFetch(Fetch):
    """Fetch through this process's in-progress list; see :class:`~.fetch.Fetch` for who calls what, and when."""

    rides = True

    def retrieve(self, n: int, paused: frozenset[str] = frozenset(), outgoing: Outgoing | None = None) -> list[Unit]:
        order = self.queue_order(paused)
        acks = outgoing.acks if outgoing is not None else []
        if not order:
            if outgoing is not None:
                outgoing.run_alone()
            if acks:
                self.ack_many(acks)
            return []
        queue_keys = [self.keys.queue(q) for q in order]
        keys, argv = [self.in_progress, *queue_keys], [n, len(acks), *acks, self.step]
        try:
            if outgoing is not None and outgoing.riding:
                reply = self._fetch_riding(outgoing, keys, argv)
            else:
                reply = scripts.FETCH_RELIABLE(self.redis, keys, argv)
            return self._parse(reply, order)
        except RedisUnavailable:
            if acks:
                return []  # the acks went through: failing would have them settled again; the next call raises
            raise

    def wait(self, paused: frozenset[str] = frozenset()) -> list[Unit]:
        # Nothing waiting anywhere: wait on one queue so a push wakes us at once.
        waitable = self._waitable(self.queue_order(paused))
        if not waitable:
            return []
        try:
            raw = self.redis.blmove(self.keys.queue(waitable[0]), self.in_progress,
                                    self._block_wait(waitable), "RIGHT", "LEFT")  # type: ignore[arg-type]
        except redis_lib.exceptions.ResponseError as exc:
            if is_unavailable(exc):
                raise
            self._log_unfetchable(waitable[0], exc)
            return []
        if raw is None:
            return []
        self._idle_wait = IDLE_START
        return self._placed(Unit(cast(bytes, raw), waitable[0]), self.in_progress)  # (a bytes client)

    def _fetch_riding(self, outgoing: Outgoing, keys: list[Any], argv: list[Any]) -> Any:
        """FETCH_RELIABLE on one pipeline behind the steps that ride it: one round trip for both."""
        pipe = self.redis.pipeline(transaction=False)
        queued = outgoing.queue(pipe)
        scripts.FETCH_RELIABLE.in_pipeline_by_sha(pipe, keys, argv)
        try:
            replies = pipe.execute(raise_on_error=False)
        except Exception as exc:
            outgoing.failed(exc)
            raise
        outgoing.landed(replies[:queued])
        reply = replies[queued]
        if isinstance(reply, redis_lib.exceptions.NoScriptError):  # (nothing ran: again, alone, which loads it)
            return scripts.FETCH_RELIABLE(self.redis, keys, argv)
        if isinstance(reply, Exception):
            raise reply
        return reply

    def still_ours(self, unit: Unit) -> bool:
        """Whether ``unit`` is still on our in-progress list, and no recovery of it is under way."""
        return bool(scripts.CONFIRM_HELD(self.redis, [*self._beat_keys(), self.in_progress],
                                         [self.identity, unit.raw, repr(time.time())]))

    def _beat_keys(self) -> list[str]:
        k = self.keys
        return [k.orphan_lock(self.identity), k.last_beat, k.in_progress_identities]

    def _listed(self) -> collections.Counter[bytes]:
        """What our in-progress list holds, each entry counted."""
        return collections.Counter(cast(list[bytes], self.redis.lrange(self.in_progress, 0, -1)))

    def ack(self, raw: bytes) -> None:
        self.redis.lrem(self.in_progress, 1, raw)  # type: ignore[arg-type]  # (redis-py takes bytes)

    def ack_many(self, raws: Sequence[bytes]) -> None:
        """Acknowledge ``raws`` in one round trip: the fetch's script, fetching none.

        (One command, not a pipeline of LREMs: a processor sends them when the settlements held
        reach the settlement queue's cap, and a pipeline of 11 cost the worker twice the CPU of the script.)
        """
        scripts.FETCH_RELIABLE(self.redis, [self.in_progress], [0, len(raws), *raws])

    def send(self, outgoing: Outgoing) -> None:
        """The riding steps, then the acks (``ack_many``'s script, fetching none), on one pipeline:
        one round trip, not one for the steps and one for the acks. Only unordered steps may be
        given here (a limit's release): an ack on the same pipeline as its ordered step would
        land even when the step didn't."""
        if not outgoing.riding:
            if outgoing.acks:
                self.ack_many(outgoing.acks)
            return
        pipe = self.redis.pipeline(transaction=False)
        queued = outgoing.queue(pipe)
        if outgoing.acks:
            scripts.FETCH_RELIABLE.in_pipeline_by_sha(pipe, [self.in_progress], [0, len(outgoing.acks), *outgoing.acks])
        try:
            replies = pipe.execute(raise_on_error=False)
        except Exception as exc:
            outgoing.failed(exc)
            raise
        outgoing.landed(replies[:queued])
        if outgoing.acks:
            reply = replies[queued]
            if isinstance(reply, redis_lib.exceptions.NoScriptError):  # (nothing ran: again, alone, which loads it)
                self.ack_many(outgoing.acks)
            elif isinstance(reply, Exception):
                raise reply

    def requeue(self, units: Iterable[Unit], acks: Sequence[bytes] = (), keep: Sequence[bytes] = ()) -> int:
        """Put back everything on our in-progress list but ``keep``; drop ``acks``; one atomic step.

        ``units`` tells the queue of the jobs this process knows; anything else
        on the list (fetched, but the reply was lost) goes back to the queue its
        payload names. An entry that can't be read stays for orphan recovery.
        """
        listed = self._listed()
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
        # (pushed last first: the first fetched comes out first again)
        return self._requeue_counted(collections.Counter(u.raw for u in reversed(units)),
                                     {u.raw: u.queue for u in units})

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
        listed = self._listed()
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

    def heartbeat_writes(self, now: float) -> list[BeatWrite]:
        """Register the in-progress list for orphan recovery, and stamp the beat with Redis's time."""
        k, identity = self.keys, self.identity
        return [("in-progress registry", lambda p: p.sadd(k.in_progress_identities, identity)),
                ("last-beat stamp", lambda p: p.hset(k.last_beat, identity, repr(now)))]


def _queue_of(raw: bytes) -> str | None:
    try:
        queue = payloads.decode(raw).get("queue")
    except payloads.PayloadError:
        return None
    return queue if isinstance(queue, str) and queue else None
