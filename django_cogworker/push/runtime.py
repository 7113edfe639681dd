"""The process-wide config, Redis client and job client, built lazily from Django settings.

This is the Django edge's one shared state. Everything here is built on first
use and dropped by :func:`reset` (and when a test changes ``COGWORKER``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from django.core.signals import setting_changed
from django.db import connections, transaction

from ..conf import Config, build_config
from ..errors import PushLostAtCommit
from . import commit
from .client import Client

logger = logging.getLogger(__name__)

_lock = threading.RLock()
_config: Config | None = None
_redis: Any = None
_client: Any = None
_override: Any = None  # a testing client (fake/inline mode) when set
# A worker's processor thread: a client on a connection of its own (see own_connection).
_own = threading.local()


def get_config() -> Config:
    global _config
    with _lock:
        if _config is None:
            from django.conf import settings

            _config = build_config(getattr(settings, "COGWORKER", None), os.environ)
        return _config


def get_redis() -> Any:
    """The shared redis-py client (bytes responses) for this config; in a worker's processor
    thread, on a lone Redis, a client on that thread's own connection (see :func:`own_connection`):
    ask for it where it is used, and keep it no longer than the call (:func:`get_shared_redis`)."""
    client = _redis
    if client is not None:  # (built: no lock to take on every call; jobs call this per command)
        if getattr(_own, "wanted", False):
            return _own_client(client)
        return client
    client = get_shared_redis()
    return _own_client(client) if getattr(_own, "wanted", False) else client


def get_shared_redis() -> Any:
    """The shared redis-py client, in a worker's processor thread too: for what outlives the call
    that builds it or serves other threads (the engine's objects, the api's), which must not keep
    one thread's own connection (STYLE.md 20)."""
    global _redis
    client = _redis
    if client is not None:
        return client
    with _lock:
        if _redis is None:
            from ..broker.connection import make_redis

            _redis = make_redis(get_config())
        return _redis


@contextlib.contextmanager
def own_connection() -> Iterator[None]:
    """Within: :func:`get_redis` in this thread is a client holding one connection of its own.

    The worker runs each processor thread in it. A job's command through the shared client
    checks a connection out of the pool and back in, under the pool's lock, with a fork check:
    with ten threads trading the GIL, about a fifth of a small command's cost, paid on every
    command of every job. One thread, one connection: it is the pool's all the same (same
    options, same reconnects after an error), held from the thread's first command to its end.
    A lone Redis only: on Sentinel the pool re-checks the primary as connections are taken,
    which a held connection would skip through a failover; a cluster client has no such pool.
    """
    _own.wanted = True
    try:
        yield
    finally:
        _own.wanted = False
        client = _own.__dict__.pop("client", None)
        if client is not None:
            client[1].close()  # (its connection back to the pool)


def _own_client(shared: Any) -> Any:
    """This thread's own client on ``shared``'s pool (built on first use), or ``shared``."""
    held = getattr(_own, "client", None)
    if held is not None and held[0] is shared:
        return held[1]
    import redis

    from ..broker.cluster import is_cluster_url
    from ..broker.sentinel import is_sentinel_url

    url = get_config().redis_url
    if type(shared) is not redis.Redis or is_sentinel_url(url) or is_cluster_url(url):
        _own.wanted = False  # (for good: this thread uses the shared client)
        return shared
    if held is not None:  # (built on a client since replaced by reset(): its pool is closed)
        held[1].close()
    try:
        own = _held_client_class()(connection_pool=shared.connection_pool, single_connection_client=True)
    except redis.RedisError:  # (Redis away: it connects at once) this command fails as it would have
        return shared
    _own.client = (shared, own)
    return own


_HeldClient: Any = None
QUIET_CHECK = 0.05  # seconds: a held connection quiet this long is checked before its next command


def _held_client_class() -> Any:
    """redis.Redis, but an interrupted command drops its connection (built once, on first use)."""
    global _HeldClient
    if _HeldClient is None:
        import redis

        from ..broker import replies

        class HeldClient(redis.Redis):
            """A client on one held connection, checked before a command as the pool checks a
            connection it hands out, when it has been quiet for QUIET_CHECK or longer: one the
            server closed (after a Redis restart: the connection carries no retry, where a pooled
            one goes through) is reconnected before the command is sent. A reply left unread by an
            interrupted command (a job's timeout) is the connection's own business: it reconnects
            before its next send (replies.ReplyAccounting), whether or not that reply has arrived.

            Not before every command: the check is a system call that hands the GIL to another
            thread (on another CPU, unpinned) in a worker whose threads all want it, a sixth of
            a small job's wake-ups. A connection used again within QUIET_CHECK was answered
            moments ago; a server that closed it since and is back already (a restart in under
            QUIET_CHECK) fails that one command, as a command already in flight at the restart does.
            """

            _used = 0.0  # (time.monotonic() when the last command ended)

            def __init__(self, *args: Any, **kwargs: Any):
                super().__init__(*args, **kwargs)
                self._direct = replies.usable(self)  # (broker/replies.py: which commands skip redis-py's wrapping)

            def _execute_command(self, *args: Any, **options: Any) -> Any:
                # Under the client's lock (redis-py's part takes it again: an RLock), so that no
                # other thread's command is in flight on the connection: checked outside it, on a
                # client handed to another thread (or shared by every thread's pushes, once), the
                # reply of a command sent and not read yet looked like the server's close, and
                # the connection was dropped under that command ("Connection closed by server").
                with self.single_connection_lock:
                    conn = self.connection
                    if time.monotonic() - self._used >= QUIET_CHECK:
                        sock = getattr(conn, "_sock", None)
                        # (select on the socket: one system call, where redis-py's can_read changes
                        # the socket's timeout and back around a read, three calls)
                        if sock is not None and select.select((sock,), (), (), 0)[0]:
                            conn.disconnect()  # type: ignore[union-attr]  # (the server's close, or data it sent: reconnects to send)
                    try:
                        command = replies.packed(args, options) if self._direct else None
                        if command is not None:  # (a plain command: sent and read as redis-py would, leaner)
                            return replies.execute(self, conn, command, args, options)
                        return super()._execute_command(*args, **options)
                    finally:
                        self._used = time.monotonic()

        _HeldClient = HeldClient
    return _HeldClient


