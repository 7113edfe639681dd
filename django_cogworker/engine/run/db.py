"""Django database hygiene around each job, as around a request."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.db.backends.signals import connection_created

# Set in a thread once it has opened a database connection (Django's connection_created
# signal is sent in the thread that connects). Connections are per thread, so a processor
# thread that never connected has none to close: for such jobs (most of a typical
# queue's no-DB work) the two close_old_connections() calls, about 12 µs per job of
# GIL-held time walking DATABASES, are skipped.
_thread_state = threading.local()


# Set once any thread opened one: a job on the event loop reaches the database through asgiref's
# sync_to_async, on its one thread-sensitive thread, not its own (acall below).
_anywhere = threading.Event()


def _connected(sender: Any, connection: Any, **kwargs: Any) -> None:
    _thread_state.connected = True
    _anywhere.set()


connection_created.connect(_connected, weak=False, dispatch_uid="django_cogworker.engine.run.db.connected")


class CloseOldConnections:
    """Server middleware, always outermost: drop unusable or expired DB connections before and after a job.

    A worker thread lives for days; without this a connection past
    CONN_MAX_AGE, or broken by a database restart, fails every later job.
    """

    def __init__(self, run: Callable[[Any, dict], Any]):
        self.run = run

    def __call__(self, job: Any, payload: dict) -> Any:
        if getattr(_thread_state, "connected", False):
            close_old_connections()
        try:
            return self.run(job, payload)
        finally:
            if getattr(_thread_state, "connected", False):
                close_old_connections()

    async def acall(self, job: Any, payload: dict) -> Any:
        """The same around a job on the event loop (self.run is then the next async step). Its
        connections are those of the thread Django's async ORM uses (sync_to_async's
        thread-sensitive one): closed there, as Django's ASGI handler does around a request."""
        if _anywhere.is_set():
            await sync_to_async(close_old_connections)()
        try:
            return await self.run(job, payload)
        finally:
            if _anywhere.is_set():
                await sync_to_async(close_old_connections)()
