"""Type aliases the package shares.

``RedisClient`` is what every engine and api object is handed: a redis-py client
built by :func:`django_cogworker.broker.connection.make_redis` (bytes in and out), or one
a test or the project made itself: a lone server's ``redis.Redis`` or redis-py's
``RedisCluster`` (``redis+cluster://``: see cluster.py for what it does differently).
"""

from __future__ import annotations

from typing import TypeAlias

import redis
import redis.cluster

RedisClient: TypeAlias = redis.Redis | redis.cluster.RedisCluster
