"""The Redis client factory: one place that turns the config into a client.

URLs: ``redis://[user:password@]host:port/db``, ``rediss://`` for TLS (with
``ssl_*`` options in ``REDIS_OPTIONS``), ``unix:///path/to/socket?db=0``, and
``redis+sentinel://host1:26379,host2:26379/mymaster/0`` (``rediss+sentinel://``: TLS) for
the primary of a Sentinel service (see :mod:`django_cogworker.sentinel`). The password is
never logged: everything user-visible shows ``Config.redacted_url``.

Every client of the package is built here (the worker's, the pushers', the admin's): pub/sub
and blocking calls take their connections from its pool, so they follow a failover too.
"""

from __future__ import annotations

from typing import Any

import redis

from .conf import Config
from .sentinel import is_sentinel_url, make_sentinel_redis

# Blocking fetches wait on the server; a socket timeout shorter than the
# block would turn every idle wait into a "lost connection".
DEFAULT_OPTIONS: dict[str, Any] = {
    "socket_timeout": 10.0,
    "socket_connect_timeout": 5.0,
    "health_check_interval": 30,
    # No client_name: naming each connection runs CLIENT SETNAME on every connect, which an
    # ACL user without the CLIENT command is refused, so no worker could start at all.
}


def make_redis(config: Config, *, max_connections: int | None = None) -> redis.Redis:
    """Return a client for ``config``; bytes in and out (payloads stay exact)."""
    options = dict(DEFAULT_OPTIONS)
    options.update(config.redis_options)
    if max_connections is not None:
        options.setdefault("max_connections", max_connections)
    if is_sentinel_url(config.redis_url):
        return make_sentinel_redis(config.redis_url, options)
    return redis.Redis.from_url(config.redis_url, **options)

