"""The acks of finished jobs held for the fetcher's next round trip (:class:`AckBatch`).

Acks ride on the fetch (:class:`AckBatch`): a finished job's ack waits in
memory for the fetcher's next round trip, which a busy process makes as soon
as the processor that finished is idle: about one round trip per batch
instead of one more per job. While the fetcher blocks (idle), acks go out at
once instead. The window this widens: a process killed, or taken for dead
after a stall, with acks still in memory has those finished jobs recovered as
orphans and run again. So that this is never more than one per processor, the
acks held are capped at the concurrency: the processor whose ack would be one
more sends them all itself, in a round trip of its own. Without jobs taken
ahead it never does: what a process holds is at most one job per processor,
and each finishes once between two fetches. With them (fetcher.py), as many
jobs as there are processors and places ahead may finish between two fetches
(the fetcher waits for what is ahead to run low, and its thread for the GIL):
with the defaults (PREFETCH 1, -c 10) a busy process's processor sends about
once per 25 jobs (a third of its fetches carried more than 10 acks, up to 20);
with more taken ahead per processor, about once per ``concurrency`` jobs.

A job whose settlement is a feature's holdable step (a job of a batch that
succeeded, a limit's release: settlement.py) waits the same way with its step:
a fetch that can carry them queues the steps held on its own pipeline (ride.py);
one that can't runs them, grouped by runner, just before it. Either way each
step goes through before its job's ack.
Steps Redis refuses become pending settlements (the step, then the ack); a
process killed first has those jobs run again, and their steps, idempotent by
jid, move nothing twice.
"""

from __future__ import annotations

import threading
from typing import Any

from ..fetch.contract import Fetch
from .ride import Ride
from .settlement import ACK, Staged
from .settling import Settler


class AckBatch:
    """The acks of finished jobs, held for the fetcher's next round trip (see the module's header).

    Created by the Manager. Processor threads call ``add``. The fetcher
    thread calls ``open`` when its loop starts and ``close`` when it ends,
    ``take`` for each fetch, ``before_block`` (through the fetch) when it is
    about to block and ``unblocked`` once the call returns. The Manager's ``stop`` closes it too
    (a fetcher outliving its join must not hold acks) and pends what is still
    held. Closed, or while the fetcher blocks, an ack goes out at once.

    A job whose settlement is a holdable step is held with it (``add(raw, step)``):
    ``take`` and ``before_block`` run the steps held first (Settler.settle_steps,
    one round trip per feature), and only the acks of those that went through go
    with the rest.

    ``cap``: the most finished jobs held at once (the concurrency; see the module's header).
    """

    def __init__(self, fetch: Fetch, settler: Settler, cap: int):
        self.fetch = fetch
        self.settler = settler
        self.cap = cap
        self._lock = threading.Lock()
        self._held: list[bytes] = []  # finished, to be acked with the next fetch
        self._steps: list[tuple[bytes, Staged]] = []  # finished jobs with a step: step, then ack
        self._open = False
        self._blocking = False

    def add(self, raw: bytes, step: Staged | None = None) -> None:
        """Acknowledge a finished job: with the next fetch if the fetcher runs and isn't blocking, else now.

        ``step``: the job's holdable step (a batch's success without a result to keep), which goes through
        before the ack: just before that fetch, with the others held, or now, with the ack.

        One that would make more than ``cap`` held sends them all now instead, as ``before_block``
        does (the steps first; what Redis refuses is kept pending), without raising.
        """
        with self._lock:
            holding = self._open and not self._blocking
            if holding:
                if step is None:
                    self._held.append(raw)
                else:
                    self._steps.append((raw, step))
                if len(self._held) + len(self._steps) <= self.cap:
                    return
                acks, steps = self._take_held()
        if holding:
            self.settler.settle_acks(self._after_steps(acks, steps))
        else:
            self.settler.settle(raw, ACK if step is None else step)

    def open(self) -> None:
        with self._lock:
            self._open = True

    def close(self) -> None:
        with self._lock:
            self._open = False

    def ride(self) -> Ride:
        """Take what is held for the fetch about to be made: the acks that may go with it, and the
        held steps whose runner can ride its round trip (the others run first, alone, as ``take``
        does). See :class:`Ride`."""
        with self._lock:
            acks, steps = self._take_held()
        riding: list[tuple[bytes, Staged]] = []
        alone: list[tuple[bytes, Staged]] = []
        for raw, step in steps:
            (riding if getattr(self.settler.runners.get(type(step)), "queue", None) else alone).append((raw, step))
        return Ride(self, self._after_steps(acks, alone) if alone else acks, riding)

    def hold_again(self, raw: bytes, then: Any) -> None:
        """What is left of a settlement whose step went through on a fetch: its ack (or inner step),
        held for the next."""
        with self._lock:
            if isinstance(then, str):
                self._held.append(raw)
            else:
                self._steps.append((raw, then))

    def take(self) -> list[bytes]:
        """Take the held acks, for the fetch about to be made (or, at stop, to pend them); the held
        batch steps are run first, and the acks of those Redis refused stay pending behind them."""
        with self._lock:
            acks, steps = self._take_held()
        return self._after_steps(acks, steps)

    def before_block(self) -> None:
        """The fetcher is about to block: acks from now on go out at once, and so do any held (the
        held batch steps first)."""
        with self._lock:
            self._blocking = True
            acks, steps = self._take_held()
        acks = self._after_steps(acks, steps)
        if acks:
            try:
                self.fetch.ack_many(acks)
            except Exception:
                self.settler.pend_acks(acks, failed=True)
                raise

    def unblocked(self) -> None:
        """The fetcher's call returned: hold acks for its next round trip again."""
        with self._lock:
            self._blocking = False

    def _take_held(self) -> tuple[list[bytes], list[tuple[bytes, Staged]]]:
        """Empty what is held (under the lock): the plain acks, and the batch steps with theirs."""
        acks, self._held = self._held, []
        steps, self._steps = self._steps, []
        return acks, steps

    def _after_steps(self, acks: list[bytes], steps: list[tuple[bytes, Staged]]) -> list[bytes]:
        """Run the batch steps (one round trip); return ``acks`` and the acks of those that went through."""
        return acks + self.settler.settle_steps(steps) if steps else acks

    def held(self) -> list[bytes]:
        with self._lock:
            return [*self._held, *(raw for raw, _step in self._steps)]
