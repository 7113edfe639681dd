"""The running job's context for log records: its jid and class on every line it logs.

A processor enters the context around each run (:func:`enter`, :func:`leave`); records logged on that
thread meanwhile, by the job, the ORM or any library, get ``jid`` and ``job_class`` from
:class:`JobContextFilter` once a handler carries it, for a format string to use::

    "%(asctime)s %(levelname)s [%(job_class)s %(jid)s] %(name)s: %(message)s"

Outside a job both read ``-``. A ``ContextVar`` rather than a thread-local, so an
``async def perform`` (run on its own loop, whose tasks copy the context) keeps it too. A
thread the job starts itself begins with an empty context, as Python gives every new thread.

This module configures nothing: ``runcogworker`` puts the filter on every handler the project's
logging configuration has (:func:`add_context`: its format may then use the fields, whatever
the configuration) and on the handler it adds to a root logger that has none; a web process's
handlers get it from the project's ``LOGGING`` (see docs/jobs.md). :class:`MarkPrinted` and
:class:`NotPrinted` keep that added handler from printing a record a second time.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from collections.abc import Iterable

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


# Set on a record by MarkPrinted: a console handler printed it.
_PRINTED = "_cogworker_printed"


class MarkPrinted(logging.Filter):
    """Mark each record this handler prints, for :class:`NotPrinted` (last on a console handler).

    Last, so it sees only the records the handler's own filters let through (the logger already
    checked the handler's level): exactly those it prints.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        setattr(record, _PRINTED, True)
        return True


class NotPrinted(logging.Filter):
    """Drop a record a console handler nearer its logger already printed (see :class:`MarkPrinted`).

    For a handler on the root logger, which sees each record last: a project's handler on a
    logger that propagates printed its records, then the root's printed them again.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, _PRINTED, False)


def configured_handlers() -> list[logging.Handler]:
    """Every handler on a logger now (the root's, then each named logger's), each once."""
    loggers = [logging.getLogger(), *(logger for logger in logging.Logger.manager.loggerDict.values()
                                      if isinstance(logger, logging.Logger))]
    return list({id(handler): handler for logger in loggers for handler in logger.handlers}.values())


def add_context(handlers: Iterable[logging.Handler]) -> None:
    """Put a JobContextFilter first on each of ``handlers`` that has none: its format, and its
    own filters, may use ``jid``, ``job_class`` and ``job_context`` whatever the configuration.

    Filters of the handlers, not a record factory: a factory sets the fields on the record before
    ``extra=`` is applied, and logging raises KeyError for an ``extra={"jid": ...}`` then (a job
    logging the jid of a job it pushed would fail). The filter leaves those their own.
    """
    for handler in handlers:
        if not any(isinstance(f, JobContextFilter) for f in handler.filters):
            handler.filters.insert(0, JobContextFilter())


def is_console(handler: logging.Handler) -> bool:
    """Whether ``handler`` prints to this process's stdout or stderr (a file handler doesn't)."""
    return (isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
            and handler.stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__))
