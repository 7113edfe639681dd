"""The outbox table: jobs pushed inside a transaction, written with it, waiting for Redis.

The package's one real table. A row is written in the pushing transaction (so a rollback leaves
none), handed to Redis at commit and deleted; a row still here after that is the relay's
(``relay.py``): Redis was away at commit, or the pushing process died before it pushed.
"""

from __future__ import annotations

from django.db import models


class OutboxJob(models.Model):
    """The jobs of one push waiting to reach Redis: their payloads as the client middleware let them through."""

    id = models.BigAutoField(primary_key=True)  # (the relay's order: oldest first)
    jid = models.CharField(max_length=255)  # (the first job's, for a row of several)
    # The payload's JSON, "at" (a scheduled job's epoch seconds) included; for a row of several
    # jobs (a perform_bulk), a JSON array of their payloads: one row per push, not per job.
    payload = models.TextField()
    jobs = models.PositiveIntegerField(default=1)  # how many jobs the payload holds
    created = models.FloatField()  # epoch seconds (the pushing host's clock)
    # Where a database can't skip locked rows (SQLite), a relay claims rows by writing these.
    claimed_by = models.CharField(max_length=32, default="", blank=True)
    claimed_until = models.FloatField(default=0.0)

    class Meta:
        db_table = "cogworker_outbox"
        verbose_name, verbose_name_plural = "outbox", "outbox"
        default_permissions = ()

    def __str__(self) -> str:
        return f"outbox job {self.jid}"
