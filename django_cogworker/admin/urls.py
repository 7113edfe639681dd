"""The URLs of each Cogworker page, under ``<admin>/django_cogworker/<page>/``.

Each page's changelist URL (``admin:django_cogworker_<page>_changelist``) is its
main view, which is what the admin index links to. Every view goes through
``AdminSite.admin_view`` (login, staff, CSRF) and receives the site.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.urls import path

from . import batch_views, cancel_views, limit_views, set_views, views


def page_urls(page: str, site: Any) -> list[Any]:
    def view(func: Callable[..., Any], **bound: Any) -> Callable[..., Any]:
        return site.admin_view(functools.update_wrapper(functools.partial(func, site=site, **bound), func))

    name = f"django_cogworker_{page}"
    main = {
        "dashboard": view(views.dashboard), "queue": view(views.queues), "busy": view(views.busy),
        "periodic": view(views.periodic), "quarantine": view(views.quarantine),
        "scheduled": view(set_views.sorted_set, page=page), "retry": view(set_views.sorted_set, page=page),
        "dead": view(set_views.sorted_set, page=page), "batches": view(batch_views.batches),
        "limits": view(limit_views.limits),
    }[page]
    patterns = [path("", main, name=f"{name}_changelist")]
    if page == "queue":
        patterns.append(path("<path:queue>/", view(views.queue_jobs), name=f"{name}_jobs"))
    if page == "batches":
        patterns.append(path("<str:bid>/", view(batch_views.batch), name=f"{name}_batch"))
    if page == "limits":
        patterns.append(path("<path:key>/", view(limit_views.limit), name=f"{name}_limit"))
    if page == "busy":  # (one endpoint for every page's Cancel button: a job is cancelled by jid, wherever it is)
        patterns.append(path("cancel/", view(cancel_views.cancel), name=f"{name}_cancel"))
    if page in set_views.SETS:
        patterns.append(path("job/<str:token>/", view(set_views.sorted_set_job, page=page), name=f"{name}_job"))
        patterns.append(path("job/<str:token>/raw/", view(set_views.sorted_set_raw, page=page), name=f"{name}_raw"))
    return patterns
