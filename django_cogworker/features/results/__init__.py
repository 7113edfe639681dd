"""A job's result record, ``result:<jid>`` (docs/jobs.md#results, docs/tasks.md).

    records      the record: its fields, JobResult, get_result(jid), the READY record of a task
    scripts      the Lua that marks an attempt started and finished
    api          job_result: the record as the admin and the CLI read it

The worker's side: writer.py writes the record as a job runs, hook.py calls it from the job's path.
"""

from .records import get_result

__all__ = ["get_result"]
