"""The object model over Redis that the admin, the CLI and ``manage.py shell`` use.

    from django_cogworker import api
    q = api.Queue("mail")
    q.size(), q.latency(), q.paused, q.jobs(page=1, per_page=25)
    q.pause(); q.unpause(); q.clear()
    q.groups(page=1).page.items                  # QueueGroup: id, waiting, paused; the busiest first
    q.pause_group("acme"); q.resume_group("acme")
    [q.name for q in api.Queue.all()]

    dead = api.DeadSet()
    page = dead.page(1, 25, job="shop.jobs.SendReceipt", substring="timeout")
    entry = dead.find(page.items[0].token)       # or dead.entry(jid), dead.entry((score, raw))
    entry.retry_now(); entry.delete()            # RetrySet entries also: entry.kill()
    api.RetrySet().retry_all(); api.ScheduledSet().delete_all()

    for process in api.ProcessSet(): process.quiet()   # or stop(), dump()
    api.Workers(), api.PeriodicEntry.all(), api.QuarantinedKey.all(), api.Stats(), api.JobClassStats.all()

    batches = api.BatchSet()
    limits = api.LimitSet()                      # limiter keys, the most recently used first (Redis time)
    state = limits.get("stripe")                 # LimitState: kind, size, in_use, holders, totals, recent
    limits.families()                            # FamilyTotals per family, summed over its keys (metrics)

    batches.page(1, 25).items[0].state           # BatchSummary: its counts; "succeeded", "incomplete"...
    detail = batches.get(bid)                    # BatchDetail: summary, jobs (where each is), children, callbacks

Objects take an optional ``redis`` client (bytes responses, as the runtime's)
and ``keys``; by default the project's (``runtime``).

Every read is bounded, so a page stays fast on a set of millions and on entries of
megabytes: lists and sorted sets are paged by rank, at most MAX_PER_PAGE (100) a page, and
each entry is read through ``scripts.PREVIEW``: its first HEAD_BYTES and last TAIL_BYTES on
a list, DETAIL_BYTES on its own page (``records``), never more than CALL_BYTES a script call.
A filter or a lookup by jid walks the set by rank (``scripts.SCAN_PREVIEW``) and examines at
most SCAN_LIMIT entries, for at most SCAN_BUDGET seconds, and keeps at most MATCH_LIMIT
matches (``Page.complete`` says whether it saw the whole set). The quarantine listing is
bounded the same way (KEYSPACE_SCAN_LIMIT keys). A record read in part (``complete`` False)
is read whole again by any action on it.

Bad data is read leniently: what can't be parsed is shown with what can (``read_leniently``);
a payload that can't be written back (1e309, a queue name that isn't UTF-8) is poison (``reencode``
raises ``Poison``): retried, it goes to dead with the reason, or stays in dead, marked.

Every write that moves a job is one script from ``scripts`` that writes the
destination before it removes the source, so an error in between leaves the
job in both places, never in neither.

The names are defined in one module per part and re-exported here, so
``from django_cogworker import api`` and ``api.X`` are the way in:

    _base        ActionRefused, Poison, reencode, SCAN_COUNT, MAX_PER_PAGE, the shared private helpers
    records      Page, JobRecord; HEAD_BYTES, TAIL_BYTES, DETAIL_BYTES, CALL_BYTES
    queues       Queue, QueueRow (Queue.page, Queue.prune, Queue.exists)
    lanes        Lanes: a queue's groups and priorities, counted in its size
    sorted_sets  SortedSet, ScheduledSet, RetrySet, DeadSet, Moved (retry_some);
                 SCAN_LIMIT, SCAN_BUDGET, MATCH_LIMIT, BATCH, RETRY_SOME_LIMIT, RETRY_SOME_BUDGET
    sorted_entry SortedEntry (one entry's actions: delete, enqueue_now, kill), KILLED_REASON
    processes    Process, ProcessSet (ProcessSet.readers: who reads each queue), Work, Workers
    periodic     PeriodicEntry
    quarantine   Bounded, QuarantinedKey; KEYSPACE_SCAN_LIMIT, QUARANTINE_LIMIT, SAMPLE_ITEMS, SAMPLE_CHARS
    stats        Day, Stats, JobClassStats

and from the features' folders (each feature's ``api.py``, django_cogworker/features/):

    results      job_result (a job's result record, when it keeps one)
    progress     get_progress, progress_of (a running job's latest report: one, or many in one round trip), Progress
    batches      BatchSet, BatchSummary, BatchDetail, BatchJob, BatchCallback; JOB_LIMIT, CHILD_LIMIT,
                 MEMBER_SCAN_LIMIT, CALLBACK_LOOKUPS, STATE_SAMPLE, STATES, JOB_STATES
    limits       LimitSet, LimitState, Holder, Recent, FamilyTotals; HOLDER_LIMIT, FAMILY_KEY_LIMIT
    fairness     QueueGroup, GroupPage (a queue's groups: Queue.groups, pause_group, resume_group)

The code reads each limit in the module that defines it: to change one (a
test's monkeypatch), set it there, e.g. ``api.sorted_sets.SCAN_LIMIT``;
setting ``api.SCAN_LIMIT`` changes only this re-exported name (a feature's: in its ``api.py``,
e.g. ``features.batches.api.STATE_SAMPLE``, or ``features.batches.api.detail.JOB_LIMIT``).
"""

