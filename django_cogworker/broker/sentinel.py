"""Redis Sentinel: ``redis+sentinel://`` URLs parsed, and a client that follows the primary.

``redis+sentinel://[user:password@]host1:26379,host2:26379,host3:26379/mymaster/0`` names the
sentinels (any of them will do; list all), the service (the ``sentinel monitor`` name) and the
database. The user and password in the URL are the *primary's* (the data's, as in a
``redis://`` URL); the sentinels' own, when they have one (``requirepass`` in sentinel.conf),
go in the query: ``?sentinel_password=...`` (and ``sentinel_username=...``), or in
``REDIS_OPTIONS["sentinel_kwargs"]``. ``rediss+sentinel://`` is TLS to the primary and to the
sentinels (``ssl_*`` options of ``REDIS_OPTIONS`` apply to both).

The client is redis-py's ``Sentinel(...).master_for(service)`` with a pool of our own
(:class:`FollowingPool`): every new connection asks a sentinel where the primary is, and so
does the pool every ``sentinel_check_interval`` (1 s); connections to a former primary are
dropped as soon as a sentinel names another one. A demoted primary answers writes with READONLY (and unblocks
blocking calls with UNBLOCKED): redis-py then closes that connection and raises a
ConnectionError, which the engine treats like any outage (retried, never a job failure).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote

import redis
from redis.sentinel import (
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)

from . import host_lists
from .replies import accounted

SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_PORT = 26379
# Query arguments of a sentinel URL: where the sentinels' own credentials go (the userinfo is the primary's).
QUERY_ARGUMENTS = ("sentinel_password", "sentinel_username")
# Seconds between two questions to the sentinels about where the primary is (FollowingPool).
CHECK_INTERVAL = 1.0
# Socket timeouts towards the sentinels unless set: their answers are small, and a sentinel
# that doesn't answer (a host gone) must not hold a thread for the data connections' timeouts.
SENTINEL_TIMEOUT = 1.0


class SentinelURLError(ValueError):
    """A ``redis+sentinel://`` URL that can't be used; the message says why (never the password)."""


