"""A connection to an outbox database that gives up connecting: the relay's, and the system check's.

A database host that accepts and never answers (frozen, or behind a firewall that lets the
handshake through) held a connect for ever: libpq waits without a bound unless ``connect_timeout``
is set. The check (``manage.py check``, and ``runcogworker`` at its start) then hung silently,
and a relay's thread never came back from it.

:func:`bounded` gives this thread, for a block, a connection of its own to an alias, made from
the alias's settings with a connect timeout added (CONNECT_TIMEOUT, unless its OPTIONS set one):
the project's own connections, and their settings, are left as they are.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from django.db import connections

CONNECT_TIMEOUT = 5  # seconds a connect waits (a whole number: libpq's connect_timeout is one, at least 2)

# The OPTIONS key each backend's driver reads its connect timeout from (psycopg and libpq; MySQLdb,
# mysqlclient and PyMySQL). SQLite opens a file.
_OPTION = {"postgresql": "connect_timeout", "mysql": "connect_timeout"}


def with_timeout(settings_dict: dict[str, Any], vendor: str, seconds: int = CONNECT_TIMEOUT) -> dict[str, Any]:
    """``settings_dict`` with a connect timeout of ``seconds`` in its OPTIONS, unless it has one."""
    option = _OPTION.get(vendor)
    options = settings_dict.get("OPTIONS") or {}
    if option is None or option in options:
        return settings_dict
    return {**settings_dict, "OPTIONS": {**options, option: seconds}}


@contextlib.contextmanager
def bounded(alias: str, seconds: int = CONNECT_TIMEOUT) -> Iterator[Any]:
    """Within: ``connections[alias]`` in this thread is a connection of its own whose connect gives
    up after ``seconds``; closed at the end, the thread's own given back."""
    previous = connections[alias]
    conn = connections.create_connection(alias)
    conn.settings_dict = with_timeout(conn.settings_dict, conn.vendor, seconds)
    connections[alias] = conn
    try:
        yield conn
    finally:
        try:
            conn.close()
        finally:
            connections[alias] = previous
