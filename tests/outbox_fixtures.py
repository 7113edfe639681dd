"""What the outbox's test modules share: the database a test's transactions run on, and the
exception that rolls one back. (Named ``*_fixture`` here, as engine_fixtures.py's are, so a
test's parameter doesn't shadow an import.)"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Iterator

import pytest
from helpers import _state, wait_until


class Boom(Exception):
    """Raised inside ``transaction.atomic()`` to roll it back."""


@pytest.fixture(name="alias", params=["default", "pg", "mysql"])
def alias_fixture(request) -> str:
    """The database the test's transactions run on: SQLite, PostgreSQL, then MariaDB/MySQL."""
    return request.param


@contextlib.contextmanager
def stopped(server) -> Iterator[None]:
    """Within: redis-server ``server`` stopped (SIGSTOP: a frozen host, not a refusal). Its port
    still accepts (the kernel's backlog) and a command sent is never answered: each waits out its
    socket timeout. Woken (SIGCONT) at the end, it runs what was sent meanwhile."""
    os.kill(server.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: _state(server.pid) in ("T", "t"), timeout=10, interval=0.01, message="redis stopped")
        yield
    finally:
        os.kill(server.pid, signal.SIGCONT)


@contextlib.contextmanager
def silent_port() -> Iterator[int]:
    """Within: a port of 127.0.0.1 that accepts connections and never answers (a database host
    frozen, or a firewall that lets the handshake through): a listening socket nobody reads. The
    kernel completes each connection's handshake from its backlog; nothing is ever sent back."""
    with socket.create_server(("127.0.0.1", 0), backlog=64) as server:
        yield server.getsockname()[1]
