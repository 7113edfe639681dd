"""The Redis client factory: one place that turns the config into a client.

URLs: ``redis://[user:password@]host:port/db``, ``rediss://`` for TLS (with
``ssl_*`` options in ``REDIS_OPTIONS``), ``unix:///path/to/socket?db=0``,
``redis+sentinel://host1:26379,host2:26379/mymaster/0`` (``rediss+sentinel://``: TLS) for
the primary of a Sentinel service (see :mod:`django_cogworker.broker.sentinel`), and
``redis+cluster://[user:password@]host1:7000,host2:7001`` (``rediss+cluster://``) for
Redis Cluster (see :mod:`.cluster`). The password is never logged: everything
user-visible shows ``Config.redacted_url``.

Every client of the package is built here (the worker's, the pushers', the admin's): pub/sub
and blocking calls take their connections from its pool, so they follow a failover too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import redis
from redis.cluster import ClusterNode, RedisCluster, cleanup_kwargs

from . import cluster
from .replies import accounted
from .sentinel import is_sentinel_url, make_sentinel_redis
from .types import RedisClient

# Blocking fetches wait on the server; a socket timeout shorter than the
# block would turn every idle wait into a "lost connection".
DEFAULT_OPTIONS: dict[str, Any] = {
    "socket_timeout": 10.0,
    "socket_connect_timeout": 5.0,
    "health_check_interval": 30,
    # No client_name: naming each connection runs CLIENT SETNAME on every connect, which an
    # ACL user without the CLIENT command is refused, so no worker could start at all.
}


class RedisTarget(Protocol):
    """What the factory needs of the config: the settings' Config is one (read once, at the edge,
    and handed in: nothing here reads settings, nor imports the module that does)."""

    @property
    def redis_url(self) -> str: ...
    @property
    def redis_options(self) -> Mapping[str, Any]: ...
    @property
    def key_prefix(self) -> str: ...


def make_redis(config: RedisTarget, *, max_connections: int | None = None) -> RedisClient:
    """Return a client for ``config``; bytes in and out (payloads stay exact)."""
    options = dict(DEFAULT_OPTIONS)
    options.update(config.redis_options)
    if max_connections is not None:
        options.setdefault("max_connections", max_connections)
    if is_sentinel_url(config.redis_url):
        return make_sentinel_redis(config.redis_url, options)
    if cluster.is_cluster_url(config.redis_url):
        return make_cluster(config, options)
    client = redis.Redis.from_url(config.redis_url, **options)
    # (from_url picks the class for the URL's scheme: TCP, TLS or a unix socket; none is open yet)
    client.connection_pool.connection_class = accounted(client.connection_pool.connection_class)
    return client


def make_cluster(config: RedisTarget, options: dict[str, Any]) -> RedisCluster:
    """redis-py's cluster client on the URL's seed nodes, its default node the home node.

    The cluster client connects here (it reads the slot map from a seed) and raises when no
    seed answers. Its default node, where server-wide commands (TIME, INFO, PING) go, is set
    to the primary serving the prefix's slot: one clock and one server for everything, the
    one that holds the data. After a failover redis-py may pick another default node; TIME
    then comes from another node's clock, which the orphan threshold's margin absorbs.
    """
    parsed = cluster.parse_cluster_url(config.redis_url)
    # The options RedisCluster itself takes, then the per-connection ones it passes on (it drops,
    # silently, those it can't: health_check_interval, which its own topology refresh replaces).
    own = {k: options.pop(k) for k in list(options) if k in cluster.OWN_OPTIONS}
    options = cleanup_kwargs(**options)
    options.pop("db", None)
    for name in ("username", "password"):
        if parsed[name] is not None:  # (the URL's win, as redis-py's from_url has them)
            options[name] = parsed[name]
    if parsed["ssl"]:
        options["ssl"] = True
    # (every node's pool: see ReplyAccounting; TLS keeps redis-py's SSLConnection underneath)
    options["connection_class"] = accounted(redis.SSLConnection if parsed["ssl"] else redis.Connection)
    client = RedisCluster(startup_nodes=[ClusterNode(host, port) for host, port in parsed["seeds"]],
                          **own, **options)
    client.set_default_node(cluster.home_node(client, config.key_prefix))
    return client
