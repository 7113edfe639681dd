"""The pushes waiting for one commit, known to each other: what lets the first to fail at a commit
speak for the rest.

A push made inside ``transaction.atomic()`` runs at commit as a callback of ``on_commit`` (with
OUTBOX off: ``runtime.defer_to_commit``), or hands its outbox row to Redis then (OUTBOX on:
outbox/store.py). Each is a :class:`Waiting` of its commit's :class:`Commit`. When one finds Redis
away, the others of that commit are known:

- OUTBOX off: Django runs no ``on_commit`` callback after one that raises, so the others are lost
  too, and the error raised names them (:class:`~django_cogworker.errors.PushLostAtCommit`).
- OUTBOX on: the rows of the others are left to a worker's relay without trying Redis again. A
  Redis that doesn't answer (stopped, not refusing) made each row wait its socket timeout: five
  pushes in one ``atomic()`` held the commit's caller 50 s, and 2,000 rows logged 2,000 lines.

Which callbacks will still run is Django's to know (a savepoint rolled back drops its own; the
callbacks not run yet are in a list local to its commit), so a Commit holds its members weakly:
one Django dropped is gone from it (CPython frees it at once; elsewhere it may be counted until a
collection), and those alive and not run yet are the ones its commit runs next.

A Commit is per thread and per database alias (Django's transactions are), begun by the first push
of a transaction and ended by its first member run: a push after that (a callback's own
transaction) begins the next. One whose transaction rolled back, never run, is simply reused.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

_local = threading.local()
_PRUNE = 64  # members kept before the dead ones are dropped (a thread whose transactions roll back)


class Commit:
    """The pushes waiting for one commit on one database, in this thread."""

    __slots__ = ("alias", "started", "failure", "_members", "_prune_at")

    def __init__(self, alias: str):
        self.alias = alias
        self.started = False
        self.failure: BaseException | None = None  # (the first outage one of them met)
        self._members: list[weakref.ref[Waiting]] = []
        self._prune_at = _PRUNE

    def add(self, member: Waiting) -> None:
        if len(self._members) >= self._prune_at:
            # (Pruned again only once the list has doubled: members Django still holds all stay, and
            # a prune on every add made 10,000 pushes in one atomic() cost 50 million look-ups.)
            self._members = [ref for ref in self._members if ref() is not None]
            self._prune_at = max(_PRUNE, 2 * len(self._members))
        self._members.append(weakref.ref(member))

    def left(self, after: Waiting) -> list[Waiting]:
        """The members its commit will still run after ``after`` (in their order)."""
        found = []
        for ref in self._members:
            member = ref()
            if member is not None and member is not after and not member.ran:
                found.append(member)
        return found


class Waiting:
    """One push waiting for its commit: ``run`` (called with itself) at the commit, ``jobs`` its
    payloads (or an outbox row's count: ``count``). The callable given to ``on_commit``."""

    __slots__ = ("commit", "jobs", "count", "run", "ran", "__weakref__")

    def __init__(self, commit: Commit, jobs: Sequence[dict[str, Any]], run: Callable[[Waiting], Any],
                 count: int | None = None):
        self.commit = commit
        self.jobs = jobs
        self.count = len(jobs) if count is None else count
        self.run = run
        self.ran = False

    def __call__(self) -> Any:
        self.ran = True
        self.commit.started = True
        return self.run(self)


def waiting(alias: str, jobs: Sequence[dict[str, Any]], run: Callable[[Waiting], Any],
            count: int | None = None) -> Waiting:
    """A member of the commit to come on database ``alias`` in this thread, to hand to ``on_commit``."""
    commits = getattr(_local, "commits", None)
    if commits is None:
        commits = _local.commits = {}
    commit = commits.get(alias)
    if commit is None or commit.started:
        commit = commits[alias] = Commit(alias)
    member = Waiting(commit, jobs, run, count)
    commit.add(member)
    return member


def describe(jobs: Sequence[dict[str, Any]], most: int = 5) -> str:
    """``SendReceipt (jid 1a2b...), ...``: the jobs named, ``most`` at the most, then how many more."""
    named = ", ".join(f"{job.get('class', '?')} (jid {job.get('jid', '?')})" for job in jobs[:most])
    return named + (f" and {len(jobs) - most} more" if len(jobs) > most else "")
