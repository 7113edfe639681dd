"""CPU affinity of worker processes (``CPU_AFFINITY``): each process of ``--processes N`` on a CPU of its own.

Why it pays: a Python process runs one thread's Python at a time (the GIL),
and a job changes threads several times (the fetcher hands it to a processor,
the processor's Redis calls give the GIL away and take it back, the idle
token goes back to the fetcher). Left free, the kernel spreads those threads
over every CPU, and each hand-over between two CPUs is a cross-CPU wake-up
(an inter-processor interrupt: dearer still in a VM) and cold caches. Measured
on a 2-CPU VM with no-op jobs (docs/benchmarks.md): one worker pinned to one
CPU ran 1.4x the jobs per second on 0.64x the CPU per job.

What it costs: a pinned process can't spread C code that releases the GIL
(compression, hashing, NumPy) over several CPUs, and a CPU chosen here can't be
left for a less busy one when other work arrives. So "auto" pins only the
workers of a supervisor (``--processes N``), and only when there are at least as
many workers as CPUs the supervisor may run on (``--processes auto``, or N on an
N-CPU machine or cpuset): each CPU then has one worker and nothing is taken from
anyone else. Fewer workers than CPUs (``--processes 2`` in a container that sees
a 32-CPU host, as a Kubernetes pod without a dedicated cpuset does) stay free:
every such pod would otherwise pin its first worker to the same CPU. A lone
``runcogworker`` is not pinned either (several started by hand would share a CPU). A process
"auto" leaves free instead keeps its threads on one CPU while it is bound by its GIL, and only
then (confine.py).
A list of CPU numbers pins a lone process (to those CPUs), or deals them out to
a supervisor's workers in turn: for when the operator knows the machine.

Linux only (``os.sched_setaffinity``): elsewhere "auto" is a no-op and a list
is refused at startup.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from ...errors import ConfigError

logger = logging.getLogger(__name__)

AUTO = "auto"
NONE = "none"


def supported() -> bool:
    return hasattr(os, "sched_setaffinity")


def cpus_for(setting: str | Sequence[int], index: int | None, allowed: Sequence[int],
             processes: int = 1) -> frozenset[int] | None:
    """The CPUs worker ``index`` of ``processes`` (index None: a lone process) runs on, or None to leave it free.

    ``allowed`` is what the process may run on now (a container's cpuset narrows it): "auto"
    deals those out by index when there are at least as many workers as CPUs.
    """
    if isinstance(setting, str):  # "auto" or "none"
        if setting != AUTO or index is None or not allowed or processes < len(allowed):
            return None
        ordered = sorted(allowed)
        return frozenset({ordered[index % len(ordered)]})
    cpus = list(setting)  # (validated: a non-empty list of CPU numbers)
    if index is None:
        return frozenset(cpus)
    return frozenset({cpus[index % len(cpus)]})


def check(setting: str | Sequence[int]) -> None:
    """Raise ConfigError naming the setting when the CPUs it lists can't be had here.

    Called at startup, before any fork: a worker silently left free would hide the typo, and
    a worker failing on it would only be restarted, again and again.
    """
    if isinstance(setting, str):  # "auto" or "none"
        return
    if not supported():
        raise ConfigError(['COGWORKER["CPU_AFFINITY"] lists CPUs, which needs Linux (os.sched_setaffinity); '
                           'use "auto" or "none"'])
    allowed = os.sched_getaffinity(0)
    missing = sorted(set(setting) - allowed)
    if missing:
        raise ConfigError([f'COGWORKER["CPU_AFFINITY"] lists CPU {", ".join(map(str, missing))}, which this '
                           f'process can\'t run on; it may run on {", ".join(map(str, sorted(allowed)))}'])


def apply(setting: str | Sequence[int], index: int | None, processes: int = 1) -> frozenset[int] | None:
    """Pin this process as ``setting`` says for worker ``index`` of ``processes`` (None: a lone process).

    Return the CPUs, or None if it is left free (or pinning failed: logged, the worker runs
    all the same, only slower).
    """
    if not supported():
        return None
    cpus = cpus_for(setting, index, sorted(os.sched_getaffinity(0)), processes)
    if cpus is None:
        return None
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:
        logger.warning("could not pin to CPU %s (CPU_AFFINITY): %s; running unpinned",
                       ", ".join(map(str, sorted(cpus))), exc)
        return None
    logger.info("pinned to CPU %s (CPU_AFFINITY)", ", ".join(map(str, sorted(cpus))))
    return cpus
