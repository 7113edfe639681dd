"""The outbox's system check: with OUTBOX on, every outbox database has its table.

Without it every push inside a transaction fails at its INSERT, and a worker's relay fails every
round. The check connects to those databases (``manage.py check``, ``runserver``, ``runcogworker``,
``migrate``). A table not made yet is a warning (``cogworker.W010``: run migrate), never an error:
``migrate``, which makes it, runs the checks first and stops at an error. (It was skipped when
the checks were given their databases, as migrate gives them; Django 6 gives every check the
list of databases, so it never ran there.) A table gone while its migration is recorded applied
is an error (``cogworker.E010``): migrate won't make it again. A database that doesn't answer
(refused, or silent past connect.CONNECT_TIMEOUT) is a warning (``cogworker.W011``): it was an
error, and ``runcogworker`` refused to start, its relays unable to serve the other databases
either; one that accepted and never answered hung the check, and the worker's start, silently.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.core import checks
from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.db.migrations.recorder import MigrationRecorder

from .models import OutboxJob
from .relay import connect, outbox_aliases


def table_problems(aliases: Iterable[str] | None = None) -> list[checks.CheckMessage]:
    """An error for each outbox database without the table (or that can't be asked)."""
    table = OutboxJob._meta.db_table
    found: list[checks.CheckMessage] = []
    for alias in outbox_aliases() if aliases is None else aliases:
        try:
            # (A connection of the check's own, that gives up connecting: connect.py.)
            with connect.bounded(alias) as conn, conn.cursor() as cursor:
                present = table in conn.introspection.table_names(cursor)
        except (OperationalError, InterfaceError) as exc:
            found.append(checks.Warning(
                f'COGWORKER["OUTBOX"] is on, but database {alias!r} is unreachable ({type(exc).__name__}: '
                f'{str(exc).strip()}): its outbox rows wait until it answers', id="cogworker.W011",
                hint="workers start all the same: their relays relay the other databases' rows, and try this one "
                     "again every second, saying when it is back"))
            continue
        except DatabaseError as exc:
            found.append(checks.Error(f'COGWORKER["OUTBOX"] is on, but database {alias!r} can\'t be asked for its '
                                      f'outbox table {table!r} ({type(exc).__name__}: {exc})', id="cogworker.E010"))
            continue
        if present:
            continue
        message = (f'COGWORKER["OUTBOX"] is on, but database {alias!r} has no outbox table {table!r}: pushes '
                   f'inside a transaction on it fail')
        if _made_by_a_migration_applied(alias, table):
            found.append(checks.Error(message, id="cogworker.E010", hint=(
                f"its migration is recorded as applied, so migrate won't make it again: run manage.py migrate "
                f"django_cogworker {_BEFORE} --fake --database {alias}, then manage.py migrate django_cogworker "
                f"--database {alias}")))
        else:
            found.append(checks.Warning(message, id="cogworker.W010",
                                        hint=f"run: manage.py migrate django_cogworker --database {alias}"))
    return found


_MAKES_TABLE = "0005_outbox"  # (the migration that makes the table, and the one before it)
_BEFORE = "0004"


def _made_by_a_migration_applied(alias: str, table: str) -> bool:
    """Whether ``alias`` records the migration that makes ``table`` as applied."""
    recorder = MigrationRecorder(connections[alias])
    return recorder.has_table() and ("django_cogworker", _MAKES_TABLE) in recorder.applied_migrations()

