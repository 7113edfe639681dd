"""The settlement queue: finished jobs' settlements, held for the fetcher's next round trip.

Every settlement a processor makes goes through :meth:`SettlementQueue.put`. One that can wait (an
ack, its features' steps holdable: settlement.py) is held in memory for the fetcher's next round
trip, which a busy process makes as soon as the processor that finished is idle: about one round
trip per batch of jobs instead of one more per job. The fetcher takes what is held
(:meth:`~SettlementQueue.take`: an :class:`~.outgoing.Outgoing`), hands it to ``Fetch.retrieve``
with the fetch (the acks in the fetch script's arguments, the steps that can ride on its pipeline,
the others run just before it), and tells the queue what became of it (``sent``): what Redis
refused is kept pending by the Settler until it lands; the ack of a job whose ordered step (a
batch's) landed waits for the next fetch, so a step always goes through before its job's ack.

Sent alone, at once, by the Settler: a filing (never held), whatever finishes while the fetcher
waits on an empty queue (``waiting``: what is held goes then too) or while no fetcher runs
(before ``open``, after ``close``), and, once one more would pass the cap, the acks held with no
step left (or, with none, everything held).

The cap bounds the window this widens. A process killed, or taken for dead after a stall, with
settlements still in memory has those finished jobs recovered as orphans and run again: so that this
is never more than one per processor, the settlements held are capped at the concurrency (the
processor whose settlement would be one more sends the acks held itself, in a round trip of its
own; those with steps to go first, or all, when no ack is ready: ``_overflow``).
Without jobs taken ahead it never does: a process holds at most one job per processor, and each
finishes once between two fetches. With them (fetcher.py), as many jobs as there are processors
and places ahead may finish between two fetches: with the defaults (PREFETCH 1, -c 10) a busy
process's processor sends about once per 25 jobs; with more taken ahead per processor, about once
per ``concurrency`` jobs. Steps Redis refuses become pending settlements; a process killed first has
those jobs run again, and their steps, idempotent by jid, move nothing twice.
"""

from __future__ import annotations

import threading

from .outgoing import Outgoing
from .settlement import ACK, Item, Settlement, rides
from .settling import Settler


