from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from .jobs import SendReceipt


# Demo convenience: GET works from a browser, POST from curl without a CSRF token.
@csrf_exempt
@require_http_methods(["GET", "POST"])
def enqueue(request: HttpRequest) -> JsonResponse:
    """Enqueue SendReceipt(order_id) (order_id from the query/form, default 1); return its jid."""
    raw = request.POST.get("order_id") or request.GET.get("order_id") or "1"
    try:
        order_id = int(raw)
    except ValueError:
        return JsonResponse({"error": "order_id must be an integer"}, status=400)
    return JsonResponse({"jid": SendReceipt.perform_async(order_id)})
