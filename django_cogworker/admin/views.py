"""The Cogworker admin pages: dashboard, queues, busy, periodic, quarantine (the sets are in ``set_views``,
the batches in ``batch_views``).

Every page reads and acts through ``api``, never Redis itself. GET shows;
every action is a POST (CSRF-checked by ``admin_view``) that needs the change
permission, and redirects back (post/redirect/get). Actions that destroy or
stop something ask first: the POST without ``confirmed=yes`` renders a
confirmation page that posts the same fields again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.text import capfirst

from .. import api, models
from ..errors import CogworkerError
from . import charts
from .permissions import can_change, can_view

REFRESH_CHOICES = (2, 5, 10, 30)
QUEUES_PER_PAGE = 50
GROUPS_PER_PAGE = 25  # a queue's groups shown on its page, the busiest first (a group per tenant: 100,000)


def guard(*, actions: bool) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """GET/HEAD need the view permission; POST (only where ``actions``) the change permission."""

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @functools.wraps(view)
        def inner(request: HttpRequest, *args: Any, site: Any, **kwargs: Any) -> HttpResponse:
            request.current_app = site.name  # {% url 'admin:...' %} resolves to this site
            if request.method in ("GET", "HEAD"):
                if not can_view(request.user):
                    raise PermissionDenied
            elif request.method == "POST" and actions:
                if not can_change(request.user):
                    raise PermissionDenied
            else:
                return HttpResponseNotAllowed(["GET", "HEAD", "POST"] if actions else ["GET", "HEAD"])
            return view(request, *args, site=site, **kwargs)

        return inner

    return decorate


def tabs(site: Any, current: str) -> list[dict[str, Any]]:
    return [{"label": capfirst(model._meta.verbose_name_plural), "current": model._meta.model_name == current,
             "url": reverse(f"{site.name}:django_cogworker_{model._meta.model_name}_changelist")}
            for model in models.PAGES]


class PageResponse(TemplateResponse):
    """A page whose text UTF-8 can't carry (a lone surrogate from a payload: "\\ud800" is valid JSON)
    is written with backslash escapes, where the default encoding raised: a 500 for the whole list."""

    def make_bytes(self, value: Any) -> bytes:
        if isinstance(value, str):
            return value.encode(self.charset, "backslashreplace")
        return super().make_bytes(value)


def render_page(request: HttpRequest, site: Any, page: str, template: str, title: str,
                **context: Any) -> TemplateResponse:
    page_url = reverse(f"{site.name}:django_cogworker_{page}_changelist")
    return PageResponse(request, template, {
        **site.each_context(request), "title": title, "page": page, "page_url": page_url,
        "tabs": tabs(site, page), "can_change": can_change(request.user), "here": request.get_full_path(),
        **context})


def back(request: HttpRequest, default: str) -> HttpResponseRedirect:
    """Redirect to the form's ``next`` (same host only) or ``default``."""
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                           require_https=request.is_secure()):
        target = default
    return HttpResponseRedirect(target)


def confirmed(request: HttpRequest) -> bool:
    return request.POST.get("confirmed") == "yes"


def confirm(request: HttpRequest, site: Any, page: str, question: str, button: str,
            **replace: str) -> TemplateResponse:
    """Ask before a destructive action: the same fields (those in ``replace`` changed), posted
    again with ``confirmed=yes``."""
    fields = [(name, value) for name, values in request.POST.lists()
              if name not in ("csrfmiddlewaretoken", "confirmed", *replace) for value in values]
    fields += list(replace.items())
    cancel = request.POST.get("next") or reverse(f"{site.name}:django_cogworker_{page}_changelist")
    if not url_has_allowed_host_and_scheme(cancel, allowed_hosts={request.get_host()}):
        cancel = reverse(f"{site.name}:django_cogworker_{page}_changelist")
    return render_page(request, site, page, "admin/cogworker/confirm.html", "Are you sure?", question=question,
                       button=button, fields=fields, cancel_url=cancel)


def int_param(request: HttpRequest, name: str, default: int) -> int:
    """The integer in the query string; ``default`` when it isn't one. Out of range is ``api``'s to clamp."""
    try:
        return int(request.GET.get(name, default))
    except ValueError:
        return default


def result_times(result: Any) -> list[tuple[str, Any]]:
    """A result record's times, labelled, for its box (admin/cogworker/result.html)."""
    if result is None:
        return []
    return [("Enqueued", result.enqueued_at), ("Started", result.started_at),
            ("Last attempted", result.last_attempted_at), ("Finished", result.finished_at)]


def paged(read: Callable[[int], api.Page], request: HttpRequest) -> api.Page:
    """``read`` the page the query string asks for; past the end, the last one."""
    result = read(int_param(request, "page", 1))
    return read(result.pages) if result.number > result.pages else result


