"""Logging that never raises into the job's path: a traceback that can't be formatted, a 10 MB message."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

from ...push import payload as payloads
from .tracebacks import ExcInfo


def log_safely(log: Callable[..., None], message: str, *args: Any,
               exc_info: BaseException | ExcInfo | None = None) -> None:
    """Log, never raise: an exception whose traceback can't be formatted (a ``__notes__`` that
    raises, say) made the logging call itself raise and killed the processor mid-filing.

    An exception with a message longer than ERROR_MESSAGE_LIMIT (a job's 10 MB message was
    logged whole with its traceback, on every attempt) is shown cut there, like in its payload:
    its stack and its message, without ``exc_info``.
    """
    try:
        if isinstance(exc_info, BaseException):
            exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
        if exc_info is not None and not _fits_a_log(exc_info[1]):
            message, args, exc_info = message + "\n%s", (*args, _short_traceback(exc_info[1], exc_info[2])), None
        log(message, *args, exc_info=exc_info)
    except BaseException:  # noqa: BLE001
        try:
            log(message + " (traceback not shown: it could not be formatted)", *args)
        except BaseException:  # noqa: BLE001
            pass


def _fits_a_log(exc: BaseException) -> bool:
    """Whether every message of ``exc`` and of the exceptions chained to it is at most ERROR_MESSAGE_LIMIT long."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 100:
        seen.add(id(current))
        try:
            if len(str(current)) > payloads.ERROR_MESSAGE_LIMIT:
                return False
        except BaseException:  # noqa: BLE001 - a __str__ that raises is shown by the traceback as such
            pass
        current = current.__cause__ or current.__context__
    return True


def _short_traceback(exc: BaseException, tb: TracebackType | None) -> str:
    """The stack ``tb`` of ``exc`` and its message cut at ERROR_MESSAGE_LIMIT (chained exceptions left out)."""
    import traceback

    try:
        stack = "".join(traceback.format_tb(tb))
    except BaseException:  # noqa: BLE001
        stack = ""
    message = payloads.error_message(exc)
    return (f"Traceback (most recent call last):\n{stack}{payloads.error_class(exc)}: {message}\n"
            f"(messages cut at {payloads.ERROR_MESSAGE_LIMIT} characters; chained exceptions not shown)")
