"""The metrics view a project mounts in its URLconf:

    from django_cogworker.metrics import metrics_view
    urlpatterns += [path("cogworker/metrics", metrics_view)]

Who may read it: a scraper sending ``Authorization: Bearer <COGWORKER["METRICS_TOKEN"]>``, or a
logged-in user who may look at the admin's Cogworker pages (``admin.permissions.can_view``).
No credentials: 401 (with ``WWW-Authenticate: Bearer``); a wrong token, or a user without the
permission: 403. Redis is read at each scrape; nothing is cached.
"""

from __future__ import annotations

import hmac
import logging

import redis as redis_lib
from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe

from ..admin.permissions import can_view
from ..push import runtime
from .collect import collect
from .exposition import CONTENT_TYPE, render

logger = logging.getLogger(__name__)


def _refusal(request: HttpRequest) -> HttpResponse | None:
    """The response that refuses this request, or None when it may read the metrics."""
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, token = header.partition(" ")
        expected = runtime.get_config().metrics_token
        # compare_digest: the time taken says nothing of how much of the token was right.
        if scheme.lower() == "bearer" and expected and hmac.compare_digest(token.strip().encode(), expected.encode()):
            return None
        return HttpResponse("forbidden: wrong token\n", status=403, content_type="text/plain")
    user = getattr(request, "user", None)  # (absent without the auth middleware)
    if can_view(user):
        return None
    if user is not None and user.is_authenticated:
        return HttpResponse("forbidden: this user may not view Cogworker\n", status=403, content_type="text/plain")
    response = HttpResponse("authentication needed: a bearer token (COGWORKER[\"METRICS_TOKEN\"]) or a staff "
                            "login\n", status=401, content_type="text/plain")
    response["WWW-Authenticate"] = 'Bearer realm="cogworker"'
    return response


@login_not_required  # (under LoginRequiredMiddleware a scraper would be sent to a login page)
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    try:
        body = render(collect())
    except (redis_lib.exceptions.ConnectionError, redis_lib.exceptions.TimeoutError) as exc:
        # A 503 the scrape records as down (``up == 0``), not a page of zeros that looks healthy.
        logger.warning("metrics: Redis unreachable: %s", exc)
        return HttpResponse("Redis unreachable\n", status=503, content_type="text/plain")
    response = HttpResponse(body, content_type=CONTENT_TYPE)
    response["Cache-Control"] = "no-store"
    return response
