"""The Django app: autodiscover ``jobs.py`` in installed apps and register the system checks."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class CogworkerConfig(AppConfig):
    name = "django_cogworker"
    verbose_name = "Cogworker"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the checks

        autodiscover_modules("jobs")
