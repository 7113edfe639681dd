"""The processor's failure path, which must not fail in turn: the dead entry of a job whose own filing
failed, the words a failure's log line says of where it went, and logging that never raises (a
traceback that can't be formatted, a 10 MB message)."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from ...push import payload as payloads
from ..settle.retry import Filing
from .tracebacks import ExcInfo


def fate_of(filing: Filing | None) -> str:
    """Where a failed job went, for its log line: "retry 1 in 17s", "dead: retries exhausted"."""
    if filing is None:
        return "discarded: dead=False"
    if filing.target == "retry":
        return f"retry {filing.payload.get('retry_count', 0) + 1} in {max(filing.score - time.time(), 0):.0f}s"
    return f"dead: {filing.payload.get('dead_reason', '')}"


def dead_filing(raw: bytes, reason: str, exc: BaseException | None) -> Filing:
    """A dead entry for a job whose own filing failed: its payload as pushed (not as the job left
    it), with the error and the reason; kept as it came if it can't be written back (1e309 in its
    args reads as inf), the raw bytes in a dead letter if it can't even be read."""
    now = time.time()
    try:
        payload = payloads.decode(raw)
        payload.update(error_class=payloads.error_class(exc) if exc is not None else "CogworkerError",
                       error_message=payloads.error_message(exc) if exc is not None else reason,
                       failed_at=now, dead_reason=payloads.safe_string(reason, payloads.ERROR_MESSAGE_LIMIT))
        filing = Filing("dead", now, payload)
        try:
            filing.raw()
        except ValueError:  # (a number JSON can't hold)
            filing = filing.as_stored(raw)
        return filing
    except BaseException:  # noqa: BLE001 - unreadable: keep the bytes
        return Filing("dead", now, payloads.dead_letter(raw, reason, now))


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
