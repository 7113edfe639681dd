"""The two profilers behind one interface: ``start`` one on this thread, ``stop`` it, read its top
functions by cumulative time, and (pyinstrument's) its HTML page.

pyinstrument when it can be imported (the ``profile`` extra): a sampling profiler, cheap on a
job that makes millions of calls, whose HTML page shows the call tree; else the standard
library's cProfile, which counts every call (exact call counts; a job of many small calls runs
slower under it, 2x and more).

Another profiler already active on the thread (a project's own cProfile or pyinstrument, a
debugger's or a coverage tool's ``sys.setprofile``) is left alone: replacing it would switch it off
without a word, and on Python 3.12+ cProfile's ``enable`` refuses outright ("Another profiling tool
is already active", sys.monitoring has one profiler slot per process: a second profiled job
running at the same time on another thread meets it too). The run then goes on unprofiled, and
``start`` says why.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any, Protocol

from ... import engine

TOP = 50  # functions kept, by cumulative time
# pyinstrument's sampling interval: 5 ms, above the coarse clock's resolution (4 ms on Linux), so it
# reads that cheap clock and prints no "timer overhead" warning to the worker's stderr; a job worth
# profiling runs for far longer than a few samples.
INTERVAL = 0.005

# The worker's own frames around the job (the processor's call, run_job, this feature's hook): each
# holds the run's whole time, and would fill the top of every profile with the same rows.
WRAPPERS = tuple(os.path.dirname(os.path.abspath(path)) + os.sep for path in (engine.__file__, __file__))

_pyinstrument: bool | None = None


def pyinstrument_available() -> bool:
    """Whether pyinstrument can be imported (asked once per process, importing nothing)."""
    global _pyinstrument
    if _pyinstrument is None:
        try:
            _pyinstrument = importlib.util.find_spec("pyinstrument") is not None
        except (ImportError, ValueError):
            _pyinstrument = False
    return _pyinstrument


class Session(Protocol):
    """One run under a profiler, started on the thread that runs it."""

    name: str

    def stop(self) -> None: ...

    def top(self, limit: int = TOP) -> list[dict[str, Any]]:
        """The functions by cumulative time, the most first: ``function``, ``where`` (file:line),
        ``calls`` (None for a sampling profiler), ``cumtime`` and ``tottime`` (seconds)."""
        ...

    def html(self) -> str | None: ...


class CProfileSession:
    name = "cProfile"

    def __init__(self) -> None:
        import cProfile

        self.profiler = cProfile.Profile()
        self.profiler.enable()  # (ValueError on 3.12+ when another tool holds the profiler slot)

    def stop(self) -> None:
        self.profiler.disable()

    def top(self, limit: int = TOP) -> list[dict[str, Any]]:
        import pstats

        # {(file, line, function): (primitive calls, calls, tottime, cumtime, callers)}
        stats: dict[tuple[str, int, str], tuple[Any, ...]] = pstats.Stats(self.profiler).stats  # type: ignore[attr-defined]
        rows = sorted(((key, value) for key, value in stats.items()
                       if "_lsprof.Profiler" not in key[2] and not key[0].startswith(WRAPPERS)),
                      key=lambda item: (-item[1][3], -item[1][2]))
        return [{"function": function, "where": _where(file, line), "calls": calls, "cumtime": round(cumtime, 6),
                 "tottime": round(tottime, 6)}
                for (file, line, function), (_primitive, calls, tottime, cumtime, _callers) in rows[:limit]]

    def html(self) -> str | None:
        return None


class PyinstrumentSession:
    name = "pyinstrument"

    def __init__(self) -> None:
        from pyinstrument import Profiler

        # (async_mode disabled: a job's run is one synchronous call; "enabled" follows an event
        # loop's tasks, which a worker's processor thread has none of.)
        self.profiler = Profiler(interval=INTERVAL, async_mode="disabled")
        self.profiler.start(caller_frame=sys._getframe(1), target_description="cogworker job")

    def stop(self) -> None:
        self.profiler.stop()

    def top(self, limit: int = TOP) -> list[dict[str, Any]]:
        """Each function's time summed over the stacks it was sampled in, counted once per stack (a
        recursive call isn't counted twice), as cProfile's cumulative time."""
        session = self.profiler.last_session
        root = session.root_frame() if session is not None else None
        if root is None:  # (no sample: a run shorter than the interval)
            return []
        found: dict[tuple[str, str, int], list[float]] = {}
        stack: list[tuple[Any, frozenset[tuple[str, str, int]]]] = [(root, frozenset())]
        while stack:
            frame, above = stack.pop()
            if frame.file_path is None:  # (pyinstrument's "[self]" and "[await]" pseudo-frames)
                continue
            key = (frame.function or "?", frame.file_path, frame.line_no or 0)
            times = found.setdefault(key, [0.0, 0.0])
            if key not in above:
                times[0] += frame.time
            times[1] += frame.total_self_time
            stack.extend((child, above | {key}) for child in frame.children)
        rows = sorted(((key, times) for key, times in found.items() if not key[1].startswith(WRAPPERS)),
                      key=lambda item: (-item[1][0], -item[1][1]))
        return [{"function": function, "where": _where(file, line), "calls": None, "cumtime": round(cum, 6),
                 "tottime": round(own, 6)} for (function, file, line), (cum, own) in rows[:limit]]

    def html(self) -> str | None:
        return str(self.profiler.output_html())


def _where(file: str, line: int) -> str:
    return "built-in" if file in ("~", "<built-in>") else f"{file}:{line}"


def start(prefer: str | None = None) -> tuple[Session | None, str]:
    """A profiler started on this thread, and its name; or None and why the run goes unprofiled.

    ``prefer``: "pyinstrument" or "cProfile"; None: pyinstrument when it can be imported."""
    if sys.getprofile() is not None:  # (pyinstrument, a debugger, cProfile before 3.12: setprofile)
        return None, "another profiler was active on the worker's thread (sys.setprofile)"
    use_pyinstrument = prefer == "pyinstrument" or (prefer is None and pyinstrument_available())
    try:
        session: Session = PyinstrumentSession() if use_pyinstrument else CProfileSession()
    except (ValueError, RuntimeError) as exc:  # ("Another profiling tool is already active")
        return None, f"the profiler could not start: {exc}"
    return session, session.name
