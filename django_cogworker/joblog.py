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

A line about a job (the processor's start, done, fail) names it with a :class:`Mention`, which a
handler whose format shows the job already leaves out (:class:`JobShown`): the job's jid and
class once on each line, whatever the handler's format.
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


class Mention:
    """`` jid=<jid> class=<class>`` as an argument of a message about a job, printed unless the
    handler printing the record shows the job already (:class:`JobShown`, put there by
    :func:`add_context`).

    With the job's context in a handler's format (runcogworker's own, or a project's with
    ``%(job_context)s``), each start and done line had the jid and the class twice; without it
    (a format of the project's that doesn't use the fields, pytest's caplog) a bare "start" would
    name no job. The message is formatted per handler, so the choice is made per handler: the
    JobShown filter, last on its handler, hides the mention for that handler's formatting only.
    """

    __slots__ = ("jid", "job_class", "_hidden")

    def __init__(self, jid: str, job_class: str):
        self.jid = jid
        self.job_class = job_class
        self._hidden = False

    def hide_once(self) -> None:
        """Leave the mention out of the next formatting of its message (the next handler's own)."""
        self._hidden = True

    def __str__(self) -> str:
        if self._hidden:
            self._hidden = False  # (another handler, formatting the same record next, decides for itself)
            return ""
        return f" jid={self.jid} class={self.job_class}"


class JobShown(logging.Filter):
    """Last on a handler whose format shows the running job: a record it prints leaves out the
    :class:`Mention` in its message.

    Last, so it acts only for a record its handler prints: an earlier filter dropping it would
    leave the mention hidden for the next handler, whose format may show no job.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        for arg in record.args if isinstance(record.args, tuple) else ():
            if isinstance(arg, Mention):
                arg.hide_once()
        return True


def shows_job(handler: logging.Handler) -> bool:
    """Whether ``handler``'s format prints the running job (``job_context``, or ``jid`` and
    ``job_class``). False for a formatter with no format string (a JSON one, say): a line then
    names the job twice rather than not at all."""
    fmt = getattr(handler.formatter, "_fmt", None)
    return isinstance(fmt, str) and ("job_context" in fmt or ("jid" in fmt and "job_class" in fmt))


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

    A handler whose format shows the job also gets a :class:`JobShown`, last, so that a line
    about a job names it once (see :class:`Mention`): add_context comes after the handler's
    formatter and its other filters are set.
    """
    handlers = list(handlers)
    for handler in handlers:
        if not any(isinstance(f, JobContextFilter) for f in handler.filters):
            handler.filters.insert(0, JobContextFilter())
    name_once(handlers)


def name_once(handlers: Iterable[logging.Handler]) -> None:
    """A :class:`JobShown`, last, on each of ``handlers`` whose format shows the job: a line about
    a job names it once there. Also run where jobs run outside runcogworker (the test helpers,
    testing/runner.py), where the project's LOGGING is left as it is otherwise."""
    for handler in handlers:
        if shows_job(handler) and not any(isinstance(f, JobShown) for f in handler.filters):
            handler.addFilter(JobShown())


def is_console(handler: logging.Handler) -> bool:
    """Whether ``handler`` prints to this process's stdout or stderr (a file handler doesn't)."""
    return (isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
            and handler.stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__))
