"""The Client's part in the transactional outbox (django_cogworker/outbox/): a push inside a
transaction written as rows of it, the hand-over of rows to Redis, and a push Redis refuses saved.

A mixin of :class:`~django_cogworker.push.client.Client`, whose ``outbox`` (outbox/store.py's
Outbox, or None: OUTBOX off) does the database's part; nothing here imports Django's models.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import is_unavailable
from ..push import payload as payloads
from . import units

logger = logging.getLogger(__name__)


class OutboxPushes:
    """What the Client does for the outbox (see the module's docstring)."""

    outbox: Any
    # (The Client's own.)
    _collect: Callable[[Sequence[dict[str, Any]]], Sequence[dict[str, Any]]]
    _write_bulk: Callable[..., Sequence[dict[str, Any]]]
    _writer_of: Callable[[dict[str, Any]], Any]
    _write_own: Callable[..., Any]
    _writers: Sequence[Any]

    def _outbox_alias(self, on_commit: bool) -> str | None:
        """The database whose transaction a push waiting for commit becomes a row of; None: no outbox."""
        if not on_commit or self.outbox is None:
            return None
        return self.outbox.atomic_alias()

    def _stash(self, alias: str, items: Sequence[dict[str, Any]], at: float | None = None) -> list[str]:
        """Write ``items``, as the middleware lets them through, to the outbox in the transaction
        open on database ``alias``; return their jids. The middleware runs now, in the pushing
        thread (what it reads of the request is there), and the rows hold what it let through:
        the outbox hands them to :meth:`hand_over` at commit, or a relay does later."""
        if at is not None:
            for item in items:
                item["at"] = float(at)
        batch = self._collect(items)
        for item in batch:
            payloads.check_outgoing(item)
        if batch:
            self.outbox.stash(alias, batch, self.hand_over)
        return [item["jid"] for item in batch]

    def _record_in_batch(self, scope: Any, items: Sequence[dict[str, Any]], at: float | None) -> list[str]:
        """Record ``items`` (their jids and bid set) as jobs of the batch whose ``jobs()`` block is
        being recorded for the outbox (outbox/units.py); return the jids the middleware let through.
        The middleware runs now, as for any outbox push; the batch counts them when the unit runs."""
        if at is not None:
            for item in items:
                item["at"] = float(at)
        batch = list(self._collect(items))
        for item in batch:
            payloads.check_outgoing(item)
        scope.record_jobs(batch)
        return [item["jid"] for item in batch]

    def hand_over(self, items: Sequence[dict[str, Any]]) -> Sequence[dict[str, Any]]:
        """Write outbox jobs (their middleware already run) with their marks: one pushed before
        (its mark still there) isn't written again; run outbox units (a batch's block: units.py).
        Return the jobs written; raise what Redis refused."""
        if not any(units.is_unit(item) for item in items):
            return self._write_marked(items)
        written = self._write_marked([item for item in items if not units.is_unit(item)])
        for item in items:
            if units.is_unit(item):
                units.run(self, item)
        return written

    def _write_marked(self, items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Write outbox jobs with their marks: the plain ones in one PUSH, those a feature writes
        itself (a push that collapses: declarations.py ``Writer``) each through its writer, which
        keeps the same mark (a relay pushing a row again writes nothing). Return the jobs written or
        collapsed (a throttled push dropped was handed over all the same); not those whose mark said
        they were handed over before (a "dropped" naming the job itself: the relay says so)."""
        own = [(item, w) for item in items if (w := self._writer_of(item)) is not None] if self._writers else []
        if not own:
            return list(self._write_bulk(items, marked=True))
        taken = {id(item) for item, _w in own}
        plain = [item for item in items if id(item) not in taken]
        written = list(self._write_bulk(plain, marked=True)) if plain else []
        for item, w in own:
            said = self._write_own(w, item, marked=True)
            if said.status != "dropped" or said.jid != item["jid"]:
                written.append(item)
        return written

    def _write_or_save(self, items: Sequence[dict[str, Any]]) -> Sequence[dict[str, Any]]:
        """Write ``items`` as outbox jobs (marked); when Redis is away or refuses writes for now,
        save them to the outbox instead (autocommit), for a relay. Raise only what neither took."""
        kept = [dict(item) for item in items]  # (as given: the write pops "at")
        try:
            return self._write_marked(items)
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            try:
                self.outbox.save(kept)
            except Exception as db_exc:
                logger.error("push of %d job(s) refused by Redis (%s: %s) and by the database (%s: %s)",
                             len(items), type(exc).__name__, exc, type(db_exc).__name__, db_exc)
                raise exc from db_exc
            logger.warning("Redis refused a push (%s: %s): %d job(s) saved to the outbox, relayed when it is "
                           "back", type(exc).__name__, exc, len(items))
            return items
