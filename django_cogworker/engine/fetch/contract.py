"""The fetch contract: how a process takes jobs from its queues and settles them.

:class:`Fetch` declares every call the rest of the engine makes on a fetch
strategy, and which thread makes it; nothing outside the strategies asks which
one it holds. Two implement it:

* :class:`~.reliable.ReliableFetch` (the default): each job moves
  atomically from its queue into ``in_progress:<identity>`` and is
  acknowledged by removing it from there; a job never exists only in this
  process's memory, so a crash loses nothing (orphan recovery requeues the list).
* :class:`~.basic.BasicFetch`: BRPOP. What runs is known only from this
  process's memory: a kill -9 loses the jobs it was running (at-most-once for
  those). Its reliable-only calls are documented no-ops.

Redis load when idle: one blocking call per BLOCK_TIMEOUT (2 s) with a single
active queue. With several, one script that looks at all of them, then a
blocking call on the first, with a wait that doubles from 50 ms up to
FETCH_IDLE_MAX_INTERVAL: two commands per FETCH_IDLE_MAX_INTERVAL per process
at rest, whatever the concurrency (one fetcher thread per process).
"""

from __future__ import annotations

import abc
import collections
import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...broker import scripts
from ...broker.keys import Keys
from ...broker.scripts.lanes import in_lane
from ...broker.types import RedisClient
from ...conf import Config
from ...errors import UNAVAILABLE_CODES, RedisUnavailable, error_code
from ..settle.outgoing import Outgoing
from ..settle.retry import Filing
from .stall import StallWatch

logger = logging.getLogger(__name__)

BLOCK_TIMEOUT = 2.0
IDLE_START = 0.05
UNFETCHABLE_LOG_EVERY = 60.0

# A best-effort write a fetch adds to each heartbeat: (what it is, for the log; the call on the pipeline).
BeatWrite = tuple[str, Callable[[Any], Any]]


@dataclass(slots=True)
class Unit:
    """One fetched job: the payload bytes exactly as stored, the queue it came from, and when it
    was taken (the fetcher's stall-watch clock, read before the fetch was sent: see stall.py)."""

    raw: bytes
    queue: str
    taken: float = field(default=0.0, compare=False)
    # What a feature's ``fetched`` hook kept for this job (a limit's places taken with the fetch's
    # others), for its ``before`` to find: engine/run/hooks.py.
    notes: dict[str, Any] | None = field(default=None, compare=False)


def shown(unit: Unit) -> tuple[str, str]:
    """(jid, class) of ``unit``, printable, for a log line (its payload's start as the jid when it
    can't be read)."""
    from ...push import payload as payloads

    try:
        payload = payloads.decode(unit.raw)
    except payloads.PayloadError:
        return payloads.printable(repr(unit.raw[:100])), "?"
    return payloads.printable(payload.get("jid")), payloads.printable(payload.get("class"))


