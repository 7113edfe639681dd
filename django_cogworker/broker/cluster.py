"""Redis Cluster: the seed-list URL, the hash-tagged key prefix, and what the cluster client does differently.

``REDIS_URL = "redis+cluster://[user:password@]host1:7000,host2:7001[/0]"`` (``rediss+cluster://``
for TLS) names seed nodes; redis-py's :class:`~redis.cluster.RedisCluster` learns the rest of
the cluster from them. A cluster has one database: a db other than 0 is refused at startup.

The key prefix is wrapped in a hash tag (``cogworker:`` -> ``{cogworker}:``): the **home slot**.
Each queue's list and in-progress lists get a slot of their own, the tag with ``:q:<queue>``
inside (keys/), so queues spread over the shards; each Lua script's KEYS, each transaction and
each multi-key command (RENAME to a quarantine key, BLMOVE to an in-progress list) stays within
one of those slots, as Redis Cluster requires, and a move between a queue's slot and the home
slot is two steps (crossings.py). See docs/architecture.md, "Redis Cluster".

Server-wide commands are sent to the **home node**, the primary owning that slot (its
``TIME`` is the clock the data's server keeps; its ``INFO`` describes the server holding the
data); a SCAN visits every primary, so a key found mid-migration on another node is not missed.
"""

from __future__ import annotations

from typing import Any

from . import host_lists

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")


def is_cluster_url(url: Any) -> bool:
    return isinstance(url, str) and url.partition("://")[0] in CLUSTER_SCHEMES


def parse_cluster_url(url: str) -> dict[str, Any]:
    """``url`` -> {"seeds": [(host, port)], "username", "password", "ssl", "db"}; ValueError saying what is wrong.

    Split by host_lists.py, as a sentinel URL is; a password may hold any character but ``?``
    (percent-encode it, as in a redis:// URL).
    """
    parts = host_lists.split(url)
    if parts.query:
        raise ValueError("options go in REDIS_OPTIONS, not in the query of a cluster URL")
    if parts.fragment:
        raise ValueError(f"a cluster URL has no #fragment, got #{parts.fragment}")
    db = parts.path.strip("/")
    if db not in ("", "0"):
        raise ValueError(f"a cluster has one database: the path must be /0 or absent, got /{db}")
    seeds = []
    for seed in parts.hosts:
        try:
            seeds.append(host_lists.host_port(seed))  # (each with its port)
        except host_lists.BadHost:
            raise ValueError(f"each seed node must be host:port, got {seed!r}") from None
    return {"seeds": seeds, "username": parts.username, "password": parts.password,
            "ssl": parts.scheme == "rediss+cluster", "db": 0}


def tagged_prefix(prefix: str) -> str:
    """``prefix`` wrapped in a hash tag (``cogworker:`` -> ``{cogworker}:``); kept if it holds one.

    Redis hashes only the part between the key's first ``{`` and the next ``}`` when that part
    is not empty; the prefix starts every key, so its tag is every key's tag.
    """
    if has_hash_tag(prefix):
        return prefix
    body = prefix[:-1] if prefix.endswith(":") else prefix
    return "{" + body + "}" + prefix[len(body):]


def has_hash_tag(prefix: str) -> bool:
    """Whether ``prefix`` alone decides the hash slot of every key that starts with it."""
    opening = prefix.find("{")
    # (Redis takes the first "}" after the first "{": "{}" is no tag, and then neither is "{}x}")
    return opening >= 0 and prefix.find("}", opening + 1) > opening + 1


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is redis-py's cluster client (or one of its pipelines)."""
    from redis.cluster import ClusterPipeline, RedisCluster

    return isinstance(client, (RedisCluster, ClusterPipeline))


def stacked_commands(pipe: Any) -> list[tuple[Any, ...]]:
    """The argument tuples queued on ``pipe``, in order.

    A cluster pipeline keeps them in its execution strategy's queue, as objects (redis-py 8
    exposes no public accessor; tests/workers/test_cluster.py fails if that moves).
    """
    strategy = getattr(pipe, "_execution_strategy", None)
    if strategy is not None:
        return [tuple(entry.args) for entry in strategy.command_queue]
    return [tuple(args) for args, _options in pipe.command_stack]


def home_node(client: Any, key: str) -> Any:
    """The primary node serving ``key``'s slot (a home-slot key: the home node)."""
    return client.get_node_from_key(key)


def scan_page(client: Any, cursor: Any, match: str, count: int) -> tuple[Any, list[Any]]:
    """One SCAN step; return (next cursor, names). A cursor of 0 starts, and a returned 0 means done.

    On a cluster the cursor is a dict of node name -> that node's cursor: every primary is
    scanned (one SCAN each per step) until each says 0.
    """
    if not is_cluster(client):
        next_cursor, names = client.scan(cursor, match=match, count=count)
        return int(next_cursor), list(names)
    if not cursor:
        cursors, names = client.scan(0, match=match, count=count, target_nodes=client.PRIMARIES)
    else:
        cursors, names = {}, []
        for name, position in cursor.items():
            node = client.get_node(node_name=name)
            if node is None:  # (gone from the topology: its keys are on the others now)
                continue
            page, found = client.scan(position, match=match, count=count, target_nodes=node)
            cursors.update(page)
            names.extend(found)
    remaining = {name: position for name, position in cursors.items() if int(position) != 0}
    return (remaining or 0), names


# RedisCluster's own arguments a user may set in REDIS_OPTIONS.
# (Reads from replicas are refused by the config check.)
OWN_OPTIONS = ("require_full_coverage", "read_from_replicas", "reinitialize_steps", "cluster_error_retry_attempts",
               "dynamic_startup_nodes", "address_remap", "load_balancing_strategy", "retry")
