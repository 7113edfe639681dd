"""The URLs of each Cogworker page, under ``<admin>/django_cogworker/<page>/``.

Each page's changelist URL (``admin:django_cogworker_<page>_changelist``) is its
main view, which is what the admin index links to. Every view goes through
``AdminSite.admin_view`` (login, staff, CSRF) and receives the site.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from django.urls import path, register_converter
from django.urls.converters import get_converters

from ..features.batches import admin_views as batch_views
from ..features.cancellation import admin_views as cancel_views
from ..features.history import admin_views as history_views
from ..features.limits import admin_views as limit_views
from ..features.profiling import admin_views as profile_views
from ..outbox import admin_views as outbox_views
from . import set_views, views


class NameConverter:
    """A limiter key, a batch's bid or a queue name as one path segment, whatever it holds.

    Django's ``reverse`` leaves "/" and "." as they are: a limiter key "a/../b" linked to the page
    of "b", and one of ".." to the limits page itself (a browser resolves dot segments, "%2e" ones
    too). So "~" and "/" are written "~7E" and "~2F", and a name all of dots its dots as "~2E";
    everything else is percent-encoded by ``reverse`` as usual. Anything matches on the way in (a
    link made before, with a bare "/", still opens its page).
    """

    regex = ".+"
    _escaped = re.compile("~(7E|2F|2E)")
    _chars = {"7E": "~", "2F": "/", "2E": "."}

    def to_python(self, value: str) -> str:
        return self._escaped.sub(lambda m: self._chars[m[1]], value)

    def to_url(self, value: str) -> str:
        text = value.replace("~", "~7E").replace("/", "~2F")
        return text.replace(".", "~2E") if text.strip(".") == "" else text


if "cogworker_name" not in get_converters():
    register_converter(NameConverter, "cogworker_name")


def page_urls(page: str, site: Any) -> list[Any]:
    def view(func: Callable[..., Any], **bound: Any) -> Callable[..., Any]:
        return site.admin_view(functools.update_wrapper(functools.partial(func, site=site, **bound), func))

    name = f"django_cogworker_{page}"
    main = {
        "dashboard": view(views.dashboard), "queue": view(views.queues), "busy": view(views.busy),
        "periodic": view(views.periodic), "quarantine": view(views.quarantine),
        "scheduled": view(set_views.sorted_set, page=page), "retry": view(set_views.sorted_set, page=page),
        "dead": view(set_views.sorted_set, page=page), "batches": view(batch_views.batches),
        "limits": view(limit_views.limits), "outbox": view(outbox_views.outbox),
        "metrics": view(history_views.metrics), "profiles": view(profile_views.profiles),
    }[page]
    patterns = [path("", main, name=f"{name}_changelist")]
    if page == "queue":
        patterns.append(path("<cogworker_name:queue>/", view(views.queue_jobs), name=f"{name}_jobs"))
    if page == "batches":
        patterns.append(path("<cogworker_name:bid>/", view(batch_views.batch), name=f"{name}_batch"))
    if page == "limits":
        patterns.append(path("<cogworker_name:key>/", view(limit_views.limit), name=f"{name}_limit"))
    if page == "busy":  # (one endpoint for every page's Cancel button: a job is cancelled by jid, wherever it is)
        patterns.append(path("cancel/", view(cancel_views.cancel), name=f"{name}_cancel"))
    if page == "profiles":  # (run/ first: an id is 16 hex digits, never "run")
        patterns.append(path("run/", view(profile_views.run), name=f"{name}_run"))
        patterns.append(path("<str:ident>/", view(profile_views.profile), name=f"{name}_profile"))
        patterns.append(path("<str:ident>/html/", view(profile_views.profile_html), name=f"{name}_html"))
    if page in set_views.SETS:
        patterns.append(path("job/<str:token>/", view(set_views.sorted_set_job, page=page), name=f"{name}_job"))
        patterns.append(path("job/<str:token>/raw/", view(set_views.sorted_set_raw, page=page), name=f"{name}_raw"))
    return patterns
