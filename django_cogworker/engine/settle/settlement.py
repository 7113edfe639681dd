"""What settles a finished job: an ack, a filing, or either behind a feature's step.

A job is settled exactly once, by one :data:`Settlement`:

* :data:`ACK`: acknowledged (a success; a job dropped unrun; a failure a death handler discarded);
* a :class:`~.retry.Filing`: filed in retry, dead or the schedule, atomically with its ack;
* a :class:`Staged`: a step a feature must see through first (a batch step), then its ``then``
  (the ack or the filing). A feature says how its steps run through a :class:`StepRunner`, which
  the Settler looks up by the step's type: the core names no feature.

A step that is ``holdable`` (its job succeeded, nothing but the step to write first) may wait with
the acks for the fetcher's next round trip, where the steps held are run together, grouped by
runner (engine/settle/settling.py's AckBatch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal, Protocol, Union, runtime_checkable

from .retry import Filing

Ack = Literal["ack"]
ACK: Final[Ack] = "ack"


@runtime_checkable
class Staged(Protocol):
    """A feature's step, settled before ``then``; ``jid`` names the job in log lines."""

    @property
    def jid(self) -> str: ...

    @property
    def then(self) -> Ack | Filing: ...

    @property
    def holdable(self) -> bool: ...


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


Settlement = Union[Ack, Filing, Staged]  # noqa: UP007 - (a Protocol and a Literal: the | form needs a string)
