"""The admin's entry points: one unmanaged model per Cogworker page, with no table.

They exist so the pages sit in the Django admin as any app's models do: listed
under "Cogworker" on the admin index, the app index and the sidebar, with the
admin's URLs (``/admin/django_cogworker/<page>/``), breadcrumbs, login and
permissions. ``managed = False``: no table is created and nothing queries them;
the data lives in Redis and is read through ``api``.

Two permissions, on Dashboard, guard every page (the others have none, so the
permission list shows just these two): ``django_cogworker.view_cogworker`` to
look, ``django_cogworker.change_cogworker`` to act (retry, delete, pause,
quiet...). A user with the second may also look.
"""

from __future__ import annotations

from django.db import models

# The outbox's table (the package's one real model): Django finds an app's models in models.py.
from .outbox.models import OutboxJob  # noqa: F401


class _Page(models.Model):
    class Meta:
        abstract = True
        managed = False
        default_permissions = ()


class Dashboard(_Page):
    class Meta(_Page.Meta):
        verbose_name = verbose_name_plural = "dashboard"
        permissions = [
            ("view_cogworker", "Can view the Cogworker pages"),
            ("change_cogworker", "Can act from the Cogworker pages (retry, delete, pause, quiet...)"),
        ]


class Queue(_Page):
    class Meta(_Page.Meta):
        verbose_name, verbose_name_plural = "queue", "queues"


class Busy(_Page):
    """The live processes and what each runs (Sidekiq's "Busy"): named "processes", as the admin index
    sorts by name and listed "Busy" before the Dashboard (its URL stays ``busy/``)."""

    class Meta(_Page.Meta):
        verbose_name, verbose_name_plural = "process", "processes"


class Scheduled(_Page):
    class Meta(_Page.Meta):
        verbose_name = verbose_name_plural = "scheduled"


class Retry(_Page):
    class Meta(_Page.Meta):
        verbose_name, verbose_name_plural = "retry", "retries"


class Dead(_Page):
    class Meta(_Page.Meta):
        verbose_name = verbose_name_plural = "dead"


class Batches(_Page):
    """Batches and their jobs (read only): named "job batches", as the admin index sorts by name and
    would list "Batches" before the Dashboard; the class is not ``Batch``, which is the batch API's
    (``django_cogworker.Batch``). Its URL is ``batches/``."""

    class Meta(_Page.Meta):
        verbose_name, verbose_name_plural = "job batch", "job batches"


class Limits(_Page):
    """The limiters' keys: in use, holders, refusals (read only; a job holding one is cancelled from
    Processes). Named "limits": listed after the Dashboard, which the admin index sorts by name."""

    class Meta(_Page.Meta):
        verbose_name, verbose_name_plural = "limit", "limits"


class Periodic(_Page):
    class Meta(_Page.Meta):
        verbose_name = verbose_name_plural = "periodic"


class Quarantine(_Page):
    class Meta(_Page.Meta):
        verbose_name = verbose_name_plural = "quarantine"


class Outbox(_Page):
    """The transactional outbox's page: rows waiting, the oldest's age, relay now (outbox/)."""

    class Meta(_Page.Meta):
        verbose_name = verbose_name_plural = "outbox"


class Metrics(_Page):
    """The metrics history: classes by run time, percentiles, a chart each, deploy marks (read only;
    features/history/)."""

    class Meta(_Page.Meta):
        verbose_name = verbose_name_plural = "metrics"


class Profiles(_Page):
    """Jobs run under a profiler on request, kept a day (features/profiling/): read only here; its
    "Run profiled" buttons are on the Scheduled, Retries and Dead pages."""

    class Meta(_Page.Meta):
        verbose_name, verbose_name_plural = "profile", "profiles"


# In the order of the pages' tab bar.
PAGES: tuple[type[models.Model], ...] = (Dashboard, Queue, Busy, Scheduled, Retry, Dead, Batches, Limits,
                                         Metrics, Profiles, Periodic, Quarantine, Outbox)
# Pages without an action: listed with a "View" link, whatever the user may change.
READ_ONLY_PAGES: tuple[type[models.Model], ...] = (Dashboard, Batches, Limits, Metrics, Profiles)
