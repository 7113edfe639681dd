"""The Django app: autodiscover ``jobs.py`` (and, with the tasks backend, ``tasks.py``) in installed
apps, and register the system checks."""

from __future__ import annotations

from importlib import import_module

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import autodiscover_modules


class CogworkerConfig(AppConfig):
    name = "django_cogworker"
    verbose_name = "Cogworker"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from . import (
            checks,  # noqa: F401 - registers the checks
            retries,
        )
        from .outbox import retry, units

        # (A dead outbox unit names no queue: its retry hands it back to the outbox.)
        retries.register(units.UNIT_CLASS, retry.retry_unit)

        autodiscover_modules("jobs")
        discover_tasks(getattr(settings, "TASKS", None))


def discover_tasks(tasks_setting: object) -> None:
    """With a CogworkerBackend in ``TASKS``: import each app's ``tasks.py`` and ``OPTIONS["MODULES"]``.

    The only tasks a worker runs are those these imports declare: a payload naming any other
    path is dead on arrival, and nothing named by a payload is ever imported. (A MODULES entry that
    doesn't exist is a check error, not a traceback out of django.setup(): tasks/options.py.)
    """
    from .checks import cogworker_backends

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
