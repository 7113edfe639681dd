"""Settling finished jobs: acks, filings in retry/dead, what is pending, and the hand-off at shutdown.

A finished job is settled once: acknowledged (success, or discarded with
``dead=False``) or filed in retry or dead atomically with its ack (the fetch's
``file``). A settle that fails (Redis away, or refusing: a key of the wrong
type) is kept in memory as a **pending settlement** and retried on each beat:
the job already ran, so that path never puts it back to run again.

Acks held for the fetch's round trip, and the features' steps held with them, are acks.py's
(:class:`~.acks.AckBatch`); what rides one fetch is ride.py's.

At shutdown (``Settler.requeue_unfinished``) a filing that still fails is
parked in ``unsettled`` for any live process to file
(:func:`file_unsettled`, from the poller's housekeeping round): never requeued, the job already ran.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ...broker import scripts
from ...broker.keys import Keys
from ...broker.types import RedisClient
from ...errors import is_unsendable
from ...push import payload as payloads
from ..fetch.contract import Fetch, Unit
from .retry import Filing, RetryPolicy
from .settlement import ACK, Ack, Settlement, Staged, StepRunner

logger = logging.getLogger(__name__)

UNSETTLED_BATCH = 100  # unsettled records filed per housekeeping round at most


class Settler:
    """Settles finished jobs through the fetch, and keeps those Redis refused until it takes them.

    Created by the Manager with the fetch, the retry policy (the dead set's
    trim) and the Launcher's run hook. No thread of its own: processor threads
    call ``settle``, the heartbeat thread ``retry_pending_settlements`` on
    each beat, and the main thread ``requeue_unfinished`` once, from the
    Manager's ``stop``. Its lock guards only the pending settlements, which a
    job that settles at the first try never touches.
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
        # raw payload -> its settlement: finished, not yet settled in Redis
        self._pending: dict[bytes, Settlement] = {}

    def settle(self, raw: bytes, how: Settlement) -> None:
        """Ack or file a finished job; if Redis refuses, remember it and retry on later beats."""
        how, error = self._settle_once(raw, how)
        if error is not None:
            logger.error("settling jid=%s failed (%s: %s); kept in memory and retried",
                         _jid(how, raw), type(error).__name__, payloads.printable(error, payloads.ERROR_MESSAGE_LIMIT))
            with self._lock:
                self._pending[raw] = how

    def _settle_once(self, raw: bytes, how: Settlement) -> tuple[Settlement, Exception | None]:
        """Apply ``how``; return the settlement to keep trying (None when done) and why it failed.

        A filing that can't be written as built (:func:`is_unsendable`) is no outage: waiting changes
        nothing. It is filed once more at once, as the payload was fetched with the failure's fields
        appended (:meth:`Filing.as_stored`), so the job still ends in retry or dead with its error.

        A Staged settlement runs its step first; once that went through, what is left to keep trying
        is its ack or filing alone.
        """
        while not isinstance(how, (str, Filing)):  # (a step, maybe wrapping another: each in turn)
            try:
                self._runner(how).run(how)
            except Exception as exc:
                return how, exc
            how = how.then
        try:
            self._apply(raw, how)
            return how, None
        except Exception as exc:
            if not (isinstance(how, Filing) and how.text is None and is_unsendable(exc)):
                return how, exc
            unsendable = exc
        try:
            how = how.as_stored(raw)
        except Exception as exc:  # (raw that isn't a JSON object: the processor buries those itself)
            logger.error("jid=%s could not be filed (%s: %s), nor as it was fetched (%s)", _jid(how, raw),
                         type(unsendable).__name__, payloads.printable(unsendable), payloads.printable(exc))
            return how, unsendable
        logger.error("jid=%s could not be filed as built (%s: %s); filed as it was fetched, with its error",
                     _jid(how, raw), type(unsendable).__name__, payloads.printable(unsendable))
        try:
            self._apply(raw, how)
            return how, None
        except Exception as exc:
            return how, exc

    def _runner(self, step: Staged) -> StepRunner:
        runner = self.runners.get(type(step))
        if runner is None:
            raise RuntimeError(f"no runner for a {type(step).__name__} step (its feature is not installed)")
        return runner

    def _apply(self, raw: bytes, how: Ack | Filing) -> None:
        if isinstance(how, Filing):
            self.fetch.file(raw, how, self.retry.dead_trim() if how.target == "dead" else None)
        else:
            self.fetch.ack(raw)

    def settle_steps(self, steps: list[tuple[bytes, Staged]]) -> list[bytes]:
        """Run the held steps of finished jobs (see AckBatch.add), one ``run_many`` per runner, in as
        many round trips; return the raw payloads whose steps went through, whose acks may go now. If
        Redis refuses a runner's, each of its steps is kept as a pending settlement instead: the step,
        then its ack."""
        through: list[bytes] = []
        while steps:  # (a step wrapping another: the inner ones in a round of their own after)
            by_type: dict[type, list[tuple[bytes, Staged]]] = {}
            for raw, step in steps:
                by_type.setdefault(type(step), []).append((raw, step))
            steps = []
            for group in by_type.values():
                try:
                    self._runner(group[0][1]).run_many([step for _raw, step in group])
                except Exception as exc:
                    logger.error("the steps of %d job(s) failed (%s: %s); kept in memory and retried", len(group),
                                 type(exc).__name__, payloads.printable(exc, payloads.ERROR_MESSAGE_LIMIT))
                    with self._lock:
                        for raw, step in group:
                            self._pending[raw] = step
                    continue
                for raw, step in group:
                    if isinstance(step.then, str):
                        through.append(raw)
                    else:
                        steps.append((raw, step.then))  # type: ignore[arg-type]  # (holdable: a step)
        return through

    def settle_acks(self, acks: list[bytes]) -> None:
        """Send ``acks`` in one round trip; if that fails, keep them as pending settlements."""
        if not acks:
            return
        try:
            self.fetch.ack_many(acks)
        except Exception:
            self.pend_acks(acks, failed=True)

    def pend_acks(self, acks: list[bytes], failed: bool = False) -> None:
        """Keep acks as pending settlements: retried every beat, and dropped atomically at shutdown."""
        if failed:
            for raw in acks:
                logger.error("settling jid=%s failed (its ack didn't reach Redis); kept in memory and retried",
                             _jid("ack", raw))
        if acks:
            with self._lock:
                for raw in acks:
                    self._pending[raw] = ACK

    def pending_settlements(self) -> dict[bytes, Settlement]:
        """raw payload -> its settlement, for each finished job Redis hasn't taken yet."""
        with self._lock:
            return dict(self._pending)

    def retry_pending_settlements(self) -> int:
        """One more try at every pending settlement; return how many are still pending."""
        for raw, how in self.pending_settlements().items():
            settled, error = self._settle_once(raw, how)
            with self._lock:
                if self._pending.get(raw) is not how:
                    continue
                if error is None:
                    del self._pending[raw]
                else:
                    self._pending[raw] = settled
            if error is not None:
                logger.warning("pending settlement of jid=%s still fails: %s", _jid(how, raw),
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
            keep = [raw for raw, how in pending.items() if not isinstance(how, (str, Filing))]
            keep += self._park_unsettled({raw: how for raw, how in pending.items() if isinstance(how, Filing)})
            acks = [raw for raw, how in pending.items() if how == ACK]
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


def _jid(how: Settlement, raw: bytes) -> str:
    """The job's jid, for a log line."""
    if isinstance(how, Filing):
        return payloads.printable(how.payload.get("jid"))
    if not isinstance(how, str):
        return payloads.printable(how.jid)
    try:
        return payloads.printable(json.loads(raw).get("jid"))
    except Exception:
        return "?"


def _jids(units: list[Unit], cap: int = 20) -> str:
    """"jid=a jid=b ... (and 7 more)": which jobs, capped so thousands handed back don't flood the log."""
    shown = " ".join(f"jid={_jid('ack', unit.raw)}" for unit in units[:cap])
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
