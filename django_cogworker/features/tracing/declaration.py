"""What the tracing feature declares (django_cogworker/declarations.py): no class option, and a push
hook that makes each push's PRODUCER span and puts its context in the payload (``trace``).

A payload built anywhere goes through it: ``perform_async``/``perform_in``/``perform_at``, a task's
``enqueue``, a periodic entry's run, a batch callback (built as the batch is opened: it carries the
context of the code that opened it) and a workflow's step (built by the step before it, in that
step's run: a child of its span). A bulk push (``perform_bulk``, a group's steps) makes one span for
all its payloads (``on_push_bulk``). The context stays outside an encrypted job's seal: the seal
takes ``args`` and ``kwargs`` only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...declarations import Declaration
from . import available


def _on() -> bool:
    from ...push import runtime  # (the Django edge: read on a push)

    return bool(runtime.get_config().tracing)


def _pushes(job_class: Any, options: Mapping[str, Any]) -> bool:
    """Asked once per setter: False without the OpenTelemetry API (the push pays nothing then)."""
    return _on() and available()


def _send(payload: dict[str, Any], job_class: Any, options: Mapping[str, Any],
          head: Sequence[tuple[str, str]], due: float | None) -> None:
    if _on():  # (asked again: the setter of a plain perform_async is kept for the process's life)
        from .spans import send

        send([payload])


def _send_bulk(items: Sequence[dict[str, Any]], job_class: Any, options: Mapping[str, Any]) -> None:
    if _on():
        from .spans import send

        send(items, bulk=True)


DECLARATION = Declaration("tracing", pushes=_pushes, on_push=_send, on_push_bulk=_send_bulk)
