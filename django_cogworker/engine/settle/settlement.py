"""What settles a finished job: one :class:`Settlement`, an ack or a filing after the features' steps.

A job is settled exactly once, by one value the processor hands on:

* its ``end``: :data:`ACK` (a success; a job dropped unrun; a failure a death handler discarded) or
  a :class:`~.retry.Filing` (filed in retry, dead or the schedule, atomically with its ack);
* its ``steps``: what features must see through first, in the order they run (a batch's step, a
  limit's release). A feature says how its steps run through a :class:`StepRunner`, which the
  Settler looks up by the step's type: the core names no feature.

A settlement whose end is an ack and whose every step is ``holdable`` may wait for the fetcher's
next round trip (queue.py), where those held are sent together: the steps of a :class:`RidingRunner`
on the fetch's own pipeline (outgoing.py), the others just before it, grouped by runner.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Final, Protocol, runtime_checkable

from .retry import Filing


class Ack:
    """The end of a settlement that acknowledges the job (one instance: :data:`ACK`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ACK"

    def __reduce__(self) -> str:
        return "ACK"


ACK: Final = Ack()


@runtime_checkable
class Step(Protocol):
    """A feature's step, seen through before its job's end; ``jid`` names the job in log lines."""

    @property
    def jid(self) -> str: ...

    @property
    def holdable(self) -> bool: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Settlement:
    """How one finished job is settled: ``steps`` in order, then ``end`` (its ack or filing)."""

    end: Ack | Filing
    steps: tuple[Any, ...] = ()  # (each a Step of some feature's type: its runner is found by it)

    def first(self, step: Step) -> Settlement:
        """This settlement with ``step`` to go through before the rest (a feature's ``settling``)."""
        return Settlement(self.end, (step, *self.steps))

    @property
    def holdable(self) -> bool:
        """An ack whose steps may all wait: it may wait for the fetcher's next round trip."""
        return self.end is ACK and all(step.holdable for step in self.steps)

    def jid(self, raw: bytes) -> str:
        """The job's jid, for a log line."""
        from ...push import payload as payloads

        if isinstance(self.end, Filing):
            return payloads.printable(self.end.payload.get("jid"))
        if self.steps:
            return payloads.printable(self.steps[0].jid)
        return jid_of(raw)


Item = tuple[bytes, Settlement]  # (a finished job's raw payload, its settlement)


def jid_of(raw: bytes) -> str:
    """The jid in a payload, for a log line ("?" when it can't be read)."""
    from ...push import payload as payloads

    try:
        return payloads.printable(payloads.decode(raw).get("jid"))
    except Exception:
        return "?"


class StepRunner(Protocol):
    """Runs one feature's steps; raises when Redis refuses (a step is idempotent: run again, it
    moves nothing twice)."""

    def run(self, step: Any) -> None: ...  # (a step of the runner's own type)

    def run_many(self, steps: Sequence[Any]) -> None: ...


class RidingRunner(StepRunner, Protocol):
    """A StepRunner whose steps can ride the fetch's own round trip: queued on its pipeline before
    the fetch script (``queue``, returning how many commands it queued), their replies handed back
    (``landed``: raises when any step didn't go through, which keeps them all pending).

    ``ordered``: the steps must go through before their job's ack (a batch step), so those acks
    ride the next fetch, once the steps are known to have landed; an unordered step (a limit's
    release, which never holds up its job) lets its ack ride the same fetch.
    """

    ordered: bool

    def queue(self, pipe: Any, steps: Sequence[Any]) -> int: ...

    def landed(self, steps: Sequence[Any], replies: Sequence[Any]) -> None: ...


def rides(runner: StepRunner | None) -> bool:
    """Whether ``runner``'s steps can ride a fetch's round trip."""
    return callable(getattr(runner, "queue", None))
