"""Progress for every job (docs/jobs.md): ``self.progress(done, total=None, note="")``, and
``get_progress(jid)``.

    tracker      one run's latest report, written to ``progress:<jid>`` at most once a second
    api          Progress, get_progress, progress_of (read); report, current (Job.progress, a run's tracker)
    hook         the run's last report written at its end; the report deleted with the job
    declaration  what it provides the core: ``Job.progress``; its report deleted for a job dying off the path

Shown by the admin's busy page (templates/admin/cogworker/progress/), ``cogworker busy`` and a
task's result (tasks/progress.py: ``task_progress``, ``report_progress``).
"""

from .api import Progress, get_progress

__all__ = ["Progress", "get_progress"]
