"""A failed job's traceback as its user reads it: from the user's code in.

A job that raised in ``perform`` logged, and stored in ``error_backtrace``, the worker's own way
to it first: the processor, the features' ``around`` hooks, the server middleware, ``run_job``,
``call_perform``; eight frames before the user's one, and with ``backtrace = 5`` four of the five
kept were the package's. Sidekiq's backtrace cleaner leaves the framework's frames out in a Rails
app; here only the outer run of the package's frames is left out, from the processor down to the
first frame of code that isn't the package's (``perform``, a project's middleware or feature). A
frame of the package inside the user's call (a Limiter, a push made from ``perform``) stays, and a
traceback with no frame of the user's (an unknown class, a package feature's own error) is kept whole.

The exception itself is left as it is: tracebacks are linked outermost first, so the trimmed one
is a later link of the same chain, for the log line and the stored backtrace only. A debugger, or
a caller of the job's path that gets the exception back, sees every frame.
"""

from __future__ import annotations

from types import TracebackType

# What a logging call takes as ``exc_info``.
ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]

# The package's top-level name: a frame whose module is it or under it is the package's own.
_PACKAGE = __name__.partition(".")[0]
# Plumbing the package's path runs an ``async def perform`` through (push/job.py's call_perform:
# asgiref's async_to_sync, which hands the coroutine's error back through a future): not the user's.
_PLUMBING = ("asgiref", "concurrent", "asyncio")


def from_user_code(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` from its first frame that is neither the package's nor its plumbing's; ``tb`` itself
    if it has none."""
    current = tb
    while current is not None:
        module = current.tb_frame.f_globals.get("__name__")
        if not isinstance(module, str) or module.partition(".")[0] not in (_PACKAGE, *_PLUMBING):
            return current
        current = current.tb_next
    return tb


def trimmed(exc: BaseException) -> ExcInfo:
    """``exc`` as ``exc_info`` for a log call, its traceback from the user's code in."""
    return type(exc), exc, from_user_code(exc.__traceback__)
