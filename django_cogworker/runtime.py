"""The process-wide config, Redis client and job client, built lazily from Django settings.

This is the Django edge's one shared state. Everything here is built on first
use and dropped by :func:`reset` (and when a test changes ``COGWORKER``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from django.core.signals import setting_changed
from django.db import connections, transaction

from .client import Client
from .conf import Config, build_config

logger = logging.getLogger(__name__)

_lock = threading.RLock()
_config: Config | None = None
_redis: Any = None
_client: Any = None
_override: Any = None  # a testing client (fake/inline mode) when set


def get_config() -> Config:
    global _config
    with _lock:
        if _config is None:
            from django.conf import settings

            _config = build_config(getattr(settings, "COGWORKER", None), os.environ)
        return _config


def get_redis() -> Any:
    """The shared redis-py client (bytes responses) for this config."""
    global _redis
    client = _redis
    if client is not None:  # (built: no lock to take on every call; jobs call this per command)
        return client
    with _lock:
        if _redis is None:
            from .connection import make_redis

            _redis = make_redis(get_config())
        return _redis


def get_redis_when_up() -> Any:
    """The shared client, waiting for Redis first where building it connects (a cluster client
    reads the slot map from a seed): a worker started before its cluster waits, as it does for a
    lone Redis, instead of exiting."""
    import redis

    pause, down_since = 0.5, None
    while True:
        try:
            client = get_redis()
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
            _client = Client(config, get_redis(), middleware=load(config.client_middleware), defer=defer_to_commit)
        return _client


def defer_to_commit(push: Any) -> bool:
    """Run ``push`` when the current transaction commits; return False outside one."""
    # Any database's transaction, not only "default": a push made inside
    # atomic(using="other") must wait for that commit. (Skipping it for threads that seem
    # not to use the database could push before a commit where a connection was made in
    # another thread and shared with this one, as a live test server does.)
    #
    # Each database's connection of this thread (or async context), as
    # connections.all(initialized_only=True) lists them, read from its store: that call goes
    # through asgiref's Local twice per database, each time asking asyncio for a running loop
    # with an exception in a sync thread (4 µs of a perform_async's 130, against 1 here). The
    # store is asgiref's and Django's own: where either is missing, the public call is made.
    get_storage = getattr(getattr(connections, "_connections", None), "_get_storage", None)
    if get_storage is not None:
        storage = get_storage()
        for alias in connections.settings:
            conn = getattr(storage, alias, None)
            if conn is not None and conn.in_atomic_block:
                transaction.on_commit(push, using=alias)
                return True
        return False
    for conn in connections.all(initialized_only=True):
        if conn.in_atomic_block:
            transaction.on_commit(push, using=conn.alias)
            return True
    return False


def set_override(client: Any) -> Any:
    """Install a testing client (None removes it); return the previous one."""
    global _override
    previous, _override = _override, client
    return previous


def reset() -> None:
    """Forget the config and clients; the next use rebuilds them from settings and environment."""
    global _config, _redis, _client
    with _lock:
        if _redis is not None:
            _redis.close()
        _config = _redis = _client = None


def _on_setting_changed(setting: str, **kwargs: Any) -> None:
    if setting == "COGWORKER":
        reset()


setting_changed.connect(_on_setting_changed)
