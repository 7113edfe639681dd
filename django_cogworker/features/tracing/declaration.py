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

_runtime: Any = None  # (push.runtime and spans, imported on the first push asked: the Django edge,
_spans: Any = None    # and the module that imports OpenTelemetry, neither on import)


def _on() -> bool:
    """TRACING, read on each push (a test or ``use_config`` may change the config of a process
    whose setters live on): the config's field, not an import statement per push."""
    return bool(_runtime.get_config().tracing)


def _pushes(job_class: Any, options: Mapping[str, Any]) -> bool:
    """Asked once per setter: False without the OpenTelemetry API (the push pays nothing then)."""
    global _runtime, _spans
    if _runtime is None:
        from ...push import runtime

        _runtime = runtime
    if not (_on() and available()):
        return False
    if _spans is None:
        from . import spans

        _spans = spans
    return True


def _send(payload: dict[str, Any], job_class: Any, options: Mapping[str, Any],
          head: Sequence[tuple[str, str]], due: float | None) -> None:
    if _on():  # (asked again: the setter of a plain perform_async is kept for the process's life)
        _spans.send([payload])


def _send_bulk(items: Sequence[dict[str, Any]], job_class: Any, options: Mapping[str, Any]) -> None:
    if _on():
        _spans.send(items, bulk=True)


DECLARATION = Declaration("tracing", pushes=_pushes, on_push=_send, on_push_bulk=_send_bulk)
