"""A job's result record, ``result:<jid>`` (docs/jobs.md#results, docs/tasks.md).

    records      the record: its fields, JobResult, get_result(jid), the READY record of a task
    scripts      the Lua that marks an attempt started and finished
    api          job_result: the record as the admin and the CLI read it

The worker's side, writing the record as a job runs, is engine/run/results.py (for now).
"""

from . import scripts  # noqa: F401 - (its scripts named for the core's scripts.RESULT_*: broker/scripts/__init__.py)
from .records import get_result

__all__ = ["get_result"]
