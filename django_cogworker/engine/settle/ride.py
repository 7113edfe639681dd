"""What rides one fetch's round trip: the acks held for it and the features' held steps.

Made by :meth:`~.settling.AckBatch.ride` for each fetch of a fetch that ``rides``
(engine/fetch/reliable.py): the steps are queued on the fetch's pipeline before its script, and
their replies handed back; see :class:`Ride`.
"""

from __future__ import annotations

import logging
from typing import Any

from ...push import payload as payloads
from .settlement import Staged

logger = logging.getLogger(__name__)


class Ride:
    """What rides one fetch's round trip: ``acks`` (in the fetch script's own arguments) and the
    held steps of riding runners (queued on the fetch's pipeline before the script).

    The fetch calls ``queue(pipe)`` before its script and ``landed(replies)`` with the steps'
    replies, or ``failed()`` if the round trip didn't happen; a fetch that can't pipeline calls
    ``run_alone()`` first. An unordered step's ack (a limit's release, then ACK) is in ``acks``
    already; an ordered step's (a batch step) is held again once it landed, for the next fetch, so a
    step always goes through before its job's ack. Steps Redis refused become pending settlements,
    as with ``AckBatch.take``.
    """

    def __init__(self, batch: Any, acks: list[bytes], steps: list[tuple[bytes, Staged]]):
        # (``batch``: the AckBatch that made it, acks.py; not imported here, as it imports this module.)
        self.batch = batch
        self.steps = steps
        self._plain = acks
        self._done = False  # (landed, failed or run alone: what became of the steps is settled)
        self._groups: list[tuple[Any, list[tuple[bytes, Staged]], int]] = []
        by_type: dict[type, list[tuple[bytes, Staged]]] = {}
        for raw, step in steps:
            by_type.setdefault(type(step), []).append((raw, step))
        runners = batch.settler.runners
        self._groups = [(runners[kind], group, 0) for kind, group in by_type.items()]
        # (Unordered steps that wrap the ack itself: their acks ride now.)
        self.acks = acks + [raw for runner, group, _n in self._groups if not runner.ordered
                            for raw, step in group if isinstance(step.then, str)]

    def __bool__(self) -> bool:
        return bool(self.steps)

    @property
    def done(self) -> bool:
        return self._done or not self.steps

    def queue(self, pipe: Any) -> int:
        """Queue every step's commands on ``pipe``; return how many replies they will have."""
        queued = 0
        for i, (runner, group, _n) in enumerate(self._groups):
            n = runner.queue(pipe, [step for _raw, step in group])
            self._groups[i] = (runner, group, n)
            queued += n
        return queued

    def landed(self, replies: list[Any]) -> None:
        """The steps' replies, in the order queued: each runner's checked; what is left of each
        settlement held again (or pending, where its runner says Redis refused it)."""
        self._done = True
        at = 0
        for runner, group, n in self._groups:
            try:
                runner.landed([step for _raw, step in group], replies[at:at + n])
            except Exception as exc:
                self._pend(group, exc)
            else:
                for raw, step in group:
                    if runner.ordered or not isinstance(step.then, str):
                        self.batch.hold_again(raw, step.then)
            at += n

    def failed(self, exc: BaseException) -> None:
        """The round trip didn't happen: every step is kept pending (its ack behind it)."""
        if self._done:
            return
        self._done = True
        for _runner, group, _n in self._groups:
            self._pend(group, exc)

    def run_alone(self) -> list[bytes]:
        """For a fetch that can't pipeline: run the steps now (AckBatch.take's way); every ack to send."""
        self._done = True
        steps, self.steps, self._groups = self.steps, [], []
        self.acks = self.batch._after_steps(self._plain, steps) if steps else self._plain
        return self.acks

    def _pend(self, group: list[tuple[bytes, Staged]], exc: BaseException) -> None:
        settler = self.batch.settler
        logger.error("the steps of %d job(s) failed (%s: %s); kept in memory and retried", len(group),
                     type(exc).__name__, payloads.printable(exc, payloads.ERROR_MESSAGE_LIMIT))
        with settler._lock:
            for raw, step in group:
                settler._pending[raw] = step
