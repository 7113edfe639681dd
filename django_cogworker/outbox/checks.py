"""The outbox's system check (cogworker.E010): with OUTBOX on, every outbox database has its table.

Without it every push inside a transaction fails at its INSERT, and a worker's relay fails every
round. The check connects to those databases: it runs in ``manage.py check``, ``runserver`` and
``runcogworker``, and not in ``migrate`` (nor ``check --database``), which pass ``databases``:
migrate is what makes the table, and an error there would keep it from running.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.core import checks
from django.db import DatabaseError, connections

from .models import OutboxJob
from .relay import outbox_aliases


def table_problems(aliases: Iterable[str] | None = None) -> list[checks.CheckMessage]:
    """An error for each outbox database without the table (or that can't be asked)."""
    table = OutboxJob._meta.db_table
    found: list[checks.CheckMessage] = []
    for alias in outbox_aliases() if aliases is None else aliases:
        try:
            with connections[alias].cursor() as cursor:
                present = table in connections[alias].introspection.table_names(cursor)
        except DatabaseError as exc:
            found.append(checks.Error(f'COGWORKER["OUTBOX"] is on, but database {alias!r} can\'t be asked for its '
                                      f'outbox table {table!r} ({type(exc).__name__}: {exc})', id="cogworker.E010"))
            continue
        if not present:
            found.append(checks.Error(f'COGWORKER["OUTBOX"] is on, but database {alias!r} has no outbox table '
                                      f'{table!r}: pushes inside a transaction on it fail', id="cogworker.E010",
                                      hint=f"run: manage.py migrate django_cogworker --database {alias}"))
    return found