def get_redis_when_up() -> Any:
    """The shared client, waiting for Redis first where building it connects (a cluster client
    reads the slot map from a seed): a worker started before its cluster waits, as it does for a
    lone Redis, instead of exiting."""
    import redis

    pause, down_since = 0.5, None
    while True:
        try:
            client = get_shared_redis()
        except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
            if down_since is None:
                logger.error("Redis not reachable (%s: %s); trying again until it is", type(exc).__name__, exc)
                down_since = time.monotonic()
            time.sleep(pause)
            pause = min(pause * 2, 10.0)
            continue
        if down_since is not None:
            logger.warning("Redis reachable after %.1fs", time.monotonic() - down_since)
        return client


def get_client() -> Any:
    """The client every ``perform_*`` goes through (or the testing stand-in)."""
    global _client
    if _override is not None:
        return _override
    client = _client
    if client is not None:  # (built: no lock to take on every push)
        return client
    with _lock:
        if _client is None:
            from .middleware import load

            config = get_config()
            outbox = None
            if config.outbox:
                from ..outbox.store import Outbox

                outbox = Outbox()
            # get_redis itself, not its client: asked per push, it is the pushing thread's (in a
            # processor thread, that thread's own connection). Not the first pusher's, which
            # every thread would then share (Client's __init__ says what that broke).
            _client = Client(config, get_redis, middleware=load(config.client_middleware), defer=defer_to_commit,
                             outbox=outbox)
        return _client


def defer_to_commit(push: Any, jobs: Sequence[dict[str, Any]] = ()) -> bool:
    """Run ``push`` (of ``jobs``: their payloads, to name them) when the current transaction
    commits; return False outside one. A push that fails then raises PushLostAtCommit."""
    # Any database's transaction, not only "default": a push made inside
    # atomic(using="other") must wait for that commit. (About 4 µs of a perform_async's 130:
    # asgiref's Local, asked through Django's public call, looks for a running event loop per
    # database. Reading Django's and asgiref's private stores instead saved 2 µs, and would
    # have to follow their handling of async contexts; a push made before its commit runs
    # a job against rows that aren't there yet.)
    for conn in connections.all(initialized_only=True):
        if conn.in_atomic_block:
            transaction.on_commit(commit.waiting(conn.alias, jobs, lambda member: _push_at_commit(member, push)),
                                  using=conn.alias)
            return True
    return False


def _push_at_commit(member: commit.Waiting, push: Any) -> Any:
    """Run ``push`` at its commit. Its failure is raised as PushLostAtCommit, logged at ERROR: the
    transaction committed, and the job is gone, with the commit's pushes after it (Django runs no
    ``on_commit`` callback after one that raises). It was a bare ConnectionError out of ``atomic()``,
    which said neither."""
    try:
        return push()
    except Exception as exc:
        members = [member, *member.commit.left(member)]
        lost = [job for other in members for job in other.jobs]
        unnamed = sum(1 for other in members if not other.jobs)  # (a caller that didn't say its jobs)
        what = ", ".join(part for part in (commit.describe(lost), f"{unnamed} push(es) of unnamed jobs" if unnamed
                                           else "") if part)
        message = (f"the transaction on database {member.commit.alias!r} committed, but its job(s) were not pushed "
                   f"({type(exc).__name__}: {exc}); lost: {what}. Set COGWORKER[\"OUTBOX\"] = True to keep a "
                   f"committed transaction's jobs through a Redis outage (docs/outbox.md)")
        logger.error("%s", message)
        raise PushLostAtCommit(message, [(job.get("class", "?"), job.get("jid", "?")) for job in lost],
                               member.commit.alias) from exc


def set_override(client: Any) -> Any:
    """Install a testing client (None removes it); return the previous one."""
    global _override
    previous, _override = _override, client
    return previous


def get_override() -> Any:
    """The testing client installed (testing.fake/inline), or None: asked by what pushes other
    than through the client (a batch's callbacks, features/batches/delivery.py), to hand it those."""
    return _override


def reset() -> None:
    """Forget the config and clients; the next use rebuilds them from settings and environment."""
    global _config, _redis, _client
    with _lock:
        if _redis is not None:
            _redis.close()
        _config = _redis = _client = None


def use_config(config: Config) -> None:
    """Make ``config`` this process's, in place of the settings' (until :func:`reset`): ``manage.py
    cogworker``'s listings, which read a few settings while another is wrong (cli/checks.py)."""
    global _config
    reset()
    with _lock:
        _config = config


def _on_setting_changed(setting: str, **kwargs: Any) -> None:
    if setting == "COGWORKER":
        reset()


setting_changed.connect(_on_setting_changed)
