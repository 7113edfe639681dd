"""The scheduled, retry and dead pages: paged, filtered lists, a job's detail, and their actions.

Rows are named by ``SortedEntry.token`` (score and jid), found again in
O(log n) whatever the set's size. Per-row and selected-rows actions need no
confirmation; "all" actions do.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from .. import api
from ..api import records, sorted_sets
from ..push.job import registry
from .views import all_of, back, confirm, confirmed, counted, guard, int_param, paged, render_page, result_times

SETS: dict[str, tuple[type[api.SortedSet], str]] = {
    "scheduled": (api.ScheduledSet, "Scheduled"),
    "retry": (api.RetrySet, "Retries"),
    "dead": (api.DeadSet, "Dead"),
}
# Per-row actions of each page, in button order.
ROW_ACTIONS = {"scheduled": ("enqueue", "delete"), "retry": ("retry", "delete", "kill"), "dead": ("retry", "delete")}
LABELS = {"enqueue": "Enqueue now", "retry": "Retry now", "delete": "Delete", "kill": "Kill",
          "retry_all": "Retry all", "enqueue_all": "Enqueue all", "delete_all": "Delete all"}
PAST = {"enqueue": "enqueued", "retry": "retried", "delete": "deleted", "kill": "killed"}
PER_PAGE_CHOICES = (25, 50, 100)  # 500 let a view-only user ask for 500 entries of 10 MB
TIME_LABELS = {"scheduled": "Runs at", "retry": "Retry at", "dead": "Died"}
# Pages whose entries may be cancelled (``cancel_views``): they would run. A dead one won't: delete it.
CANCELS = ("scheduled", "retry")
HISTORY_FIELDS = (("Created", "created_at"), ("Enqueued", "enqueued_at"), ("First failed", "failed_at"),
                  ("Last retried", "retried_at"))


def _entry_action(entry: api.SortedEntry, action: str) -> bool:
    return {"enqueue": entry.enqueue_now, "retry": entry.retry_now, "delete": entry.delete,
            "kill": entry.kill}[action]()


def _bulk_labels(page: str) -> tuple[str, str]:
    return ("enqueue_all" if page == "scheduled" else "retry_all"), "delete_all"


@guard(actions=True)
def sorted_set(request: HttpRequest, *, site: Any, page: str) -> HttpResponse:
    cls, title = SETS[page]
    zset = cls()
    page_url = reverse(f"{site.name}:django_cogworker_{page}_changelist")
    if request.method == "POST":
        return _act(request, site, page, zset, title, page_url)
    job, substring = request.GET.get("job", "").strip(), request.GET.get("q", "")
    per_page = int_param(request, "per_page", 25)
    per_page = per_page if per_page in PER_PAGE_CHOICES else 25
    result = paged(lambda number: zset.page(number, per_page, job=job or None, substring=substring or None),
                   request)
    query = request.GET.copy()
    query.pop("page", None)
    move_all, delete_all = _bulk_labels(page)
    return render_page(
        request, site, page, "admin/cogworker/sorted_set.html", title, result=result, job=job, substring=substring,
        per_page=per_page, per_page_choices=PER_PAGE_CHOICES, query=query.urlencode(), size=zset.size(),
        row_actions=[(a, LABELS[a]) for a in ROW_ACTIONS[page]], bulk_actions=[(a, LABELS[a]) for a in
                                                                                (move_all, delete_all)],
        job_names=sorted(registry()), scan_limit=sorted_sets.SCAN_LIMIT, match_limit=sorted_sets.MATCH_LIMIT,
        scan_budget_ms=round(sorted_sets.SCAN_BUDGET * 1000),
        time_label=TIME_LABELS[page], cancels=page in CANCELS)


def _act(request: HttpRequest, site: Any, page: str, zset: api.SortedSet, title: str,
         page_url: str) -> HttpResponse:
    if "row_action" in request.POST:
        action, _, token = request.POST["row_action"].partition(" ")
        tokens = [token]
    else:
        action, tokens = request.POST.get("action", ""), request.POST.getlist("token")
    move_all, delete_all = _bulk_labels(page)
    if action in (move_all, delete_all):
        if not confirmed(request):
            verb = "Delete" if action == delete_all else ("Enqueue" if page == "scheduled" else "Retry")
            return confirm(request, site, page, f"{verb} {all_of(zset.size(), 'entry')} of {title}?",
                           f"Yes, {verb.lower()} all")
        if action == delete_all:
            messages.success(request, f"{title}: {counted(zset.delete_all(), 'entry')} deleted.")
            return back(request, page_url)
        return _move_some(request, site, page, zset, title, page_url)
    if action not in ROW_ACTIONS[page]:
        messages.error(request, f"Unknown action {action!r}.")
        return back(request, page_url)
    if not tokens:
        messages.warning(request, "Select the entries first.")
        return back(request, page_url)
    done = gone = 0
    for token in tokens[:api.MAX_PER_PAGE]:
        entry = zset.find(token)
        try:
            ok = entry is not None and _entry_action(entry, action)
        except api.ActionRefused as exc:
            messages.error(request, str(exc))
            continue
        done, gone = done + ok, gone + (not ok)
    if done:
        messages.success(request, f"{title}: {done} {'entry' if done == 1 else 'entries'} {PAST[action]}.")
    if gone:
        messages.warning(request, f"{title}: {gone} {'entry was' if gone == 1 else 'entries were'} no longer "
                                  f"there (run, moved or deleted meanwhile).")
    return back(request, page_url)


def _move_some(request: HttpRequest, site: Any, page: str, zset: api.SortedSet, title: str,
               page_url: str) -> HttpResponse:
    """One request's share of "Retry all" / "Enqueue all" (``retry_some``: bounded, to fit a gateway's
    timeout), then, while entries are left, a page that asks to go on from where it stopped."""
    try:
        resume = max(int(request.POST.get("resume", 0)), 0)
    except ValueError:
        resume = 0
    done = zset.retry_some(start=resume)
    said = [f"{title}: {done.moved:,} {'entry' if done.moved == 1 else 'entries'} moved to their queues"]
    if done.buried:
        said.append(f"{done.buried:,} that can't be written back sent to Dead with the reason")
    if done.stuck:
        said.append(f"{done.stuck:,} left in place (no queue, unreadable, can't be written back, or "
                    f"their queue key holds the wrong type)")
    messages.success(request, "; ".join(said) + ".")
    if not done.left:
        return back(request, page_url)
    verb = "enqueue" if page == "scheduled" else "retry"
    return confirm(request, site, page, f"{counted(done.left, 'entry')} of {title} {'is' if done.left == 1 else 'are'} "
                   "left to look at (one request "
                   f"moves at most {sorted_sets.RETRY_SOME_LIMIT:,}, for at most "
                   f"{sorted_sets.RETRY_SOME_BUDGET:g} s). Go on?", f"Yes, {verb} the next ones",
                   resume=str(done.resume))


@guard(actions=False)
def sorted_set_raw(request: HttpRequest, token: str, *, site: Any, page: str) -> HttpResponse:
    """The stored JSON of one entry, whole, as a download: its page shows DETAIL_BYTES of it."""
    cls, title = SETS[page]
    entry = cls().find(token, whole=True)
    if entry is None:
        messages.warning(request, f"{title}: that entry is no longer there (run, moved or deleted meanwhile).")
        return HttpResponseRedirect(reverse(f"{site.name}:django_cogworker_{page}_changelist"))
    response = HttpResponse(entry.raw, content_type="application/octet-stream")
    response["Content-Disposition"] = f'attachment; filename="{page}-{entry.ident.replace(":", "-")}.json"'
    return response


@guard(actions=False)
def sorted_set_job(request: HttpRequest, token: str, *, site: Any, page: str) -> HttpResponse:
    cls, title = SETS[page]
    entry = cls().find(token)
    page_url = reverse(f"{site.name}:django_cogworker_{page}_changelist")
    if entry is None:
        messages.warning(request, f"{title}: that entry is no longer there (run, moved or deleted meanwhile).")
        return HttpResponseRedirect(page_url)
    shown = {"jid", "class", "args", "kwargs", "queue", "error_class", "error_message", "error_backtrace",
             "created_at", "enqueued_at", "failed_at", "retried_at", "retry_count", "retry", "orphan_count",
             "dead_reason", "encrypted"}  # (encrypted: the sealed blob, its args shown "(encrypted)")
    extra = sorted((k, v) for k, v in entry.payload.items() if k not in shown)
    result = api.job_result(entry.jid) if isinstance(entry.jid, str) and entry.jid else None
    return render_page(request, site, page, "admin/cogworker/job.html", f"{title}: {entry.display_class}",
                       set_title=title, entry=entry, extra=extra, result=result, result_times=result_times(result),
                       history_fields=HISTORY_FIELDS,
                       detail_bytes=records.DETAIL_BYTES,
                       raw_url=reverse(f"{site.name}:django_cogworker_{page}_raw", args=[entry.token]),
                       row_actions=[(a, LABELS[a]) for a in ROW_ACTIONS[page]], time_label=TIME_LABELS[page],
                       cancels=page in CANCELS)