from ..features.batches.api import (
    CALLBACK_LOOKUPS,
    CHILD_LIMIT,
    JOB_LIMIT,
    JOB_STATES,
    MEMBER_SCAN_LIMIT,
    STATE_SAMPLE,
    STATES,
    BatchCallback,
    BatchDetail,
    BatchJob,
    BatchSet,
    BatchSummary,
)
from ..features.fairness.api import GroupPage, QueueGroup
from ..features.limits.api import FAMILY_KEY_LIMIT, HOLDER_LIMIT, FamilyTotals, Holder, LimitSet, LimitState, Recent
from ..features.progress.api import Progress, get_progress, progress_of
from ..features.results.api import job_result
from ._base import MAX_PER_PAGE, SCAN_COUNT, ActionRefused, Poison, reencode
from .lanes import Lanes
from .periodic import PeriodicEntry
from .processes import Process, ProcessSet, Work, Workers
from .quarantine import KEYSPACE_SCAN_LIMIT, QUARANTINE_LIMIT, SAMPLE_CHARS, SAMPLE_ITEMS, Bounded, QuarantinedKey
from .queues import Queue, QueueRow
from .records import JobRecord, Page
from .sorted_entry import KILLED_REASON, SortedEntry
from .sorted_sets import (
    BATCH,
    MATCH_LIMIT,
    RETRY_SOME_BUDGET,
    RETRY_SOME_LIMIT,
    SCAN_BUDGET,
    SCAN_LIMIT,
    DeadSet,
    Moved,
    RetrySet,
    ScheduledSet,
    SortedSet,
)
from .stats import Day, JobClassStats, Stats

__all__ = [
    # limits
    "SCAN_LIMIT",
    "SCAN_BUDGET",
    "MATCH_LIMIT",
    "SCAN_COUNT",
    "MAX_PER_PAGE",
    "BATCH",
    "RETRY_SOME_LIMIT",
    "RETRY_SOME_BUDGET",
    "KEYSPACE_SCAN_LIMIT",
    "QUARANTINE_LIMIT",
    "SAMPLE_ITEMS",
    "SAMPLE_CHARS",
    "KILLED_REASON",
    "JOB_LIMIT",
    "CHILD_LIMIT",
    "MEMBER_SCAN_LIMIT",
    "CALLBACK_LOOKUPS",
    "STATE_SAMPLE",
    "STATES",
    "JOB_STATES",
    "HOLDER_LIMIT",
    "FAMILY_KEY_LIMIT",
    # errors, pages and records
    "ActionRefused",
    "Poison",
    "reencode",
    "Page",
    "JobRecord",
    # queues
    "Queue",
    "QueueRow",
    "Lanes",
    # a queue's groups
    "QueueGroup",
    "GroupPage",
    # scheduled, retry and dead
    "SortedEntry",
    "SortedSet",
    "ScheduledSet",
    "RetrySet",
    "DeadSet",
    "Moved",
    # processes and what they run
    "Process",
    "ProcessSet",
    "Work",
    "Workers",
    # periodic entries
    "PeriodicEntry",
    # quarantined keys
    "Bounded",
    "QuarantinedKey",
    # results
    "job_result",
    # progress
    "Progress",
    "get_progress",
    "progress_of",
    # batches
    "BatchSet",
    "BatchSummary",
    "BatchDetail",
    "BatchJob",
    "BatchCallback",
    # limiters
    "LimitSet",
    "LimitState",
    "Holder",
    "Recent",
    "FamilyTotals",
    # stats
    "Day",
    "JobClassStats",
    "Stats",
]