@guard(actions=False)
def dashboard(request: HttpRequest, *, site: Any) -> HttpResponse:
    stats = api.Stats()
    _count_readers(stats.queue_rows)
    refresh = int_param(request, "refresh", 0)
    result_jid = request.GET.get("result", "").strip()[:200]  # (a jid is 24 characters; a task's id 32)
    result = api.job_result(result_jid) if result_jid else None
    return render_page(request, site, "dashboard", "admin/cogworker/dashboard.html", "Dashboard", stats=stats,
                       queues=stats.queue_rows, chart=charts.history_chart(stats.history),
                       refresh=refresh if refresh in REFRESH_CHOICES else 0, refresh_choices=REFRESH_CHOICES,
                       result_jid=result_jid, result=result, result_times=result_times(result))


@guard(actions=True)
def queues(request: HttpRequest, *, site: Any) -> HttpResponse:
    page_url = reverse(f"{site.name}:django_cogworker_queue_changelist")
    if request.method == "POST":
        action = request.POST.get("action")
        if action == "prune":
            messages.success(request, f"{api.Queue.prune():,} empty queues taken off the list (a push lists "
                                      f"its queue again).")
            return back(request, page_url)
        try:
            queue = _posted_queue(request)
        except ValueError as exc:
            messages.error(request, str(exc))
            return back(request, page_url)
        name = queue.name
        if action in ("pause_group", "resume_group"):
            return _group_action(request, queue, action, page_url)
        if action == "pause":
            queue.pause()
            messages.success(request, f"Queue {name} paused: processes stop fetching from it at their next beat.")
        elif action == "unpause":
            queue.unpause()
            messages.success(request, f"Queue {name} unpaused.")
        elif action == "clear":
            if not confirmed(request):
                return confirm(request, site, "queue",
                               f"Delete {all_of(queue.size(), 'job')} waiting in queue {name}? They will not run.",
                               "Yes, clear the queue")
            messages.success(request, f"Queue {name} cleared: {counted(queue.clear(), 'job')} deleted.")
        else:
            messages.error(request, f"Unknown action {action!r}.")
        return back(request, page_url)
    result = paged(lambda number: api.Queue.page(number, QUEUES_PER_PAGE), request)
    _count_readers(result.items)
    return render_page(request, site, "queue", "admin/cogworker/queues.html", "Queues", result=result,
                       query="")


def counted(count: int, noun: str) -> str:
    """``1 job``, ``3 jobs``, ``1 entry``, ``2 entries``: a count as a message says it (not "1 jobs deleted")."""
    return f"{count:,} {noun if count == 1 else noun[:-1] + 'ies' if noun.endswith('y') else noun + 's'}"


def all_of(count: int, noun: str) -> str:
    """``the 1 job``, ``all 3 jobs``: what a confirmation asks to act on."""
    return f"{'the' if count == 1 else 'all'} {counted(count, noun)}"


def _count_readers(rows: list[api.QueueRow]) -> None:
    """Set each row's ``readers``: a queue no live process reads has jobs that wait forever."""
    readers = api.ProcessSet().readers()
    for row in rows:
        row.readers = readers.get(row.queue.name, 0)


def _group_action(request: HttpRequest, queue: api.Queue, action: str, page_url: str) -> HttpResponse:
    """Pause or resume one group of ``queue`` (its page's Groups table: features/fairness/)."""
    group = request.POST.get("group", "")
    try:
        changed = queue.pause_group(group) if action == "pause_group" else queue.resume_group(group)
    except CogworkerError as exc:
        messages.error(request, str(exc))
        return back(request, page_url)
    if action == "pause_group":
        messages.success(request, f"Group {group} of queue {queue.name} paused: its jobs wait until resumed."
                         if changed else f"Group {group} of queue {queue.name} was paused already.")
    else:
        messages.success(request, f"Group {group} of queue {queue.name} resumed." if changed
                         else f"Group {group} of queue {queue.name} wasn't paused.")
    return back(request, page_url)


def _posted_queue(request: HttpRequest) -> api.Queue:
    """The queue a form names: ``queue`` (text), or ``queue_hex`` for a name that isn't UTF-8 or is empty."""
    hexed = request.POST.get("queue_hex")
    if hexed is not None:
        return api.Queue(bytes.fromhex(hexed))
    return api.Queue(request.POST.get("queue", ""))


