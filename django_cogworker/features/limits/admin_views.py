"""The limits pages: every limiter key, the most recently used first, with how much of it is in
use (a bar, as a batch's progress), its holders, refusals and reschedules; and one key's page with
all its live holders (at most ``api.HOLDER_LIMIT``).

Read only: a limiter frees as its holders end. A holder that runs too long is cancelled where
it runs (the Processes page, to which each holder's jid links; its Cancel button is here too).
Everything is read through ``api.LimitSet``, in Redis time (features/limits/api.py).
"""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse

from ... import api
from ...admin.views import guard, paged, render_page

PER_PAGE = 25
# What "in use" counts for each kind, for the pages' notes and the rows' titles.
IN_USE = {
    "concurrent": "jobs holding it now (a lease not yet lapsed)",
    "bucket": "starts in the current bucket of `per` seconds",
    "window": "starts in the last `per` seconds",
    "leaky": "places taken in the leaky bucket (it drains size every `per` seconds)",
    "unknown": "live holders, if any (its spec isn't stored: no worker has listed it since)",
}


@guard(actions=False)
def limits(request: HttpRequest, *, site: Any) -> HttpResponse:
    result = paged(lambda number: api.LimitSet().page(number, PER_PAGE), request)
    return render_page(request, site, "limits", "admin/cogworker/limits/limits.html", "Limits", result=result, query="",
                       in_use=IN_USE)


@guard(actions=False)
def limit(request: HttpRequest, key: str, *, site: Any) -> HttpResponse:
    state = api.LimitSet().get(key)
    if state is None:
        raise Http404(f"No limiter key {key!r}: no worker has used it.")
    return render_page(request, site, "limits", "admin/cogworker/limits/limit.html", f"Limit {key}", state=state,
                       in_use=IN_USE[state.kind], holder_limit=api.HOLDER_LIMIT)
