"""Django's task API on cogworker: ``TASKS = {"default": {"BACKEND": "django_cogworker.tasks.CogworkerBackend"}}``.

    backend   CogworkerBackend, the backend; each ``@task`` function pushed and run as a job
    api       Django's task API from wherever this install has it (``django.tasks``, or the
              django-tasks backport on Django 5.2)
"""

from .backend import CogworkerBackend, CogworkerTask

__all__ = ["CogworkerBackend", "CogworkerTask"]