@guard(actions=False)
def queue_jobs(request: HttpRequest, queue: str, *, site: Any) -> HttpResponse:
    q = api.Queue(queue)
    if not q.exists():  # (a mistyped name showed an "empty" queue that isn't there)
        raise Http404(f"No queue named {queue!r}.")
    per_page = int_param(request, "per_page", 25)
    jobs = paged(lambda number: q.jobs(number, per_page), request)
    groups = q.groups(int_param(request, "gpage", 1), GROUPS_PER_PAGE)  # (its lanes: features/fairness/)
    if groups.page.number > groups.page.pages:
        groups = q.groups(groups.page.pages, GROUPS_PER_PAGE)
    query = request.GET.copy()
    query.pop("page", None)
    group_query = request.GET.copy()
    group_query.pop("gpage", None)
    return render_page(request, site, "queue", "admin/cogworker/queue_jobs.html", f"Queue {queue}", queue=q,
                       jobs=jobs, paused=q.paused, latency=q.latency(), query=query.urlencode(), groups=groups,
                       group_query=group_query.urlencode())


@guard(actions=True)
def busy(request: HttpRequest, *, site: Any) -> HttpResponse:
    page_url = reverse(f"{site.name}:django_cogworker_busy_changelist")
    if request.method == "POST":
        action, identity = request.POST.get("action"), request.POST.get("identity", "")
        process = api.ProcessSet().get(identity)
        if process is None:
            messages.warning(request, f"Process {identity} is no longer running.")
        elif action not in ("quiet", "stop", "dump"):
            messages.error(request, f"Unknown action {action!r}.")
        elif action == "stop" and not confirmed(request):
            return confirm(request, site, "busy", f"Stop process {identity}? Jobs it can't finish within its "
                           f"shutdown timeout go back to their queues.", "Yes, stop it")
        else:
            process.signal(action)
            messages.success(request, f"Sent {action} to {identity}: it acts on it at its next heartbeat.")
        return back(request, page_url)
    # The workers of one supervisor together, in slot order; a lone process sorts by its identity.
    processes = sorted(api.ProcessSet(), key=lambda p: (p.supervisor or p.identity, p.index or 0, p.identity))
    works = list(api.Workers())
    progress = api.progress_of([w.job.jid for w in works])  # (one round trip for every row: features/progress/)
    return render_page(request, site, "busy", "admin/cogworker/busy.html", "Processes", processes=processes,
                       works=[(w, progress.get(w.job.jid or "")) for w in works])


@guard(actions=True)
def periodic(request: HttpRequest, *, site: Any) -> HttpResponse:
    page_url = reverse(f"{site.name}:django_cogworker_periodic_changelist")
    if request.method == "POST":
        action, pjid = request.POST.get("action"), request.POST.get("pjid", "")
        entry = api.PeriodicEntry.get(pjid)
        if entry is None:
            messages.warning(request, f"No published periodic entry {pjid}.")
        elif action == "enable":
            entry.enable()
            messages.success(request, f"Periodic entry {pjid} enabled: it runs from its next slot.")
        elif action == "disable":
            entry.disable()
            messages.success(request, f"Periodic entry {pjid} disabled: its slots are skipped until enabled.")
        elif action == "enqueue":
            try:
                jid = entry.enqueue_now()
            except api.ActionRefused as exc:
                messages.error(request, str(exc))
            else:
                messages.success(request, f"Periodic entry {pjid} enqueued now as jid {jid}.")
        elif action == "forget":
            entry.forget()
            messages.success(request, f"Periodic entry {pjid} taken off the list (a process that still "
                                      f"declares it lists it again within a minute).")
        else:
            messages.error(request, f"Unknown action {action!r}.")
        return back(request, page_url)
    rows = [{"entry": e, "next_run": e.next_run(), "stale": e.stale()} for e in api.PeriodicEntry.all()]
    return render_page(request, site, "periodic", "admin/cogworker/periodic.html", "Periodic", rows=rows)


@guard(actions=True)
def quarantine(request: HttpRequest, *, site: Any) -> HttpResponse:
    page_url = reverse(f"{site.name}:django_cogworker_quarantine_changelist")
    if request.method == "POST":
        action, key = request.POST.get("action"), request.POST.get("key", "")
        quarantined = api.QuarantinedKey.get(key)
        if quarantined is None:
            messages.warning(request, f"{key} is no longer in quarantine.")
        elif action == "delete":
            if not confirmed(request):
                return confirm(request, site, "quarantine", f"Delete {key} ({quarantined.type}, "
                               f"{quarantined.size or 0:,} elements) for good?", "Yes, delete it")
            quarantined.delete()
            messages.success(request, f"{key} deleted.")
        elif action == "restore":
            try:
                restored = quarantined.restore()
            except api.ActionRefused as exc:
                messages.warning(request, str(exc))
            else:
                if restored:
                    messages.success(request, f"{key} restored as {quarantined.original}.")
                else:
                    messages.warning(request, f"{quarantined.original} exists: delete or rename it first "
                                              f"(nothing was changed).")
        else:
            messages.error(request, f"Unknown action {action!r}.")
        return back(request, page_url)
    keys = api.QuarantinedKey.all()
    return render_page(request, site, "quarantine", "admin/cogworker/quarantine.html", "Quarantine", keys=keys,
                       limit=api.QUARANTINE_LIMIT)
