"""Django's task API, from wherever this install has it: ``django.tasks`` (Django 6.x) or the
``django-tasks`` backport (``django_tasks``, Django 5.2: ``pip install django-cogworker[tasks]``).

The two define the same classes (the backport's ``InvalidTaskError`` is 6.x's ``InvalidTask``);
everything else in the package imports them from here. Importing this module without either
raises ImportError saying what to install.
"""

from __future__ import annotations

try:
    from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started

    SOURCE = "django.tasks"
except ImportError:
    try:
        from django_tasks import TaskContext, TaskResult, TaskResultStatus, task, task_backends
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskError
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
    except ImportError as exc:
        raise ImportError("django_cogworker.tasks needs Django 6 (django.tasks) or, on Django 5.2, the backport: "
                          "pip install 'django-cogworker[tasks]'") from exc

    SOURCE = "django_tasks"

__all__ = ["SOURCE", "BaseTaskBackend", "InvalidTask", "Task", "TaskContext", "TaskError", "TaskResult",
           "TaskResultDoesNotExist", "TaskResultStatus", "task", "task_backends", "task_enqueued", "task_finished",
           "task_started"]


