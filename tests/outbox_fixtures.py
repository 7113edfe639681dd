"""What the outbox's test modules share: the database a test's transactions run on, and the
exception that rolls one back. (Named ``*_fixture`` here, as engine_fixtures.py's are, so a
test's parameter doesn't shadow an import.)"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from django.db import connections
from helpers import RedisServer, _state, wait_until

from django_cogworker.broker.keys import Keys
from django_cogworker.outbox.models import OutboxJob
from django_cogworker.outbox.relay import relay_once, row_jobs
from django_cogworker.push import runtime


@pytest.fixture(name="outbox")
def outbox_fixture(settings, redis_url):
    """OUTBOX on, on the suite's Redis."""
    settings.COGWORKER = {**settings.COGWORKER, "OUTBOX": True, "REDIS_URL": redis_url}
    yield
    runtime.reset()


@pytest.fixture(name="away")
def away_fixture(settings, tmp_path):
    """OUTBOX on, on a Redis of the test's own (``away.kill()`` takes it away, ``restart`` back)."""
    server = RedisServer(tmp_path / "redis").start()
    settings.COGWORKER = {**settings.COGWORKER, "OUTBOX": True, "REDIS_URL": server.url,
                          "REDIS_OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 2}}
    yield server
    runtime.reset()
    server.cleanup()


def rows(alias: str) -> list[str]:
    """The jids of the jobs waiting in ``alias``'s outbox, oldest first."""
    return [job["jid"] for row in OutboxJob.objects.using(alias).order_by("id") for job in row_jobs(row)]


def relay(alias: str) -> int:
    """One relay round on ``alias``, taking every row however fresh."""
    client = runtime.get_client()
    try:
        return relay_once(alias, client.hand_over, runtime.get_redis(), Keys(), now=time.time(), fresh=0)
    finally:
        if threading.current_thread() is not threading.main_thread():
            connections.close_all()  # (a thread's own connections)


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
