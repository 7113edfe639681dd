"""The Django app: autodiscover ``jobs.py`` (and, with the tasks backend, ``tasks.py``) in installed
apps, and register the system checks."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import autodiscover_modules


class CogworkerConfig(AppConfig):
    name = "django_cogworker"
    verbose_name = "Cogworker"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the checks

        autodiscover_modules("jobs")
        discover_tasks(getattr(settings, "TASKS", None))


BACKEND_PATH = "django_cogworker.tasks.CogworkerBackend"


def cogworker_backends(tasks_setting: object) -> dict[str, Mapping[str, Any]]:
    """The entries of ``settings.TASKS`` whose backend is this package's, by alias."""
    if not isinstance(tasks_setting, Mapping):
        return {}
    return {str(alias): params for alias, params in tasks_setting.items()
            if isinstance(params, Mapping) and params.get("BACKEND") == BACKEND_PATH}


def task_option_problems(tasks_setting: object) -> list[str]:
    """Every problem of the ``TASKS`` entries of CogworkerBackend (tasks/options.py), in alias order:
    what ``manage.py check`` reports (cogworker.E005) and ``runcogworker`` refuses to start with."""
    ours = cogworker_backends(tasks_setting)
    if not ours:
        return []
    from .tasks import options

    return [problem for alias in sorted(ours) for problem in options.read(alias, ours[alias]).problems]


def discover_tasks(tasks_setting: object) -> None:
    """With a CogworkerBackend in ``TASKS``: import each app's ``tasks.py`` and ``OPTIONS["MODULES"]``.

    The only tasks a worker runs are those these imports declare: a payload naming any other
    path is dead on arrival, and nothing named by a payload is ever imported. (A MODULES entry that
    doesn't exist is a check error, not a traceback out of django.setup(): tasks/options.py.)
    """
    ours = cogworker_backends(tasks_setting)
    if not ours:
        return
    from .tasks import options

    autodiscover_modules("tasks")
    for alias, params in ours.items():
        for module in options.read(alias, params).modules:
            try:
                import_module(module)
            except ImportError as exc:
                raise ImproperlyConfigured(f'TASKS["{alias}"]["OPTIONS"]["MODULES"]: {module!r} '
                                           f"could not be imported: {exc}") from exc
