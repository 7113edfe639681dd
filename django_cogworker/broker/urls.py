"""The forms ``REDIS_URL`` takes, where it is read from, what is checked of each at startup, and
the URL as it is shown.

``redis://[user:password@]host:port/db``, ``rediss://`` (TLS), ``unix:///path?db=0``;
``redis+sentinel://`` / ``rediss+sentinel://`` (:mod:`.sentinel`); ``redis+cluster://`` /
``rediss+cluster://`` (:mod:`.cluster`). Each is checked without connecting, so a typo fails
the start naming the setting rather than the first connection, which a worker took for Redis
being away, for ever.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from . import host_lists
from .cluster import OWN_OPTIONS, is_cluster_url, parse_cluster_url
from .sentinel import SentinelURLError, is_sentinel_url, make_sentinel_redis, parse

URL_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster")
URL_FORMS = ("a redis://, rediss://, unix://, redis+sentinel://, rediss+sentinel://, redis+cluster:// or "
             "rediss+cluster:// URL")

# Where the Redis URL is read, the first set winning (conf.build_config): the setting, then the environment.
URL_SOURCES = ('COGWORKER["REDIS_URL"]', "COGWORKER_REDIS_URL", "REDIS_URL")


def url_sources(setting: object, environ: Mapping[str, str]) -> list[tuple[str, Any]]:
    """Each source of the Redis URL that is set, as ``(name, url)`` in URL_SOURCES' order: the first
    is used. ``setting`` is ``settings.COGWORKER`` (a REDIS_URL there is used whatever its value:
    validation names a bad one); an empty environment variable counts as unset."""
    found: list[tuple[str, Any]] = []
    if isinstance(setting, Mapping) and "REDIS_URL" in setting:
        found.append((URL_SOURCES[0], setting["REDIS_URL"]))
    found.extend((name, environ[name]) for name in URL_SOURCES[1:] if environ.get(name))
    return found


def redact_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***`` (user names stay).

    Works on the text, not on a parsed URL: an unencoded ``#`` or ``?`` in a
    password would make a parser call the rest a fragment or a query and show
    it; an IPv6 host would lose its brackets. A ``password=`` query argument
    (redis-py's form for unix sockets) and a ``sentinel_password=`` one are masked too.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    at = rest.rfind("@")
    if at >= 0 and ":" in rest[:at]:
        user = rest[:at].partition(":")[0]
        rest = f"{user}:***@{rest[at + 1:]}"
    rest = _QUERY_PASSWORD.sub(r"\1***", rest)
    return f"{scheme}{sep}{rest}"


_QUERY_PASSWORD = re.compile(r"([?&](?:sentinel_)?password=)[^&#]*", re.IGNORECASE)


def url_problem(url: Any) -> str | None:
    """What is wrong with ``url`` (in the words of "must be ..."), or None."""
    if not isinstance(url, str) or url.partition("://")[0] not in URL_SCHEMES:
        return URL_FORMS
    if is_sentinel_url(url):
        try:
            parse(url)
        except SentinelURLError as exc:
            return str(exc)
        return None
    if is_cluster_url(url):
        try:
            parse_cluster_url(url)
        except ValueError as exc:
            return f"a redis+cluster://host:port[,host:port...] URL ({exc})"
        return None
    try:
        # A port that is not a number (or a broken IPv6 host) would otherwise
        # fail only at the first connection, without naming the setting.
        urlsplit(url).port  # noqa: B018
    except ValueError:
        return "a URL with a numeric port (and a well-formed host)"
    return None


def options_problem(url: str, options: Mapping[str, Any]) -> str | None:
    """Build (not connect) a connection with ``options``: an option redis-py doesn't know failed
    only at the first connection, which a worker took for Redis being away, for ever."""
    import redis

    if is_cluster_url(url):
        # (each node's connection is built the same way; RedisCluster's own options aside)
        if options.get("db") not in (None, 0):
            return f"a cluster has one database: db must be 0 or absent, got {options['db']!r}"
        if options.get("read_from_replicas") or options.get("load_balancing_strategy"):
            # The engine decides on what it reads (an in-progress list, a due entry): a replica's
            # answer, behind its primary, would have it requeue or skip the wrong jobs.
            return "reads from replicas are not supported: every command must go to the primary"
        options = {k: v for k, v in options.items() if k not in OWN_OPTIONS}
        url = f"redis://{host_lists.netloc(*parse_cluster_url(url)['seeds'][0])}/0"  # (an IPv6 seed in brackets)
    try:
        if is_sentinel_url(url):
            # (the sentinels' clients are built too: a bad sentinel_kwargs option fails here)
            client = make_sentinel_redis(url, options)
            try:
                client.connection_pool.make_connection()
            finally:
                client.close()
        else:
            redis.ConnectionPool.from_url(url, **options).make_connection()
    except (TypeError, ValueError) as exc:
        return str(exc).replace(url, redact_url(url))
    return None
