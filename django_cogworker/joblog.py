"""The running job's context for log records: its jid and class on every line it logs.

A processor enters the context around each run (:func:`enter`, :func:`leave`); records logged on that
thread meanwhile, by the job, the ORM or any library, get ``jid`` and ``job_class`` from
:class:`JobContextFilter` once a handler carries it, for a format string to use::

    "%(asctime)s %(levelname)s [%(job_class)s %(jid)s] %(name)s: %(message)s"

Outside a job both read ``-``. A ``ContextVar`` rather than a thread-local, so an
``async def perform`` (run on its own loop, whose tasks copy the context) keeps it too. A
thread the job starts itself begins with an empty context, as Python gives every new thread.

This module configures nothing: ``runcogworker`` puts the filter on the handler it adds when
the project has configured no logging, and a project that has puts it on its own (see
docs/jobs.md).
"""

from __future__ import annotations

import contextvars
import logging

NONE = "-"

_current: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("cogworker_job", default=None)


def current() -> tuple[str, str] | None:
    """Return ``(jid, class)`` of the job running on this thread (or task), or None."""
    return _current.get()


def enter(jid: str, job_class: str) -> contextvars.Token:
    """Mark what this thread logs from now on as the run of ``jid`` (already printable); see :func:`leave`."""
    return _current.set((jid, job_class))


def leave(token: contextvars.Token) -> None:
    """End the run :func:`enter` began."""
    _current.reset(token)


class JobContextFilter(logging.Filter):
    """Add ``jid`` and ``job_class`` (``-`` outside a job) to every record; filters nothing out.

    Also ``job_context``: `` class=<class> jid=<jid>`` in a job, empty outside, for a format
    that shows it only where there is one (runcogworker's own, as Sidekiq's).

    Put it on a handler, not a logger: a logger's filters see only the records logged on
    that very logger, not those propagated from its children (the project's own modules).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        job = _current.get()
        # (A record that already carries them, from ``extra=``, keeps its own.)
        if not hasattr(record, "jid"):
            record.jid = job[0] if job is not None else NONE
        if not hasattr(record, "job_class"):
            record.job_class = job[1] if job is not None else NONE
        if not hasattr(record, "job_context"):
            record.job_context = f" class={job[1]} jid={job[0]}" if job is not None else ""
        return True
