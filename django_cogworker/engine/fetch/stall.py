"""The stall watch: whether a job this process took may have been taken back while it was silent.

Other processes take this one for dead once its last beat is older than ORPHAN_THRESHOLD, and
orphan recovery requeues its in-progress list, jobs taken ahead included, for them to run. A
process that stalled that long (a frozen VM, SIGSTOP, a partition from Redis) and then woke ran
those jobs too: they ran twice, where only the ones it was running may.

Each beat whose stamp went through vouches for this process until ``sent + term`` (``sent``: when
the beat asked Redis for its time; others count the threshold from that time, so never from later).
A beat that lands after the previous one's term ran out marks a lapse: any job taken before it may
have been requeued elsewhere. Such a job, or any job while the term has run out, starts only once
the fetch has found it still its own (:meth:`~.contract.Fetch.still_ours`); on the way of every
other job this costs one clock read and two comparisons.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable

# Counting a suspended host's sleep too (CLOCK_BOOTTIME, Linux): others' clocks ran on meanwhile.
clock: Callable[[], float] = (functools.partial(time.clock_gettime, time.CLOCK_BOOTTIME)
                              if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic)
# The share of ORPHAN_THRESHOLD a beat vouches for: the rest absorbs the drift between this
# host's clock and Redis's, against which the others judge.
TERM_SHARE = 0.9


class StallWatch:
    """The time until which this process can't have been taken for dead, and when that last lapsed.

    Built by the fetch (:class:`~.contract.Fetch`), one per process. The heartbeat thread calls
    ``stamped`` after each beat whose stamp went through; the processor threads call ``covers``
    (through the fetcher's hand-over) for each job they take. No lock: two floats, each written by
    the heartbeat alone, ``lapsed`` before ``until``, so a reader that sees the new term sees the
    lapse too.
    """

    def __init__(self, orphan_threshold: float, clock: Callable[[], float] = clock):
        self.term = orphan_threshold * TERM_SHARE
        self.clock = clock
        # Nothing is vouched for before the first beat; and with an endless term (a fetch whose
        # jobs no one else can take back), always.
        self.until = math.inf if self.term == math.inf else -math.inf
        self.lapsed = -math.inf  # a job taken at or before this may have been taken back

    def stamped(self, sent: float) -> None:
        """A beat asked for Redis's time at ``sent`` (this clock), and its stamp went through."""
        now = self.clock()
        if now >= self.until:
            self.lapsed = now  # (first: see the class docstring)
        self.until = sent + self.term

    def covers(self, taken: float) -> bool:
        """Whether a job taken at ``taken`` (this clock, before the fetch was sent) is surely still ours."""
        return taken > self.lapsed and self.clock() < self.until