@dataclasses.dataclass(frozen=True)
class SentinelTarget:
    """What a ``redis+sentinel://`` URL says, parsed."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    tls: bool = False
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None


def is_sentinel_url(url: object) -> bool:
    return isinstance(url, str) and url.partition("://")[0] in SCHEMES


def parse(url: str) -> SentinelTarget:
    """Parse a sentinel URL (split by host_lists.py, as a cluster URL is); raise SentinelURLError
    saying what is wrong."""
    parts = host_lists.split(url)
    if parts.scheme not in SCHEMES:
        raise SentinelURLError("a redis+sentinel:// or rediss+sentinel:// URL")
    if parts.fragment:
        raise SentinelURLError("a URL without a #fragment (percent-encode # in a password as %23)")
    sentinels = []
    for item in parts.hosts:
        try:
            sentinels.append(host_lists.host_port(item, DEFAULT_PORT))
        except host_lists.BadHost as exc:
            if exc.port:
                raise SentinelURLError(f"a numeric port for each sentinel (not {item!r})") from None
            raise SentinelURLError(f"a list of sentinels, host:port separated by commas (not {item!r})") from None
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise SentinelURLError("a URL naming the service after the hosts: /<service>[/<db>], e.g. /mymaster/0")
    service = unquote(path[0])
    db = 0
    if len(path) == 2:
        if not path[1].isdigit():
            raise SentinelURLError(f"a database number after the service (not {path[1]!r})")
        db = int(path[1])
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(query) - set(QUERY_ARGUMENTS))
    if unknown:
        raise SentinelURLError(f"a URL whose query has only {' or '.join(QUERY_ARGUMENTS)} (other options go in "
                               f"REDIS_OPTIONS; not {', '.join(unknown)})")
    return SentinelTarget(tuple(sentinels), service, db, tls=parts.scheme == "rediss+sentinel",
                          username=parts.username, password=parts.password,
                          sentinel_username=query.get("sentinel_username") or None,
                          sentinel_password=query.get("sentinel_password") or None)


class FollowingPool(SentinelConnectionPool):
    """A SentinelConnectionPool that also asks the sentinels where the primary is every
    ``check_interval`` seconds, not only when it opens a connection.

    redis-py's pool asks only on connect, so a connection opened before a failover keeps talking
    to the old primary for as long as that one answers. After a kill nothing answers; but after
    ``SENTINEL FAILOVER`` or a partition the old primary stays up, as a primary, until the
    sentinels turn it into a replica (about ten seconds later: the failover test measured 11 s),
    and every write sent to it meanwhile is lost at that moment. Asked again, the sentinels name
    the new primary: redis-py then drops the idle connections to the old one at once and the busy
    ones when they come back to the pool. One thread asks, the others carry on.
    """

    def __init__(self, service_name: str, sentinel_manager: Sentinel, check_interval: float = CHECK_INTERVAL,
                 **kwargs: Any):
        self.check_interval = check_interval
        super().__init__(service_name, sentinel_manager, **kwargs)

    def reset(self) -> None:
        super().reset()  # (also in a forked child: a lock held across the fork would never be released)
        self._checking = threading.Lock()
        self._next_check = time.monotonic() + self.check_interval

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if self.is_master and time.monotonic() >= self._next_check and self._checking.acquire(blocking=False):
            try:
                self._next_check = time.monotonic() + self.check_interval
                if self.master_address is not None:  # (None: nothing connected yet, connecting asks)
                    self.get_master_address()
            except redis.ConnectionError:
                pass  # no sentinel answers, or none names a primary: the connection's own errors tell
            finally:
                self._checking.release()
        return super().get_connection(*args, **kwargs)


class SentinelRedis(redis.Redis):
    """A client of the primary of a Sentinel service; ``close`` also closes the sentinel connections."""

    sentinels: Sentinel | None = None  # (not "sentinel": that is the SENTINEL command)

    def close(self) -> None:
        super().close()
        if self.sentinels is not None:
            self.sentinels.close()


def sentinel_kwargs(target: SentinelTarget, options: Mapping[str, Any]) -> dict[str, Any]:
    """Connection options for the sentinels themselves: the socket and TLS options of
    ``options``, the credentials of the URL's query, then ``options["sentinel_kwargs"]``."""
    kwargs: dict[str, Any] = {"socket_timeout": SENTINEL_TIMEOUT, "socket_connect_timeout": SENTINEL_TIMEOUT}
    kwargs.update((k, v) for k, v in options.items() if k.startswith("socket_") and "timeout" not in k)
    if target.tls:
        kwargs["ssl"] = True
        kwargs.update({k: v for k, v in options.items() if k.startswith("ssl_")})
    if target.sentinel_username:
        kwargs["username"] = target.sentinel_username
    if target.sentinel_password:
        kwargs["password"] = target.sentinel_password
    kwargs.update(options.get("sentinel_kwargs") or {})
    return kwargs


def make_sentinel_redis(url: str, options: Mapping[str, Any]) -> SentinelRedis:
    """Return a client of the service's primary (nothing is connected until the first command)."""
    target = parse(url)
    for_sentinels = sentinel_kwargs(target, options)
    options = dict(options)
    options.pop("sentinel_kwargs", None)
    min_other = options.pop("min_other_sentinels", 0)
    check_interval = options.pop("sentinel_check_interval", CHECK_INTERVAL)
    if isinstance(check_interval, bool) or not isinstance(check_interval, (int, float)) or not check_interval > 0:
        raise ValueError(f"sentinel_check_interval must be a positive number of seconds, got {check_interval!r}")
    try:
        sentinel = Sentinel(list(target.sentinels), min_other_sentinels=min_other, sentinel_kwargs=for_sentinels)
    except TypeError as exc:  # (say which options: the message names only redis.Redis)
        raise TypeError(f"an option for the sentinels (sentinel_kwargs, or socket_*/ssl_* of REDIS_OPTIONS): "
                        f"{exc}") from exc
    connection: dict[str, Any] = {"db": target.db}
    if target.username is not None:
        connection["username"] = target.username
    if target.password is not None:
        connection["password"] = target.password
    # (see connection.ReplyAccounting: a command interrupted before its reply drops its connection)
    base = SentinelManagedSSLConnection if target.tls else SentinelManagedConnection
    connection["connection_class"] = accounted(base)
    connection.update(options)
    client = sentinel.master_for(target.service, redis_class=SentinelRedis, connection_pool_class=FollowingPool,
                                 check_interval=check_interval, **connection)
    client.sentinels = sentinel
    return client

