"""How a running job is stopped from another thread: a timeout's JobTimeout, a cancel's Cancelled.

A job on a processor thread has the exception raised in that thread (:class:`ThreadInterrupt`:
CPython's ``PyThreadState_SetAsyncExc``, timeouts.py says what that can't stop). A job on the event
loop has its task cancelled (:class:`TaskInterrupt`), and the exception raised from the await the
cancel lands in: at the job's next await, which a job that blocks the loop never reaches (the
loop's lag watch reports it: engine/loop/lag.py).

Both are sent from the timeout watcher's thread or the heartbeat's chore thread, and withdrawn
by the run's own code once it returned (sent late, the exception would hit the worker's code,
not the job's).
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
from collections.abc import Coroutine
from typing import Any, Protocol


def raise_in_thread(thread_id: int, exc_type: type[BaseException] | BaseException | None) -> int:
    """Raise ``exc_type`` in the thread ``thread_id`` at its next bytecode (None clears a pending one)."""
    return ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                                      ctypes.py_object(exc_type) if exc_type else None)


class Interrupt(Protocol):
    def send(self, exc: type[BaseException] | BaseException) -> None: ...

    def withdraw(self) -> None: ...


class ThreadInterrupt:
    """Stops the job running on the thread that made it (its processor's)."""

    __slots__ = ("thread_id",)

    def __init__(self, thread_id: int | None = None):
        self.thread_id = threading.get_ident() if thread_id is None else thread_id

    def send(self, exc: type[BaseException] | BaseException) -> None:
        raise_in_thread(self.thread_id, exc)

    def withdraw(self) -> None:
        raise_in_thread(self.thread_id, None)


class TaskInterrupt:
    """Stops a job's task on the event loop: ``send`` (from any thread) cancels it, and :meth:`run`,
    the run's innermost await, turns that cancel into the exception sent. Made by the loop runner
    for each job; ``task`` is its call's, once :meth:`run` made it."""

    __slots__ = ("loop", "task", "pending", "withdrawn")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.task: asyncio.Task | None = None
        self.pending: type[BaseException] | BaseException | None = None
        self.withdrawn = False

    def send(self, exc: type[BaseException] | BaseException) -> None:
        self.loop.call_soon_threadsafe(self._fire, exc)

    def _fire(self, exc: type[BaseException] | BaseException) -> None:
        # (On the loop's thread, as ``withdraw``: one that came after the run returned does nothing;
        # one that came before its call's task was made cancels that task as it is made: ``run``.)
        task = self.task
        if self.withdrawn or (task is not None and task.done()) or self.pending is not None:
            return
        self.pending = exc
        if task is not None:
            task.cancel()

    def withdraw(self) -> None:
        self.withdrawn = True

    async def run(self, call: Coroutine[Any, Any, Any]) -> Any:
        """Await ``call`` (the job's own) in a task of its own, which ``send`` cancels; a cancel this
        interrupt sent raises its exception, from the await the job was in."""
        self.task = task = asyncio.ensure_future(call)
        if self.pending is not None:  # (sent while the around hooks ran: before there was a task)
            task.cancel()
        try:
            return await task
        except asyncio.CancelledError:
            exc = self.pending
            if exc is None:
                raise
            raise (exc() if isinstance(exc, type) else exc) from None
