"""A plain command on a connection a thread holds, sent and read without redis-py's wrapping of it.

A worker's processor thread holds one connection for its jobs' commands (push/runtime.py's
``HeldClient``). Through redis-py, a small command such as a job's ``INCR`` cost about 23 µs of
Python work around its two system calls: the retry wrapper and its closures, the observability
records (not enabled), redis-py 8's check of every command for ``HIMPORT SET``, the encoding of
each argument, and the connection's own read path. Here the same command is packed by hiredis
in one call, sent and read through the connection's own ``send_packed_command`` and
``read_response`` (this package's reply accounting and kernel timeouts, redis-py's parser, its
error replies, its decoding), and given the client's response callback: about 11 µs
(bench/sidekiq/fair.md).

Only what that covers exactly goes this way (:func:`packed` says None otherwise, and the
command goes redis-py's way): arguments that are ``str`` (UTF-8, strict: the client's
encoding), ``bytes`` or ``int``, a one-word command name, no option but ``keys``, hiredis
installed, and no client-side cache or observability collector in redis-py. A command whose
connection fails (sent or read) is made again redis-py's way, with its retries: at most one
attempt more than redis-py alone makes (none where its Retry makes none).
"""

from __future__ import annotations

from typing import Any

_pack: Any
try:
    from hiredis import pack_command as _pack
except ImportError:  # (the hiredis extra is optional: without it, every command goes redis-py's way)
    _pack = None

_PLAIN = (str, bytes, int)


def packed(args: tuple[Any, ...], options: dict[str, Any]) -> list[bytes] | None:
    """``args`` as one RESP command, or None if it must go redis-py's way."""
    if _pack is None or (options and (len(options) > 1 or "keys" not in options)):
        return None
    name = args[0]
    if type(name) is not str or " " in name or name[:7].upper() == "HIMPORT":
        return None
    for arg in args:
        kind = type(arg)
        if kind is not str and kind is not bytes and kind is not int:  # (bool is not int here; float is repr'd)
            return None
    try:
        return [_pack(args)]
    except (TypeError, UnicodeEncodeError):  # (a lone surrogate: redis-py's encoder raises its own)
        return None


def usable(client: Any) -> bool:
    """Whether ``client``'s commands may go this way: hiredis here, UTF-8 strict, no client-side
    cache, and no redis-py observability collector (whose records this way skips)."""
    if _pack is None:
        return False
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("encoding", "utf-8").lower().replace("_", "-") not in ("utf-8", "utf8"):
        return False
    if kwargs.get("encoding_errors", "strict") != "strict" or kwargs.get("protocol") in (3, "3"):
        return False
    if getattr(client.connection_pool, "cache", None) is not None:
        return False
    return not _observed()


def _observed() -> bool:
    """Whether redis-py records its commands (8.x: an OpenTelemetry collector set up, or unknown)."""
    try:
        from redis.observability import recorder
    except ImportError:  # (redis-py before observability: nothing to record)
        return False
    if getattr(recorder, "_metrics_collector", None) is not None:
        return True
    # (None and resolved: looked up and not enabled. Not looked up yet: ask it, as its own helpers do.)
    if getattr(recorder, "_collector_resolved", None) is True:
        return False
    get = getattr(recorder, "_get_or_create_collector", None)
    try:
        return get is None or get() is not None
    except Exception:  # noqa: BLE001 - can't tell: redis-py's way
        return True


def _retried(conn: Any, exc: Exception) -> bool:
    """Whether redis-py would make ``conn``'s command again after ``exc`` (its Retry's retries and errors)."""
    retry = getattr(conn, "retry", None)
    if retry is None:
        return False
    retries = retry.get_retries() if hasattr(retry, "get_retries") else getattr(retry, "_retries", 0)
    return bool(retries) and isinstance(exc, getattr(retry, "_supported_errors", ()))


def execute(client: Any, conn: Any, command: list[bytes], args: tuple[Any, ...], options: dict[str, Any]) -> Any:
    """Send ``command`` (``args`` packed) on ``conn`` and return the reply as ``client`` would.

    A failure of the connection makes it again redis-py's way (reconnect, retries); an error
    reply raises as from redis-py.
    """
    import redis

    try:
        conn.send_packed_command(command)
        response = conn.read_response()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        conn.disconnect()
        if not _retried(conn, exc):
            raise
        return redis.Redis._execute_command(client, *args, **options)
    should_reconnect = getattr(conn, "should_reconnect", None)  # (redis-py 6+: a server's maintenance notice)
    if should_reconnect is not None and should_reconnect():
        conn.disconnect()
        conn.connect()
    callback = client.response_callbacks.get(args[0])
    if callback is None:
        return response
    options.pop("keys", None)
    return callback(response, **options)
