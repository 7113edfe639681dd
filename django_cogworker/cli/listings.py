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
from ..errors import BatchNotFound
from .output import FAILED, listing, more_note, seconds, when

SETS: dict[str, type[api.SortedSet]] = {"scheduled": api.ScheduledSet, "retries": api.RetrySet,
                                         "dead": api.DeadSet}


@dataclasses.dataclass
class Listing:
    headers: list[str]
    rows: list[list[Any]]
    document: dict[str, Any]
    note: str | None = None  # a line for stderr: the listing was cut, or a filter stopped early
    # More tables, each (headers, rows), printed after the first (a batch's jobs, callbacks, children).
    sections: list[tuple[list[str], list[list[Any]]]] = dataclasses.field(default_factory=list)


def stats() -> Listing:
    s = api.Stats(days=1)
    values = {"processed": s.processed, "failed": s.failed, "processed_today": s.processed_today,
              "failed_today": s.failed_today, "enqueued": s.enqueued, "queues": s.queue_count, "busy": s.busy,
              "concurrency": s.concurrency, "processes": s.process_count, "scheduled": s.scheduled_size,
              "retries": s.retry_size, "dead": s.dead_size, "cancelled": s.cancelled,
              "expired": s.expired, "redis_version": s.redis_info.get("version"),
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
        named = _page(names, page, limit)
        result = api.Page(api.QueueRow.read([api.Queue(n) for n in named.items]), page, limit, named.total)
    else:
        result = api.Queue.page(page, limit)
    items = [{"name": r.queue.name, "size": r.size, "latency": round(r.latency, 3), "paused": r.paused}
             for r in result.items]
    return Listing(["QUEUE", "SIZE", "LATENCY", "PAUSED"],
                   [[i["name"], i["size"], seconds(i["latency"]), i["paused"]] for i in items],
                   listing(items, page=result.number, per_page=result.per_page, total=result.total),
                   more_note(result.number, result.per_page, result.total, len(items)))


def _entry_queue(entry: api.PeriodicEntry) -> str | None:
    """The queue an entry's runs go to: its own, else its job class's (an entry on its job's queue
    showed "-"); None for a class this process doesn't know."""
    from ..push.job import registered

    if entry.queue:
        return str(entry.queue)
    job_class = registered(entry.job)
    return job_class.queue if job_class is not None else None


def _page(everything: list[Any], page: int, limit: int) -> api.Page:
    """Page ``page`` of ``limit`` rows of a listing read whole (processes, periodic entries: a few)."""
    start = (page - 1) * limit
    return api.Page(everything[start:start + limit], page, limit, len(everything))


def processes(page: int, limit: int) -> Listing:
    now = time.time()
    result = _page(list(api.ProcessSet()), page, limit)
    found = result.items
    items = [{"identity": p.identity, "hostname": p.hostname, "pid": p.pid, "tag": p.tag, "busy": p.busy,
              "concurrency": p.concurrency, "queues": p.queues, "quiet": p.is_quiet, "started_at": p.started_at,
              "beat": p.beat, "supervisor": p.supervisor or None, "index": p.index, "generation": p.generation,
              "version": p.version}
             for p in found]
    # GEN: the generation under its supervisor (a rolling restart starts the next): old ones still
    # finishing their jobs show beside the fresh ones.
    rows = [[i["identity"], i["hostname"], i["pid"], i["tag"] or None, f"{i['busy']}/{i['concurrency'] or '?'}",
             ",".join(i["queues"]), i["quiet"], i["generation"], when(i["started_at"]),
             seconds(now - i["beat"]) if i["beat"] is not None else None] for i in items]
    return Listing(["IDENTITY", "HOST", "PID", "TAG", "BUSY", "QUEUES", "QUIET", "GEN", "STARTED", "LAST BEAT"], rows,
                   listing(items, page=result.number, per_page=result.per_page, total=result.total),
                   more_note(result.number, result.per_page, result.total, len(items)))


def busy(page: int, limit: int) -> Listing:
    """The jobs running now (as the admin's busy page), each with its progress (``Job.progress``;
    null when it reported none): read in one round trip for the page, not one per job."""
    result = _page(list(api.Workers()), page, limit)
    progress = api.progress_of([w.job.jid for w in result.items])
    items = [{"identity": w.identity, "thread": w.thread, "jid": w.job.jid, "class": w.job.display_class,
              "queue": w.queue, "run_at": w.run_at, "args": w.job.args, "kwargs": w.job.kwargs,
              "progress": _progress(progress.get(w.job.jid or ""))} for w in result.items]
    rows = [[i["identity"], i["thread"], i["jid"], i["class"], i["queue"], when(i["run_at"]),
             _progress_cell(i["progress"])] for i in items]
    return Listing(["IDENTITY", "THREAD", "JID", "CLASS", "QUEUE", "STARTED", "PROGRESS"], rows,
                   listing(items, page=result.number, per_page=result.per_page, total=result.total),
                   more_note(result.number, result.per_page, result.total, len(items)))


def _progress(report: api.Progress | None) -> dict[str, Any] | None:
    return None if report is None else report.as_dict()


def _progress_cell(report: dict[str, Any] | None) -> str | None:
    """A short PROGRESS cell: "450/1000 45% eta 2m 3s", "450" (no total), "-" (none)."""
    if report is None:
        return None
    from ..templatetags.cogworker_admin import duration, number

    text = number(report["done"])
    if report["total"] is not None:
        text += f"/{number(report['total'])} {int(report['fraction'] * 100)}%"
    if report["eta"] is not None:
        text += f" eta {duration(report['eta'])}"
    return text


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


def periodic(page: int, limit: int) -> Listing:
    now = time.time()
    result = _page(api.PeriodicEntry.all(), page, limit)
    items = [{"name": e.pjid, "cron": e.cron, "tz": e.tz, "job": e.job, "queue": _entry_queue(e), "enabled": e.enabled,
              "last_run": e.last_slot, "next_run": e.next_run(now) if e.enabled else None,
              "declared": not e.stale(now)} for e in result.items]
    rows = [[i["name"], i["cron"], i["tz"], i["job"], i["queue"], i["enabled"], when(i["last_run"]),
             when(i["next_run"])] for i in items]
    return Listing(["NAME", "CRON", "TZ", "JOB", "QUEUE", "ENABLED", "LAST RUN", "NEXT RUN"], rows,
                   listing(items, page=result.number, per_page=result.per_page, total=result.total),
                   more_note(result.number, result.per_page, result.total, len(items)))


def limit_item(s: api.LimitState) -> dict[str, Any]:
    return {"key": s.key, "family": s.family, "kind": s.kind, "size": s.size, "per": s.per, "lease": s.lease,
            "in_use": s.in_use, "full": s.full, "holders": [dataclasses.asdict(h) for h in s.holders],
            "more_holders": s.more_holders, "waiting": s.waiting, "totals": s.totals,
            "recent": dataclasses.asdict(s.recent), "last_used": s.last_used, "lost": s.lost, "poisoned": s.poisoned}


def limits(page: int, limit: int) -> Listing:
    """A page of limiter keys, the most recently used first (in Redis time), with their holders' jids."""
    result = api.LimitSet().page(page, limit)
    rows = [[s.key, s.kind + (" (poisoned)" if s.lost or s.poisoned else ""), _rate(s),
             f"{s.in_use}/{s.size if s.size is not None else '?'}",
             ",".join(h.jid or "-" for h in s.holders) + (f" +{s.more_holders}" if s.more_holders else "") or None,
             s.waiting, f"{s.recent.over_5m}/{s.recent.over_60m}", s.totals["rescheduled"], s.totals["granted"],
             s.totals["over"], s.totals["expired"]] for s in result.items]
    return Listing(["KEY", "KIND", "SIZE", "IN USE", "HOLDERS", "WAITING", "OVER 5M/60M", "RESCHEDULED", "GRANTED",
                    "OVER", "LAPSED"], rows,
                   listing([limit_item(s) for s in result.items], page=result.number, per_page=result.per_page,
                           total=result.total),
                   more_note(result.number, result.per_page, result.total, len(rows)))


def _rate(s: api.LimitState) -> str:
    size = "?" if s.size is None else str(s.size)
    return f"{size}/{s.per:g}s" if s.per else size


STATE_TEXT = {"succeeded": "succeeded", "complete_with_failures": "complete, failing", "incomplete": "in progress"}


def batch_item(s: api.BatchSummary) -> dict[str, Any]:
    return {"bid": s.bid, "description": s.description, "created_at": s.created_at, "parent": s.parent,
            "total": s.total, "succeeded": s.succeeded, "pending": s.pending, "failures": s.failures, "dead": s.dead,
            "state": s.state, "complete": s.complete, "success": s.success, "death": s.death,
            "committed": s.committed, "completed_at": s.completed_at, "succeeded_at": s.succeeded_at,
            "died_at": s.died_at, "lost": s.lost, "poisoned": s.poisoned}


def _state(s: api.BatchSummary) -> str:
    return (STATE_TEXT[s.state] + (", a job died" if s.death else "") + ("" if s.committed else ", open")
            + (", poisoned" if s.lost or s.poisoned else ""))


def batches(page: int, limit: int) -> Listing:
    """A page of batches, the newest first (expired ones are taken off the listing as they are met)."""
    result = api.BatchSet().page(page, limit)
    rows = [[s.bid, s.description, when(s.created_at), f"{s.succeeded}/{s.total}", s.pending, s.failures, s.dead,
             _state(s)] for s in result.items]
    return Listing(["BID", "DESCRIPTION", "CREATED", "DONE", "PENDING", "FAILURES", "DEAD", "STATE"], rows,
                   listing([batch_item(s) for s in result.items], page=result.number, per_page=result.per_page,
                           total=result.total),
                   more_note(result.number, result.per_page, result.total, len(rows)))


def batch(bid: str) -> Listing:
    """One batch: its fields, then its callbacks, its child batches and its jobs where they are
    (at most ``api.JOB_LIMIT``, the dead and failing first; the counts cover them all)."""
    detail = api.BatchSet().get(bid)
    if detail is None:
        raise CommandError(str(BatchNotFound(bid)), returncode=FAILED)
    s = detail.summary
    item = batch_item(s)
    fields: list[list[Any]] = [["bid", s.bid], ["description", s.description], ["created", when(s.created_at)],
                               ["parent", s.parent], ["state", _state(s)], ["total", s.total]]
    fields += [[state, f"{count}" + (f" ({shown} listed)" if shown < count else "")]
               for state, count, shown in detail.tally()]
    fields += [["completed at", when(s.completed_at)], ["succeeded at", when(s.succeeded_at)],
               ["first death at", when(s.died_at)]]
    if s.lost:  # (docs/batches.md: what a batch does once it lost a key)
        fields.append(["lost", f"{', '.join(s.lost)}: found holding the wrong type, moved to quarantine; what it "
                               f"counted is gone"])
    if s.poisoned:
        fields.append(["wrong type", f"{', '.join(s.poisoned)}: read as empty; the next worker step of the batch "
                                     f"moves it to quarantine"])
    callbacks = [{"event": c.event, "jid": c.jid, "class": c.job_class, "queue": c.queue, "options": c.options,
                  "state": c.state, "fired_at": c.fired_at, "where": c.where,
                  "error_class": c.entry.error_class if c.entry else None,
                  "error_message": c.entry.error_message if c.entry else None, "token": c.entry.token if c.entry
                  else None, "result": c.result.status if c.result else None, "looked": c.looked}
                 for c in detail.callbacks]
    jobs = [{"jid": j.jid, "child": j.child, "state": j.state, **({"failure": j.failure} if j.failure else {})}
            for j in detail.jobs]
    children = [{"bid": bid, **(batch_item(child) if child else {"expired": True})} for bid, child in detail.children]
    document = {"batch": item, "callbacks": callbacks, "children": children,
                "jobs": {"counts": {state: count for state, count, _ in detail.tally()}, "listed": len(jobs),
                         "complete": detail.complete, "items": jobs}}
    sections: list[tuple[list[str], list[list[Any]]]] = []
    if callbacks:
        sections.append((["EVENT", "CALLBACK", "CLASS", "QUEUE", "STATE", "WHERE"],
                         [[c["event"], c["jid"], c["class"], c["queue"], c["state"], _where(c)] for c in callbacks]))
    if detail.children:
        sections.append((["CHILD BATCH", "DESCRIPTION", "DONE", "STATE"],
                         [[bid, child.description, f"{child.succeeded}/{child.total}", _state(child)] if child
                          else [bid, None, None, "expired"] for bid, child in detail.children]))
    sections.append((["JID", "STATE", "ERROR", "FAILED"],
                     [[f"batch {j.child}" if j.child else j.jid, j.state, _error(j.failure), when(_at(j.failure))]
                      for j in detail.jobs]))
    listed = len(detail.jobs)
    note = (f"({listed} of {s.total} jobs listed, the dead and failing first; the counts above cover them all)"
            if listed < s.total else None)
    return Listing(["FIELD", "VALUE"], fields, document, note, sections)


def _where(callback: dict[str, Any]) -> str | None:
    if callback["where"]:
        error = f"{callback['error_class']}: {callback['error_message']}" if callback["error_class"] else ""
        return f"{callback['where']}{': ' + error if error else ''}"
    if callback["result"]:
        return f"result {callback['result']}"
    return "not in retry or dead" if callback["looked"] else None


def _error(failure: dict[str, Any] | None) -> str | None:
    if not failure:
        return None
    return f"{failure['error']}: {failure.get('message', '')}" if failure.get("error") else failure.get("message")


def _at(failure: dict[str, Any] | None) -> float | None:
    at = (failure or {}).get("at")
    return float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else None
