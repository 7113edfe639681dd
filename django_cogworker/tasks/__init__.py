"""Django's task API on cogworker: ``TASKS = {"default": {"BACKEND": "django_cogworker.tasks.CogworkerBackend"}}``.

    backend   CogworkerBackend, the backend; each ``@task`` function pushed and run as a job
    progress  task_progress(result), report_progress(done, total, note): a task's progress (TaskResult
              has no field for it)
    api       Django's task API from wherever this install has it (``django.tasks``, or the
              django-tasks backport on Django 5.2)
"""

from .backend import CogworkerBackend, CogworkerTask
from .progress import report_progress, task_progress

__all__ = ["CogworkerBackend", "CogworkerTask", "report_progress", "task_progress"]
