"""Iterable jobs that record every item they do in a file (issue 45's worker fault tests,
tests/workers/test_iteration_workers.py): TERMed, killed -9, throttled, cancelled, failing once.

Each writes to the file ``path`` (its first argument) one line per item done, "<jid> <item>", and
one per hook, "<jid> start", "<jid> resume@<cursor>", "<jid> stop", "<jid> complete", "<jid> cancel":
one ``write`` on an O_APPEND descriptor each, as FileMarkJob does, so lines of concurrent runs never
interleave, and no Redis: what a kill -9 of a worker (or of Redis) leaves behind is on disk, and a
test counts repeats from it (:func:`read_marks`). An item is written once it is done (after its
``seconds`` of work): an item cut short by a kill is not in the file, one done twice is there twice.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django_cogworker import IterableJob

from .marks import append_line

HOOKS = ("start", "stop", "complete", "cancel")


class MarkedWalk(IterableJob):
    """Walk ``range(n)``: each item sleeps ``seconds``, then writes "<jid> <item>" to ``path``.

    Saves its cursor every 50 items (and every ITERATION_CHECKPOINT seconds, whichever comes
    first): a kill -9 has at most 50 items done again."""

    checkpoint_every = 50
    retry = 3

    def build_enumerator(self, path, n, seconds=0.0, *extra, cursor=None):
        return self.range_enumerator(n, cursor=cursor)

    def each_iteration(self, number, path, n, seconds=0.0, *extra):
        if seconds:
            time.sleep(seconds)
        append_line(path, f"{self.jid} {number}")

    def retry_in(self, count, exc):
        return 0  # (due at once: a test of a retry waits for nothing else)

    def _mark(self, what: str) -> None:
        append_line(self.payload["args"][0], f"{self.jid} {what}")

    def on_start(self):
        self._mark("start")

    def on_resume(self):
        self._mark(f"resume@{self.cursor}")

    def on_stop(self):
        self._mark("stop")

    def on_complete(self):
        self._mark("complete")

    def on_cancel(self):
        self._mark("cancel")


def _held(job: Any) -> bool:
    return os.path.exists(job.payload["args"][0] + ".hold")


class ThrottledWalk(MarkedWalk):
    """MarkedWalk that, once item ``hold_at`` is done, creates ``<path>.hold``; while that file
    exists its throttle holds: it goes back to the schedule for 1 s at a time (the shortest backoff), its thread given
    back. The test removes the file to let it go on."""

    throttle_on = [(_held, 1.0)]

    def each_iteration(self, number, path, n, seconds=0.0, hold_at=None):
        super().each_iteration(number, path, n, seconds)
        if number == hold_at:
            append_line(path + ".hold", "held")


class TurnsWalk(MarkedWalk):
    """MarkedWalk that goes back to its queue after 0.2 s of iterating (max_iteration_runtime)."""

    max_iteration_runtime = 0.2


class FailOnceWalk(MarkedWalk):
    """MarkedWalk whose item ``fail_at`` raises the first time it is tried (``<path>.failed``
    marks that it did), before it is written; its retry is due at once (retry_in)."""

    def each_iteration(self, number, path, n, seconds=0.0, fail_at=None):
        if number == fail_at and not os.path.exists(path + ".failed"):
            append_line(path + ".failed", "failed")
            raise RuntimeError(f"item {number} fails once")
        super().each_iteration(number, path, n, seconds)


@dataclass
class Marks:
    """What a marks file says of one job: its items in the order done, and its hooks."""

    items: list[int] = field(default_factory=list)
    hooks: list[str] = field(default_factory=list)

    @property
    def repeats(self) -> int:
        """Items done more than once (each extra time counted)."""
        return len(self.items) - len(set(self.items))


def read_marks(path: str | os.PathLike[str]) -> dict[str, Marks]:
    """jid -> its Marks, from the lines written to ``path`` so far (a last line still being
    written is left out). Lines of other jobs in the same file (FileMarkJob's "start <jid> <pid>")
    are skipped."""
    found: dict[str, Marks] = {}
    file = Path(path)
    if not file.exists():
        return found
    for line in file.read_text().split("\n")[:-1]:
        words = line.split()
        if len(words) != 2:
            continue
        jid, what = words
        marks = found.setdefault(jid, Marks())
        if what.lstrip("-").isdigit():
            marks.items.append(int(what))
        else:
            marks.hooks.append(what)
    return found