class SettlementQueue:
    """The settlements of finished jobs on their way to Redis (see the module's header).

    Created by the Manager with the Settler and the cap (the concurrency); a processor called
    without a fetcher (a test, the testing helpers) is given one never opened, which settles at once.
    Processor threads call ``put``. The fetcher thread calls ``open`` when its loop starts and
    ``close`` when it ends, ``take`` before each fetch and ``sent`` after it, ``waiting`` before it
    blocks on an empty queue and ``fetching`` once that returned. The Manager's ``stop`` closes it
    too (a fetcher outliving its join must not hold settlements). Closed, or while the fetcher
    waits, a settlement goes out at once, on the thread that puts it.
    """

    def __init__(self, settler: Settler, cap: int = 0):
        self.settler = settler
        self.cap = cap
        self._lock = threading.Lock()
        self._held: list[Item] = []  # finished, to be settled with the next fetch
        self._open = False
        self._waiting = False
        self._kinds: dict[type, bool | None] = {}  # step type -> how its steps ride (``_rides``)

    def put(self, raw: bytes, settlement: Settlement) -> None:
        """Settle a finished job: with the next fetch if it can wait and the fetcher is fetching,
        else now. Never raises: what Redis refuses is kept pending by the Settler.

        One that would make more than ``cap`` held sends some now instead (``_overflow``).
        """
        with self._lock:
            holding = self._open and not self._waiting and settlement.holdable
            if holding:
                self._held.append((raw, settlement))
                if len(self._held) <= self.cap:
                    return
                items = self._overflow()
        if holding:
            self._send(items)
        else:
            self.settler.settle(raw, settlement)

    def _send(self, items: list[Item]) -> None:
        """Send ``items`` (past the cap) now: in one round trip when every step rides with its ack
        (a limit's release, on a fetch that rides: steps and acks on one pipeline), else through
        the Settler, the steps first. A concurrency limit's every job has a release to send: past
        the cap, its steps and acks went in two round trips."""
        stepped = [item for item in items if item[1].steps]
        if not stepped or not self.settler.fetch.rides or not all(
                self._rides(type(step)) is False for _raw, settlement in stepped for step in settlement.steps):
            self.settler.settle_many(items)
            return
        outgoing = Outgoing([raw for raw, settlement in items if not settlement.steps], stepped,
                            self.settler.runners)
        try:
            self.settler.fetch.send(outgoing)
        except Exception as exc:
            self.sent(outgoing, exc)
        else:
            self.sent(outgoing)

    def _overflow(self) -> list[Item]:
        """Over the cap (the lock held): take what goes now. The acks with no step left (a plain
        job's, or one whose ordered step landed with the last fetch) go alone, in one round trip,
        and the steps held wait for the next fetch, as they would have; with no such ack, everything
        held goes (the steps first, then their acks: two round trips or more).

        Either way at most ``cap`` stay held. A job of a batch keeps its ack one fetch longer than
        its step, so its settlements passed the cap about twice as often as a plain job's, and
        each time the steps and the acks went in round trips of their own.
        """
        acks = [item for item in self._held if not item[1].steps]
        if not acks:
            items, self._held = self._held, []
            return items
        self._held = [item for item in self._held if item[1].steps]
        return acks

    def _rides(self, kind: type) -> bool | None:
        """How a step of type ``kind`` can ride a round trip: None, it can't; else whether it is
        ordered (its ack waits for it to land). Read once per type: a runner never changes its kind."""
        if kind in self._kinds:
            return self._kinds[kind]
        runner = self.settler.runners.get(kind)
        found = bool(getattr(runner, "ordered", True)) if rides(runner) else None
        if runner is not None:  # (a runner not yet given, in a test: asked again)
            self._kinds[kind] = found
        return found

    def open(self) -> None:
        with self._lock:
            self._open = True

    def close(self) -> None:
        """No fetch to ride from now on: what is held goes now, and later settlements at once."""
        with self._lock:
            self._open = False
            items, self._held = self._held, []
        self.settler.settle_many(items)

    def take(self, riding: bool) -> Outgoing:
        """What is held, for the fetch about to be made. ``riding``: the fetch can carry steps on its
        pipeline (``Fetch.rides``); the steps that can't ride it run now, alone, and their jobs'
        acks go with the fetch (those Redis refused stay pending)."""
        with self._lock:
            items, self._held = self._held, []
        if not items:
            return Outgoing()
        runners = self.settler.runners
        acks: list[bytes] = []
        ride: list[Item] = []
        alone: list[Item] = []
        for raw, settlement in items:
            if not settlement.steps:
                acks.append(raw)
            elif riding and all(self._rides(type(step)) is not None for step in settlement.steps):
                ride.append((raw, settlement))
            else:
                alone.append((raw, settlement))
        if alone:
            acks += [raw for raw, _end in self.settler.run_steps(alone)]
        return Outgoing(acks, ride, runners)

    def sent(self, outgoing: Outgoing, error: BaseException | None = None) -> None:
        """The fetch carrying ``outgoing`` returned (``error``: it raised). What Redis refused, or
        never saw, is kept pending; the acks of jobs whose ordered steps landed are held again."""
        if error is not None:
            outgoing.failed(error)
            self.settler.pend([(raw, Settlement(ACK)) for raw in outgoing.acks], error)
        elif not outgoing.done:  # (a fetch that left them: sent now, else their jobs are never acked)
            outgoing.run_alone()
            self.settler.settle_many([(raw, Settlement(ACK)) for raw in outgoing.acks])
        if not outgoing.riding:
            return
        later, left = outgoing.outcome()
        self.settler.pend(left)  # (logged by the Outgoing, group by group)
        with self._lock:
            if self._open and not self._waiting:
                self._held += later
                return
        self.settler.settle_many(later)

    def waiting(self) -> None:
        """The fetcher is about to block on an empty queue: what is held goes now, and later
        settlements at once, until ``fetching``."""
        with self._lock:
            self._waiting = True
            items, self._held = self._held, []
        self.settler.settle_many(items)

    def fetching(self) -> None:
        """The fetcher's wait returned: hold settlements for its next round trip again."""
        with self._lock:
            self._waiting = False

    def held(self) -> list[bytes]:
        """The raw payloads of the jobs whose settlements are held."""
        with self._lock:
            return [raw for raw, _settlement in self._held]
