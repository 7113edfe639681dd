"""An outbox row holds the jobs of one push (``jobs``: how many), not one job: a perform_bulk of
1,000 jobs was 1,000 rows, whose INSERT and DELETE cost more than its push. On PostgreSQL the
payload column is stored uncompressed (a bulk's payloads, ~170 KB for 1,000 jobs, were compressed
at every INSERT for a row deleted moments later: about half its cost)."""

from django.db import migrations, models


def _store_payload_uncompressed(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE cogworker_outbox ALTER COLUMN payload SET STORAGE EXTERNAL")


def _store_payload_compressed(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE cogworker_outbox ALTER COLUMN payload SET STORAGE EXTENDED")


class Migration(migrations.Migration):

    dependencies = [
        ('django_cogworker', '0005_outbox'),
    ]

    operations = [
        migrations.AddField(
            model_name='outboxjob',
            name='jobs',
            field=models.PositiveIntegerField(default=1),
        ),
        migrations.RunPython(_store_payload_uncompressed, _store_payload_compressed),
    ]
