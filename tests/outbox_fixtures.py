"""What the outbox's test modules share: the database a test's transactions run on, and the
exception that rolls one back. (Named ``*_fixture`` here, as engine_fixtures.py's are, so a
test's parameter doesn't shadow an import.)"""

from __future__ import annotations

import pytest


class Boom(Exception):
    """Raised inside ``transaction.atomic()`` to roll it back."""


@pytest.fixture(name="alias", params=["default", "pg", "mysql"])
def alias_fixture(request) -> str:
    """The database the test's transactions run on: SQLite, PostgreSQL, then MariaDB/MySQL."""
    return request.param
