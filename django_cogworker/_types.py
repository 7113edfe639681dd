"""Type aliases the package shares.

``RedisClient`` is what every engine and api object is handed: a redis-py client
built by :func:`django_cogworker.connection.make_redis` (bytes in and out), or one
a test or the project made itself. One alias, so a Sentinel- or Cluster-aware
client later changes one line, not fifty signatures.
"""

from __future__ import annotations

from typing import TypeAlias

import redis

RedisClient: TypeAlias = redis.Redis
