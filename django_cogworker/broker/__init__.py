"""The Redis layer: every client, key name and Lua script of the package, and nothing above them.

    connection   make_redis: the one factory that turns the config into a redis-py client
    replies      reply accounting: a command interrupted before its reply never leaves it for the next;
                 a held connection's plain commands sent without redis-py's wrapping
    urls         the forms REDIS_URL takes, checked without connecting; redact_url
    sentinel     redis+sentinel:// URLs and a client that follows the primary
    cluster      redis+cluster:// URLs, the hash-tagged prefix, the home node
    keys         Keys: every key name, one place (the schema's table is its docstring)
    scripts/     every Lua script, each with its KEYS/ARGV header, run by EVALSHA
    crossings    a cluster's two-step moves between a queue's slot and the home slot
    locks        the locks the fleet holds: one key, a holder's value, a TTL
    quarantine   moving a key of the wrong type aside
    types        RedisClient, the type every engine and api object is handed

Nothing here imports Django, the settings or any other part of the package but ``errors``:
what a module needs of the config it is handed.
"""
