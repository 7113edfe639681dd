"""The batches pages: every batch, newest first, with its progress; and one batch's page: its jobs
where they are now, its child batches and where its callbacks are.

Read only: a batch moves as its jobs run, and its jobs are acted on where they are (the Retries
and Dead pages, to which its failing and dead jobs link, filtered by their jid). Everything is
read through ``api.BatchSet``, bounded whatever the batch's size (features/batches/api/).
"""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse

from ... import api
from ...admin.views import guard, paged, render_page

PER_PAGE = 25
# What each state of a batch's job means, for the page's legend and its rows' titles.
JOB_STATES = {
    "dead": "in the dead set: it won't run again unless retried from there",
    "failing": "its last run failed: it waits in Retries for its next attempt (or was discarded, "
               "pushed with dead=False)",
    "waiting": "waiting in its queue, scheduled, or running",
    "succeeded": "ran and succeeded",
}


@guard(actions=False)
def batches(request: HttpRequest, *, site: Any) -> HttpResponse:
    result = paged(lambda number: api.BatchSet().page(number, PER_PAGE), request)
    return render_page(request, site, "batches", "admin/cogworker/batches/batches.html", "Job batches", result=result,
                       query="")


@guard(actions=False)
def batch(request: HttpRequest, bid: str, *, site: Any) -> HttpResponse:
    detail = api.BatchSet().get(bid)
    if detail is None:
        raise Http404(f"No batch {bid!r}: never created, or its data expired (BATCH_TTL).")
    summary = detail.summary
    tally = [{"state": state, "count": count, "shown": shown, "more": count - shown, "means": JOB_STATES[state]}
             for state, count, shown in detail.tally()]
    return render_page(request, site, "batches", "admin/cogworker/batches/batch.html",
                       f"Batch {summary.description or summary.bid}", detail=detail, batch=summary, tally=tally,
                       job_limit=api.JOB_LIMIT, child_limit=api.CHILD_LIMIT,
                       scan_limit=api.MEMBER_SCAN_LIMIT, lookups=api.CALLBACK_LOOKUPS)
