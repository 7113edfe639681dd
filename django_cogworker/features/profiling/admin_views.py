"""The Profiles page: the profiles kept (the newest first), a profile's page with its top functions,
its pyinstrument page, and the endpoint of the "Run profiled" buttons of the Scheduled, Retries
and Dead pages (``profiles/run/``).

Why not a running job's button: its run is under way, and can't be put under a profiler from the
middle; marking "its next run" by jid would have every job look the mark up as it starts (a round
trip each, for every job, to profile one). A waiting entry carries the mark in its payload
instead, which costs the others nothing.

The pyinstrument page is HTML made from the names in the job's code (functions, files, which a
project's code or a payload may name as it likes), so it is never shown as one of the admin's
pages: it is served with a Content-Security-Policy that sandboxes it (a unique origin: no cookie,
no request to the admin, no form, no navigation) and lets only its own inline script and style
run, or as a download.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import reverse

from ...admin.views import back, guard, int_param, render_page
from . import api, records

# (No default-src: nothing may load, connect or be framed; the page's own inline script and style run
# in a sandbox without allow-same-origin, so never as the admin's origin.)
HTML_POLICY = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
               "font-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; sandbox allow-scripts")
PAGES = ("scheduled", "retry", "dead")  # the pages whose entries may be run profiled
# pyinstrument's page keeps its view options in localStorage, which a sandboxed page (no
# allow-same-origin) may not touch: reading it threw, and the page drew nothing. This stands in for
# it, in memory, before the page's own script runs (the download is the page as made).
STORAGE_SHIM = ("<script>try{window.localStorage}catch(e){var m={};Object.defineProperty(window,'localStorage',"
                "{configurable:true,value:{getItem:function(k){return k in m?m[k]:null},setItem:function(k,v)"
                "{m[k]=String(v)},removeItem:function(k){delete m[k]},clear:function(){m={}},key:function(i)"
                "{return Object.keys(m)[i]||null},get length(){return Object.keys(m).length}}})}</script>")


def sandboxed(page: str) -> str:
    """``page`` with STORAGE_SHIM first in its head (first of all without one)."""
    at = page.lower().find("<head>")
    return page[:at + 6] + STORAGE_SHIM + page[at + 6:] if at >= 0 else STORAGE_SHIM + page


@guard(actions=False)
def profiles(request: HttpRequest, *, site: Any) -> HttpResponse:
    result = api.profiles(int_param(request, "page", 1))
    if result.number > result.pages:
        result = api.profiles(result.pages)
    return render_page(request, site, "profiles", "admin/cogworker/profiling/profiles.html", "Profiles",
                       result=result, query="", kept=records.KEPT, ttl_hours=records.TTL // 3600)


@guard(actions=False)
def profile(request: HttpRequest, ident: str, *, site: Any) -> HttpResponse:
    found = api.profile(ident)
    if found is None:
        messages.warning(request, "That profile is no longer kept (profiles are kept a day).")
        return HttpResponseRedirect(reverse(f"{site.name}:django_cogworker_profiles_changelist"))
    return render_page(request, site, "profiles", "admin/cogworker/profiling/profile.html",
                       f"Profile {found.label}", profile=found,
                       html_url=reverse(f"{site.name}:django_cogworker_profiles_html", args=[ident]))


@guard(actions=False)
def profile_html(request: HttpRequest, ident: str, *, site: Any) -> HttpResponse:
    page = api.html(ident)
    if page is None:
        raise Http404("no HTML kept for this profile")
    download = bool(request.GET.get("download"))
    response = HttpResponse(page if download else sandboxed(page), content_type="text/html; charset=utf-8")
    response["Content-Security-Policy"] = HTML_POLICY
    response["X-Content-Type-Options"] = "nosniff"
    response["Referrer-Policy"] = "no-referrer"
    response["Cross-Origin-Opener-Policy"] = "same-origin"
    if download:
        response["Content-Disposition"] = f'attachment; filename="profile-{ident}.html"'
    return response


@guard(actions=True)
def run(request: HttpRequest, *, site: Any) -> HttpResponse:
    """``profile_entry`` = "<page>:<token>": that entry enqueued now, marked to be profiled."""
    if request.method != "POST":  # (the guard lets a viewer GET: there is nothing here to look at)
        return HttpResponseNotAllowed(["POST"])
    from ... import api as cogworker_api

    page, _, token = request.POST.get("profile_entry", "").partition(":")
    if page not in PAGES or not token:
        messages.error(request, "Name the entry to run profiled.")
        return back(request, reverse(f"{site.name}:django_cogworker_profiles_changelist"))
    zset = {"scheduled": cogworker_api.ScheduledSet, "retry": cogworker_api.RetrySet,
            "dead": cogworker_api.DeadSet}[page]()
    default = reverse(f"{site.name}:django_cogworker_{page}_changelist")
    label = f"admin: {request.user.get_username()}"[:200]
    try:
        moved = api.run_profiled(zset, token, label)
    except cogworker_api.ActionRefused as exc:
        messages.error(request, str(exc))
        return back(request, default)
    if moved:
        messages.success(request, f"Enqueued now, to run profiled ({label}): its profile will be on the Profiles "
                                  f"page once it has run.")
    else:
        messages.warning(request, "That entry is no longer there (run, moved or deleted meanwhile).")
    return back(request, default)
