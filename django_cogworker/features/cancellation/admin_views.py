"""Cancel a job from the admin: one endpoint (``busy/cancel/``) that the Cancel buttons of the
Processes page (running jobs), a queue's jobs, the Scheduled and Retries pages and a limit's
holders post to, by jid, through ``django_cogworker.cancel``.

A waiting job (in its queue, scheduled, retrying) is taken off and counted ("removed"); a
running one is asked to stop ("signalled"), or, with ``interrupt``, has ``Cancelled`` raised in
its thread: that one asks first, as Stop does (its code is cut wherever it is). A jid that is
nowhere (it finished, or moved meanwhile) is a warning, not an error page; a batch's hand-over
job (``django_cogworker.chain_next``, ``batch_child_done``) is refused with the reason.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.urls import reverse

from ...admin.views import back, confirm, confirmed, guard


@guard(actions=True)
def cancel(request: HttpRequest, *, site: Any) -> HttpResponse:
    if request.method != "POST":  # (the guard lets a viewer GET: there is nothing here to look at)
        return HttpResponseNotAllowed(["POST"])
    # Imported here: the core's public cancel (features/cancellation/cancel.py), needed only when a button is pressed.
    from ...errors import JobNotFound, NotCancellable
    from .cancel import cancel as cancel_job

    default = reverse(f"{site.name}:django_cogworker_busy_changelist")
    jid = request.POST.get("jid", "").strip()
    interrupt = request.POST.get("interrupt") == "yes"
    if not jid:
        messages.error(request, "Name the job to cancel (its jid).")
        return back(request, default)
    if interrupt and not confirmed(request):
        return confirm(request, site, "busy", f"Interrupt job {jid}? Cancelled is raised in its thread wherever "
                       f"its code is (a transaction is rolled back, a file may be left half written); it is not "
                       f"retried.", "Yes, interrupt it")
    try:
        outcome = cancel_job(jid, interrupt=interrupt)
    except JobNotFound:
        messages.warning(request, f"Job {jid} is nowhere to cancel: it finished, or was moved or deleted "
                                  f"meanwhile.")
        return back(request, default)
    except NotCancellable as exc:
        messages.error(request, f"Job {jid} can't be cancelled: {exc}.")
        return back(request, default)
    if outcome == "removed":
        messages.success(request, f"Job {jid} cancelled: taken off where it waited; it won't run.")
    elif interrupt:
        messages.success(request, f"Job {jid} is running: it is interrupted when its process reads the request "
                                  f"(at its next heartbeat).")
    else:
        messages.success(request, f"Job {jid} is running: asked to stop (its process reads the request at its "
                                  f"next heartbeat; Interrupt cuts a job that doesn't stop).")
    return back(request, default)
