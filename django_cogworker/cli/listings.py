"""What the read commands of ``manage.py cogworker`` show, each a ``Listing``: rows under headers
for the table, and the JSON document for ``--json``. Everything is read through ``api``, paged
as the admin pages are (at most ``api.MAX_PER_PAGE`` rows a call), so a set of millions costs a
page, not the set."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from django.core.management.base import CommandError

from .. import api
from .output import FAILED, listing, more_note, seconds, when

SETS: dict[str, type[api.SortedSet]] = {"scheduled": api.ScheduledSet, "retries": api.RetrySet,
                                         "dead": api.DeadSet}


@dataclasses.dataclass
class Listing:
    headers: list[str]
    rows: list[list[Any]]
    document: dict[str, Any]
    note: str | None = None  # a line for stderr: the listing was cut, or a filter stopped early


def stats() -> Listing:
    s = api.Stats(days=1)
    values = {"processed": s.processed, "failed": s.failed, "processed_today": s.processed_today,
              "failed_today": s.failed_today, "enqueued": s.enqueued, "queues": s.queue_count, "busy": s.busy,
              "concurrency": s.concurrency, "processes": s.process_count, "scheduled": s.scheduled_size,
              "retries": s.retry_size, "dead": s.dead_size, "redis_version": s.redis_info.get("version"),
              "redis_used_memory": s.redis_info.get("used_memory_human")}
    return Listing(["STAT", "VALUE"], [[k, v] for k, v in values.items()], values)


def known_queues() -> set[str]:
    """Queues pushed to (or paused) and the configured ones."""
    from ..push import runtime

    return {q.name for q in api.Queue.all()} | set(runtime.get_config().queue_names)


def queues(names: list[str], page: int, limit: int) -> Listing:
    """All queues by name, a page of them; or the ``names`` given, each of which must be known."""
    if names:
        unknown = [n for n in names if n not in known_queues()]
        if unknown:
            raise CommandError(f"no such queue: {', '.join(map(repr, unknown))}", returncode=FAILED)
        rows = api.QueueRow.read([api.Queue(n) for n in names])
        result = api.Page(rows, 1, len(rows), len(rows))
    else:
        result = api.Queue.page(page, limit)
    items = [{"name": r.queue.name, "size": r.size, "latency": round(r.latency, 3), "paused": r.paused}
             for r in result.items]
    return Listing(["QUEUE", "SIZE", "LATENCY", "PAUSED"],
                   [[i["name"], i["size"], seconds(i["latency"]), i["paused"]] for i in items],
                   listing(items, page=result.number, per_page=result.per_page, total=result.total),
                   more_note(result.number, result.per_page, result.total, len(items)))


def processes() -> Listing:
    now = time.time()
    found = list(api.ProcessSet())
    items = [{"identity": p.identity, "hostname": p.hostname, "pid": p.pid, "tag": p.tag, "busy": p.busy,
              "concurrency": p.concurrency, "queues": p.queues, "quiet": p.is_quiet, "started_at": p.started_at,
              "beat": p.beat, "supervisor": p.supervisor or None, "index": p.index, "version": p.version}
             for p in found]
    rows = [[i["identity"], i["hostname"], i["pid"], i["tag"] or None, f"{i['busy']}/{i['concurrency'] or '?'}",
             ",".join(i["queues"]), i["quiet"], when(i["started_at"]),
             seconds(now - i["beat"]) if i["beat"] is not None else None] for i in items]
    return Listing(["IDENTITY", "HOST", "PID", "TAG", "BUSY", "QUEUES", "QUIET", "STARTED", "LAST BEAT"], rows,
                   listing(items))


def entry_item(entry: api.SortedEntry) -> dict[str, Any]:
    return {"jid": entry.jid, "class": entry.display_class, "queue": entry.queue, "at": entry.score,
            "args": entry.args, "kwargs": entry.kwargs, "retry_count": entry.retry_count,
            "error_class": entry.error_class, "error_message": entry.error_message,
            "enqueued_at": entry.time("enqueued_at"), "failed_at": entry.time("failed_at"),
            "read_whole": entry.complete, "unparseable": entry.parse_error is not None, "token": entry.token}


def sorted_set(kind: str, page: int, limit: int, job: str | None, grep: str | None) -> Listing:
    """A page of the scheduled, retry or dead set (dead newest first), optionally filtered (bounded)."""
    result = SETS[kind]().page(page, limit, job=job, substring=grep)
    items = [entry_item(e) for e in result.items]
    time_header = {"scheduled": "DUE", "retries": "NEXT RETRY", "dead": "DIED"}[kind]
    headers = [time_header, "JID", "CLASS", "QUEUE", "ARGS"]
    if kind != "scheduled":
        headers += ["RETRIES", "ERROR"]
    rows: list[list[Any]] = []
    for i in items:
        row = [when(i["at"]), i["jid"] or result.items[len(rows)].ident, i["class"], i["queue"], i["args"]]
        if kind != "scheduled":
            error = f"{i['error_class']}: {i['error_message']}" if i["error_class"] else i["error_message"]
            row += [i["retry_count"], error]
        rows.append(row)
    note = more_note(result.number, result.per_page, result.total, len(items))
    if not result.complete:
        note = (f"(the filter stopped after examining {result.scanned} entries: there may be more matches; "
                "narrow it, or use the admin)")
    return Listing(headers, rows, listing(items, page=result.number, per_page=result.per_page, total=result.total,
                                          complete=result.complete), note)


def periodic() -> Listing:
    now = time.time()
    items = [{"name": e.pjid, "cron": e.cron, "tz": e.tz, "job": e.job, "queue": e.queue, "enabled": e.enabled,
              "last_run": e.last_slot, "next_run": e.next_run(now) if e.enabled else None,
              "declared": not e.stale(now)} for e in api.PeriodicEntry.all()]
    rows = [[i["name"], i["cron"], i["tz"], i["job"], i["queue"], i["enabled"], when(i["last_run"]),
             when(i["next_run"])] for i in items]
    return Listing(["NAME", "CRON", "TZ", "JOB", "QUEUE", "ENABLED", "LAST RUN", "NEXT RUN"], rows, listing(items))
