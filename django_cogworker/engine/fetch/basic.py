"""Basic fetch: pop jobs off their queues; what runs is known only from this process's memory.

``FETCH_BASIC`` pops up to n jobs (``RPOP``), else ``BRPOP`` on all queues for
up to ``block_cap``. Nothing to acknowledge: a popped job has left Redis
already. At shutdown, unfinished jobs are pushed back one by one. A kill -9
loses the jobs running then (at-most-once for those), and there is no
in-progress list: reconciling, the orphan registry and the heartbeat's
registry writes are no-ops here.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, cast

import redis as redis_lib

from ...broker import scripts
from ...errors import is_unavailable
from .contract import BeatWrite, Fetch, Unit

if TYPE_CHECKING:
    from ..settle.outgoing import Outgoing

logger = logging.getLogger(__name__)


class BasicFetch(Fetch):
    """Fetch by popping; see :class:`~.fetch.Fetch` for who calls what, and when."""

    keeps_held = False  # (what it took lives only in its memory: nothing is taken ahead)

    def retrieve(self, n: int, paused: frozenset[str] = frozenset(), outgoing: Outgoing | None = None) -> list[Unit]:
        """Pop up to ``n`` jobs (the acks of ``outgoing`` need nothing: a popped job has left Redis already)."""
        order = self.queue_order(paused)
        if not order:
            return []
        queue_keys = [self.keys.queue(q) for q in order]
        return self._parse(scripts.FETCH_BASIC(self.redis, queue_keys, [n, self.step]), order)

    def wait(self, paused: frozenset[str] = frozenset()) -> list[Unit]:
        waitable = self._waitable(self.queue_order(paused))
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
        queue = self.keys.queue_name(key.decode() if isinstance(key, bytes) else key)
        return self._placed(Unit(cast(bytes, raw), queue), None)

    def ack(self, raw: bytes) -> None:
        """Nothing to do: the job left Redis when it was popped."""

    def hand_back(self, units: Sequence[Unit]) -> int:
        return self.requeue(units)

    def requeue(self, units: Iterable[Unit], acks: Sequence[bytes] = (), keep: Sequence[bytes] = ()) -> int:
        """Push the jobs this process holds back onto the end their queues are popped from.

        ``units`` in the order they were fetched; the last is pushed first, so the
        first comes out first again. One entry that can't be pushed is logged and
        skipped, never allowed to cost the others their requeue. ``acks`` and
        ``keep`` name nothing in Redis here.
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

    def reconcile(self, known: collections.Counter[bytes], suspects: collections.Counter[bytes]
                  ) -> collections.Counter[bytes]:
        """Nothing to reconcile: no list in Redis holds what this process took. No suspects."""
        return collections.Counter()

    def forget_if_empty(self) -> bool:
        """Nothing to leave: a basic fetch never joins the orphan registry. True."""
        return True

    def heartbeat_writes(self, now: float) -> list[BeatWrite]:
        """None: no in-progress list to register, and orphan recovery reads no beat of ours."""
        return []
