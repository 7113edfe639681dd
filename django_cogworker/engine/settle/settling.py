"""The Settler: applies settlements on their own, keeps those Redis refused, and hands over at shutdown.

A finished job is settled once, by its :class:`~.settlement.Settlement`: its features' steps, then
its ack or its filing in retry or dead (atomically with the ack: the fetch's ``file``). Most acks
ride the fetcher's round trips (queue.py); what can't wait, or finds no fetch to ride, is applied
here alone: one settlement (``settle``), or those held, together (``settle_many``: one round trip
per runner for the steps, one for the acks). One Redis refuses (away, or a key of the wrong type)
is kept in memory as a **pending settlement**, what is left of it (the steps not taken, then its
end), and tried again on each beat: the job already ran, so that path never puts it back to run.

At shutdown (``Settler.requeue_unfinished``) a filing that still fails is
parked in ``unsettled`` for any live process to file
(:func:`file_unsettled`, from the poller's housekeeping round): never requeued, the job already ran.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...broker import scripts
from ...broker.keys import Keys
from ...broker.types import RedisClient
from ...errors import is_unsendable
from ...push import payload as payloads
from ..fetch.contract import Fetch, Unit
from .retry import Filing, RetryPolicy
from .settlement import ACK, Item, Settlement, StepRunner, jid_of

logger = logging.getLogger(__name__)

UNSETTLED_BATCH = 100  # unsettled records filed per housekeeping round at most


class Settler:
    """Applies settlements through the fetch, and keeps those Redis refused until it takes them.

    Created by the Manager with the fetch, the retry policy (the dead set's trim), the features'
    ``requeued`` hooks (``run_hook``: engine/run/factories.py's ``requeue_hook``, which the Launcher
    builds) and their step runners. No thread of its own: the settlement queue calls
    ``settle`` and ``settle_many`` (on a processor's thread, or the fetcher's) and ``pend`` (what a
    fetch's round trip didn't carry), the heartbeat thread ``retry_pending_settlements`` on each
    beat, and the main thread ``requeue_unfinished`` once, from the Manager's ``stop``. Its lock
    guards only the pending settlements, which a job that settles at the first try never touches.
    """

    def __init__(self, fetch: Fetch, retry: RetryPolicy, run_hook: Callable[[dict, str], Any] | None = None,
                 runners: Mapping[type, StepRunner] | None = None):
        self.fetch = fetch
        self.retry = retry
        # The features' steps (a batch step), by their type: each runs before its ack or filing.
        self.runners = dict(runners or {})
        # Told "requeued" for each job handed back at shutdown (an until_executed run keeps its periodic lock).
        self.run_hook = run_hook
        self._lock = threading.Lock()
        # raw payload -> what is left of its settlement: finished, not yet settled in Redis
        self._pending: dict[bytes, Settlement] = {}

    def settle(self, raw: bytes, settlement: Settlement) -> None:
        """Apply one settlement now; if Redis refuses, keep what is left of it and retry on later beats."""
        left, error = self._settle_once(raw, settlement)
        if error is not None:
            self.pend([(raw, left)], error)

    def settle_many(self, items: Sequence[Item]) -> None:
        """Apply several settlements now: their steps grouped by runner (one ``run_many`` each), then
        their acks in one round trip, their filings one by one. What Redis refuses is kept pending."""
        if not items:
            return
        through = self.run_steps(items)
        acks = [raw for raw, settlement in through if settlement.end is ACK]
        for raw, settlement in through:
            if settlement.end is not ACK:
                self.settle(raw, settlement)
        if acks:
            try:
                self.fetch.ack_many(acks)
            except Exception as exc:
                self.pend([(raw, Settlement(ACK)) for raw in acks], exc)

    def pend(self, items: Sequence[Item], error: BaseException | None = None) -> None:
        """Keep ``items`` as pending settlements (``error``: why Redis didn't take them, logged)."""
        if error is not None:
            for raw, settlement in items:
                logger.error("settling jid=%s failed (%s: %s); kept in memory and retried", settlement.jid(raw),
                             type(error).__name__, payloads.printable(error, payloads.ERROR_MESSAGE_LIMIT))
        with self._lock:
            for raw, settlement in items:
                self._pending[raw] = settlement

    def run_steps(self, items: Sequence[Item]) -> list[Item]:
        """Run the steps of ``items``, grouped by runner; return the items whose steps all went
        through, as their end alone. Those Redis refused are kept pending with the steps it refused."""
        groups: dict[type, list[tuple[int, Any]]] = {}
        for i, (_raw, settlement) in enumerate(items):
            for step in settlement.steps:
                groups.setdefault(type(step), []).append((i, step))
        refused: dict[int, list[Any]] = {}
        for group in groups.values():
            try:
                self._runner(group[0][1]).run_many([step for _i, step in group])
            except Exception as exc:
                logger.error("the steps of %d job(s) failed (%s: %s); kept in memory and retried", len(group),
                             type(exc).__name__, payloads.printable(exc, payloads.ERROR_MESSAGE_LIMIT))
                for i, step in group:
                    refused.setdefault(i, []).append(step)
        self.pend([(raw, Settlement(settlement.end, tuple(s for s in settlement.steps
                                                           if any(s is r for r in refused[i]))))
                   for i, (raw, settlement) in enumerate(items) if i in refused])
        return [(raw, Settlement(settlement.end) if settlement.steps else settlement)
                for i, (raw, settlement) in enumerate(items) if i not in refused]

    def _settle_once(self, raw: bytes, settlement: Settlement) -> tuple[Settlement, Exception | None]:
        """Apply ``settlement``; return what is left of it to keep trying and why it failed (None: done).

        Its steps run first, in order; once one went through, what is left is the rest. A filing that
        can't be written as built (:func:`is_unsendable`) is no outage: waiting changes nothing. It is
        filed once more at once, as the payload was fetched with the failure's fields appended
        (:meth:`Filing.as_stored`), so the job still ends in retry or dead with its error.
        """
        steps = settlement.steps
        while steps:
            try:
                self._runner(steps[0]).run(steps[0])
            except Exception as exc:
                return Settlement(settlement.end, steps), exc
            steps = steps[1:]
        end = settlement.end
        try:
            self._apply(raw, end)
            return Settlement(end), None
        except Exception as exc:
            if not (isinstance(end, Filing) and end.text is None and is_unsendable(exc)):
                return Settlement(end), exc
            unsendable = exc
        try:
            end = end.as_stored(raw)
        except Exception as exc:  # (raw that isn't a JSON object: the processor buries those itself)
            logger.error("jid=%s could not be filed (%s: %s), nor as it was fetched (%s)", settlement.jid(raw),
                         type(unsendable).__name__, payloads.printable(unsendable), payloads.printable(exc))
            return Settlement(end), unsendable
        logger.error("jid=%s could not be filed as built (%s: %s); filed as it was fetched, with its error",
                     settlement.jid(raw), type(unsendable).__name__, payloads.printable(unsendable))
        try:
            self._apply(raw, end)
            return Settlement(end), None
        except Exception as exc:
            return Settlement(end), exc

    def _runner(self, step: Any) -> StepRunner:
        runner = self.runners.get(type(step))
        if runner is None:
            raise RuntimeError(f"no runner for a {type(step).__name__} step (its feature is not installed)")
        return runner

    def _apply(self, raw: bytes, end: Any) -> None:
        if isinstance(end, Filing):
            self.fetch.file(raw, end, self.retry.dead_trim() if end.target == "dead" else None)
        else:
            self.fetch.ack_many([raw])  # (every ack sent alone goes this one way)

    def pending_settlements(self) -> dict[bytes, Settlement]:
        """raw payload -> its settlement, for each finished job Redis hasn't taken yet."""
        with self._lock:
            return dict(self._pending)

    def retry_pending_settlements(self) -> int:
        """One more try at every pending settlement; return how many are still pending."""
        for raw, settlement in self.pending_settlements().items():
            left, error = self._settle_once(raw, settlement)
            with self._lock:
                if self._pending.get(raw) is not settlement:
                    continue
                if error is None:
                    del self._pending[raw]
                else:
                    self._pending[raw] = left
            if error is not None:
                logger.warning("pending settlement of jid=%s still fails: %s", settlement.jid(raw),
                               payloads.printable(error, payloads.ERROR_MESSAGE_LIMIT))
        return len(self._pending)

    def requeue_unfinished(self, unfinished: list[Unit]) -> int:
        """Hand back what didn't finish; settle or hand over what did. Never raises.

        Jobs that finished but aren't settled are still on the in-progress list.
        One more try at settling them first; then the acks that still fail are
        dropped in the same atomic step as requeueing the rest (a separate ack
        pass that failed used to leave finished jobs to be requeued and run
        again). Failures that can't be filed even now are handed to
        ``unsettled`` for any live process to file later: never requeued, they
        already ran. What can't even be handed over stays on the list
        (``keep``) for orphan recovery once this process is gone.
        """
        try:
            self.retry_pending_settlements()
            pending = self.pending_settlements()
            # (A job whose step still fails stays for orphan recovery: acked or filed without it, its
            # batch would wait for it for ever.)
            keep = [raw for raw, left in pending.items() if left.steps]
            keep += self._park_unsettled({raw: left.end for raw, left in pending.items()
                                          if not left.steps and isinstance(left.end, Filing)})
            acks = [raw for raw, left in pending.items() if not left.steps and left.end is ACK]
            moved = self.fetch.requeue(unfinished, acks=acks, keep=keep)
            self._tell_requeued(unfinished)
            with self._lock:
                for raw in acks:
                    self._pending.pop(raw, None)
            if moved:
                logger.warning("requeued %d job(s) unfinished at shutdown: %s", moved, _jids(unfinished))
            return moved
        except Exception:
            logger.exception("requeueing unfinished jobs failed; they stay on %s for orphan recovery",
                             self.fetch.in_progress)
            return 0

    def _tell_requeued(self, units: list[Unit]) -> None:
        """Run the hook for jobs handed back (an until_executed run keeps its periodic lock while queued)."""
        if self.run_hook is None:
            return
        for unit in units:
            try:
                self.run_hook(payloads.decode(unit.raw), "requeued")
            except Exception as exc:
                logger.warning("requeue hook failed: %s: %s", type(exc).__name__, exc)

    def _park_unsettled(self, unfiled: dict[bytes, Filing]) -> list[bytes]:
        """Move each filing to ``unsettled`` (off the in-progress list); return those that stay on it."""
        keys, keep = self.fetch.keys, []
        for raw, filing in unfiled.items():
            try:
                record = payloads.encode({"target": filing.target, "score": filing.score, "payload": filing.raw()})
                self.fetch.park(raw, keys.unsettled, record)
            except Exception as exc:
                logger.error("could not hand jid=%s over to %s (%s); left for orphan recovery",
                             payloads.printable(filing.payload.get("jid")), keys.unsettled, exc)
                keep.append(raw)
                continue
            with self._lock:
                self._pending.pop(raw, None)
        return keep


def _jids(units: list[Unit], cap: int = 20) -> str:
    """"jid=a jid=b ... (and 7 more)": which jobs, capped so thousands handed back don't flood the log."""
    shown = " ".join(f"jid={jid_of(unit.raw)}" for unit in units[:cap])
    return shown + (f" (and {len(units) - cap} more)" if len(units) > cap else "")


def file_unsettled(redis: RedisClient, keys: Keys, retry: RetryPolicy) -> int:
    """File jobs handed over at some process's shutdown (they ran; never requeued); return how many.

    Up to UNSETTLED_BATCH records of ``unsettled``, each by FILE_UNSETTLED (0 when another
    process filed it first). An unreadable record is logged and left in place
    for a human: dropping it would lose a job that ran and failed.
    """
    filed = 0
    below, cap = retry.dead_trim()
    for record in redis.lrange(keys.unsettled, 0, UNSETTLED_BATCH - 1):
        try:
            entry = json.loads(record)
            target = keys.filed_in(entry["target"]) if entry["target"] in ("dead", "schedule") else keys.retry
            trim = (below, cap) if target == keys.dead else ("", "")
            filed += int(scripts.FILE_UNSETTLED(redis, [keys.unsettled, target],
                                                [record, entry["score"], entry["payload"], *trim]))
        except (ValueError, KeyError, TypeError) as exc:
            logger.error("unreadable unsettled record left in place: %s: %.200r", exc, record)
    return filed
