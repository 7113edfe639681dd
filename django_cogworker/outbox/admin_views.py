"""The admin's Outbox page: each database's outbox (rows waiting, the oldest's age), and "Relay
now" (POST, the change permission) for an operator who brought Redis back and won't wait for a
worker's relay. Read and relayed through ``outbox.api``."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.urls import reverse

from ..admin.views import back, guard, render_page
from ..errors import is_unavailable
from . import api


@guard(actions=True)
def outbox(request: HttpRequest, *, site: Any) -> HttpResponse:
    page_url = reverse(f"{site.name}:django_cogworker_outbox_changelist")
    if request.method == "POST":
        try:
            taken = api.relay_now()
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            messages.error(request, f"Redis refused the relay ({type(exc).__name__}: {exc}): the jobs still wait.")
        else:
            messages.success(request, f"{taken:,} job(s) relayed." if taken else "Nothing was waiting.")
        return back(request, page_url)
    from ..push import runtime

    return render_page(request, site, "outbox", "admin/cogworker/outbox.html", "Outbox", states=api.states(),
                       enabled=runtime.get_config().outbox, relay_max=api.RELAY_NOW_MAX)
