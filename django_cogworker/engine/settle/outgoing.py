"""What goes out on one fetch's round trip: the acks in its script's arguments, the held steps on its pipeline.

Made by the settlement queue (queue.py) for each fetch, handed to ``Fetch.retrieve`` and back to
the queue once the call returned or failed (:meth:`~.queue.SettlementQueue.sent`). The fetch
reads ``acks`` (the raw payloads to acknowledge with the fetch's own script) and, when it can
pipeline (``Fetch.rides``), calls ``queue(pipe)`` before its script and ``landed(replies)`` with
the steps' replies. What became of each step is kept here, for the queue to read: nothing else
is written.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ...push import payload as payloads
from .settlement import Item, RidingRunner, Settlement

logger = logging.getLogger(__name__)


class Outgoing:
    """One fetch's outgoing settlements: ``acks`` (acks ready to go, their steps done or riding with
    them) and ``riding`` (held settlements whose steps ride the fetch's pipeline).

    A settlement whose steps are all unordered (a limit's release) has its ack in ``acks`` too: it
    goes with its steps. One with an ordered step (a batch's) keeps its ack for the next fetch,
    once its steps are known to have landed (``landed_items``): a step always goes through before
    its job's ack.
    """

    __slots__ = ("acks", "riding", "refused", "_groups", "_landed", "_with_ack")

    def __init__(self, acks: Sequence[bytes] = (), riding: Sequence[Item] = (),
                 runners: Mapping[type, Any] | None = None):
        self.acks = list(acks)
        self.riding = list(riding)
        # What Redis refused: the index in ``riding`` -> (the steps it refused, why).
        self.refused: dict[int, tuple[list[Any], BaseException]] = {}
        self._landed = False
        # The steps by runner, in one pass (a fetch carries a step or more for each of its jobs):
        # (runner, [(index in riding, step)], the steps alone, how many replies it queued).
        runners = runners or {}
        by_type: dict[type, list[tuple[int, Any]]] = {}
        self._with_ack: set[int] = set()
        for i, (raw, settlement) in enumerate(self.riding):
            ordered = False
            for step in settlement.steps:
                kind = type(step)
                group = by_type.get(kind)
                if group is None:
                    group = by_type[kind] = []
                group.append((i, step))
                ordered = ordered or runners[kind].ordered
            if not ordered:
                self._with_ack.add(i)
                self.acks.append(raw)
        self._groups: list[tuple[RidingRunner, list[tuple[int, Any]], list[Any], int]] = [
            (runners[kind], group, [step for _i, step in group], 0) for kind, group in by_type.items()]

    def __bool__(self) -> bool:
        return bool(self.acks or self.riding)

    @property
    def done(self) -> bool:
        """Whether the riding steps have been sent (landed or refused): none left to send alone."""
        return self._landed or not self.riding

    def queue(self, pipe: Any) -> int:
        """Queue every riding step's commands on ``pipe``; return how many replies they will have."""
        queued = 0
        for i, (runner, group, steps, _n) in enumerate(self._groups):
            n = runner.queue(pipe, steps)
            self._groups[i] = (runner, group, steps, n)
            queued += n
        return queued

    def landed(self, replies: Sequence[Any]) -> None:
        """The steps' replies, in the order queued: each runner's checked; what it refused noted."""
        self._landed = True
        at = 0
        for runner, group, steps, n in self._groups:
            try:
                runner.landed(steps, replies[at:at + n])
            except Exception as exc:
                self.failed_group(group, exc)
            at += n

    def run_alone(self) -> None:
        """For a fetch that can't carry them after all (every queue paused): run the steps now, one
        round trip per runner, before the acks go."""
        if self._landed:
            return
        self._landed = True
        for runner, group, steps, _n in self._groups:
            try:
                runner.run_many(steps)
            except Exception as exc:
                self.failed_group(group, exc)

    def failed(self, exc: BaseException) -> None:
        """The round trip carrying the steps didn't happen: every step not landed is refused."""
        if self._landed:
            return
        self._landed = True
        for _runner, group, _steps, _n in self._groups:
            self.failed_group(group, exc)

    def failed_group(self, group: list[tuple[int, Any]], exc: BaseException) -> None:
        logger.error("the steps of %d job(s) failed (%s: %s); kept in memory and retried", len(group),
                     type(exc).__name__, payloads.printable(exc, payloads.ERROR_MESSAGE_LIMIT))
        for i, step in group:
            self.refused.setdefault(i, ([], exc))[0].append(step)

    def outcome(self) -> tuple[list[Item], list[Item]]:
        """Once landed: (the riding settlements whose ack is still to send, what is left of those
        Redis refused: their steps not taken, then their end)."""
        later: list[Item] = []
        left: list[Item] = []
        for i, (raw, settlement) in enumerate(self.riding):
            refused = self.refused.get(i)
            if refused is not None:
                steps = [step for step in settlement.steps if any(step is r for r in refused[0])]
                left.append((raw, Settlement(settlement.end, tuple(steps))))
            elif i not in self._with_ack:  # (ordered: its ack on the next fetch)
                later.append((raw, Settlement(settlement.end)))
        return later, left