class Fetch(abc.ABC):
    """A fetch strategy: takes jobs from the queues, acknowledges them, files failures, hands jobs back.

    One per process, built by :func:`~.registry.make_fetch` for the Launcher and shared by
    the fetcher thread (taking), the processor threads and the heartbeat thread
    (settling), and the main thread (at shutdown). It runs no thread of its own
    and has no start, quiet or stop: the Manager's ``stop`` calls ``requeue``
    once, then the Launcher ``forget_if_empty``.

    ``in_progress`` is the key of this process's in-progress list (with basic
    fetch a key never written: removing from it is a no-op, so settling needs
    no branch); ``block_cap`` the longest a blocking call in ``retrieve`` waits.
    ``keeps_held`` says whether every job this process holds is also in Redis (recovered by
    orphan recovery if the process dies): only then does the fetcher take jobs ahead, and only
    then may a job it holds be taken back while it stalls (``stall``, ``still_ours``).
    """

    # Whether ``retrieve`` can carry the features' held steps on its own round trip (engine/settle/
    # outgoing.py); a fetch that can't has them run first, alone.
    rides = False

    keeps_held = True

    def __init__(self, config: Config, redis: RedisClient, keys: Keys, identity: str, rng: random.Random | None = None):
        self.config = config
        self.redis = redis
        self.keys = keys
        self.identity = identity
        self.rng = rng or random.Random()
        self.in_progress = keys.in_progress(identity) if not keys.spread else ""  # (sharded.py sets it)
        # (the seconds a priority step is worth: the fetch scripts' last argument, lanes.py)
        self.step = repr(float(config.priority_aging or scripts.STRICT_STEP))
        self._weighted = [name for name, weight in config.queues for _ in range(weight)]
        self._idle_wait = IDLE_START
        self._logged_unfetchable: dict[str, float] = {}
        self.unfetchable: set[str] = set()  # queues the last batch fetch failed on (wrong type)
        self.stall = StallWatch(config.orphan_threshold if self.keeps_held else math.inf)
        timeout = (redis.connection_pool.connection_kwargs.get("socket_timeout")
                   if hasattr(redis, "connection_pool") else None)
        # A block longer than the socket timeout would read as a lost connection.
        self.block_cap = BLOCK_TIMEOUT if not timeout else max(min(BLOCK_TIMEOUT, timeout - 0.5), 0.01)

    # -- the contract ----------------------------------------------------------

    @abc.abstractmethod
    def retrieve(self, n: int, paused: frozenset[str] = frozenset(), outgoing: Outgoing | None = None) -> list[Unit]:
        """Take up to ``n`` jobs and send ``outgoing`` (finished jobs' settlements), in one round trip;
        never blocks (``wait`` does).

        Fetcher thread. Sends every ack of ``outgoing`` and, for a fetch that ``rides``, its riding
        steps (queued on the same pipeline: ``outgoing.queue``, ``landed``, or ``failed`` when the
        round trip didn't happen; ``run_alone`` when it makes none), or raises.
        """

    @abc.abstractmethod
    def wait(self, paused: frozenset[str] = frozenset()) -> list[Unit]:
        """Nothing was waiting: block on one queue for up to ``block_cap`` so that a push wakes this
        process at once; return the job it brought, if any. Fetcher thread."""

    @abc.abstractmethod
    def ack(self, raw: bytes) -> None:
        """Acknowledge one finished job (the Settler sends every ack through ``ack_many``)."""

    def ack_many(self, raws: Sequence[bytes]) -> None:
        """Acknowledge finished jobs in one round trip: every ack the Settler sends alone (one that
        can't wait for a fetch, those held past the settlement queue's cap or when the fetcher waits,
        pending ones): processor threads, the fetcher's, the heartbeat's, the main thread at shutdown."""
        for raw in raws:
            self.ack(raw)

    def send(self, outgoing: Outgoing) -> None:
        """Send ``outgoing`` with no fetch (settlements held past the settlement queue's cap): its
        steps, then its acks. A fetch that ``rides`` sends both in one round trip. Processor
        threads; raises when the round trip fails (``outgoing.failed`` told first)."""
        outgoing.run_alone()
        if outgoing.acks:
            self.ack_many(outgoing.acks)

    def file(self, raw: bytes, filing: Filing, trim: tuple[float, int] | None) -> None:
        """File a failed job in retry or dead and drop it from the in-progress list, atomically.

        Processor threads, the heartbeat thread (pending settlements), the main thread (at shutdown).
        """
        target = self.keys.filed_in(filing.target)
        below, cap = trim if trim else ("", "")
        scripts.FILE_FAILURE(self.redis, [self.in_progress, target], [raw, filing.score, filing.raw(), below, cap])

    def park(self, raw: bytes, unsettled: str, record: str) -> None:
        """At shutdown, hand a filing that failed over to ``unsettled`` and take its job off the
        in-progress list, in one step. Main thread."""
        scripts.PARK_UNSETTLED(self.redis, [self.in_progress, unsettled], [raw, record])

    def still_ours(self, unit: Unit) -> bool:
        """Whether ``unit``, taken before this process may have been taken for dead, is still its own
        to start; stamp this process's beat if so, so that no recovery judged on the old one follows.

        Processor threads, only for a unit ``stall`` doesn't cover. True here: what basic fetch took
        lives only in this process's memory, and no other process can have taken it back.
        """
        return True

    @abc.abstractmethod
    def hand_back(self, units: Sequence[Unit]) -> int:
        """Put back just ``units`` (fetched after quiet, or taken ahead and never started) at the
        head of their queues, the first fetched first again.

        Fetcher thread. Return how many went back.
        """

    @abc.abstractmethod
    def requeue(self, units: Iterable[Unit], acks: Sequence[bytes] = (), keep: Sequence[bytes] = ()) -> int:
        """At shutdown, hand back ``units`` (unfinished) and drop ``acks``; leave ``keep`` where it is.

        Main thread, once, from the Manager's stop. Return how many went back.
        """

    @abc.abstractmethod
    def reconcile(self, known: collections.Counter[bytes], suspects: collections.Counter[bytes]
                  ) -> collections.Counter[bytes]:
        """Requeue what this process holds in Redis without knowing of it; return the new suspects.

        Heartbeat thread (a Launcher chore, every RECONCILE_INTERVAL). ``known``
        counts every payload this process holds; ``suspects`` is what the
        previous call returned.
        """

    @abc.abstractmethod
    def forget_if_empty(self) -> bool:
        """Leave the orphan registry if nothing of this process is left in Redis; return whether it did.

        Main thread, at shutdown, after ``requeue``.
        """

    @abc.abstractmethod
    def heartbeat_writes(self, now: float) -> list[BeatWrite]:
        """The best-effort writes this fetch adds to each beat (``now``: Redis's time of the beat).

        Heartbeat thread, and the main thread for the beats before startup.
        """

    # -- shared by the strategies ---------------------------------------------

    def queue_order(self, paused: frozenset[str] = frozenset()) -> list[str]:
        """Queues to look at, in order: as listed when strict, else weighted random, paused left out.

        Fetcher thread (an empty list: every queue is paused, and it sleeps).
        """
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

    def _placed(self, unit: Unit, in_progress: str | None) -> list[Unit]:
        """What a blocking wait brought: ``unit``, or, when it belongs in a lane (a grouped or
        prioritized job, a doorbell), which the wait can't put there, the job UNTAKE puts it there
        and takes in turn in its place (broker/scripts/jobs.py; none: nothing more waits)."""
        if not in_lane(unit.raw):
            return [unit]
        keys = [in_progress, self.keys.queue(unit.queue)] if in_progress else [self.keys.queue(unit.queue)]
        try:
            return self._parse(scripts.UNTAKE(self.redis, keys, [unit.raw, self.step]), [unit.queue])
        except Exception as exc:
            if in_progress:  # (left on our list, unknown: the next reconcile but one puts it back)
                logger.warning("a job for a lane of queue %r stays on %s until reconciled (%s: %s)",
                               unit.queue, in_progress, type(exc).__name__, exc)
                return []
            # (popped, and only this process holds it: run it as an ordinary job, never lose it)
            return [] if unit.raw.startswith(b'{"lane":') else [unit]

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


def _text(message: Any) -> str:
    return message.decode(errors="replace") if isinstance(message, bytes) else str(message)
