"""rq: plain functions, run by `rq worker` (SimpleWorker in-process, or Worker forking per job)."""

from . import common


def noop(t=0.0):
    common.noop(t)


def stamp(t=0.0):
    common.stamp(t)
