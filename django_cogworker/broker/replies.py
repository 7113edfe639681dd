"""The connection class of every client the package builds: redis-py's, plus two rules; and a
plain command's direct path on a connection a thread holds.

* Reply accounting: a connection never sends a command while a reply to an earlier one is unread.
* Kernel timeouts: ``socket_timeout`` is enforced by the kernel (``SO_RCVTIMEO``/``SO_SNDTIMEO``)
  on a socket Python sees as blocking, so that each send and each read is one system call.
* Direct commands (:func:`packed`, :func:`execute`): a plain command on a held connection, sent
  and read without redis-py's wrapping of it (below).
"""

from __future__ import annotations

import functools
import socket
import struct
from typing import Any

import redis


class ReplyAccounting:
    """A redis-py connection that counts the replies it is owed, and never sends a command while
    one is still owed: it reconnects first.

    A command that does not complete leaves its reply on the socket, and the next command sent
    on that connection would read it as its own: a ``GET`` answered with an ``INCR``'s count. Any
    exception between the send and the read does it, and the one that comes anywhere is a job's
    timeout (engine/run/timeouts.py raises it asynchronously, at whatever bytecode the job's thread
    runs). redis-py drops a connection on an exception *inside* its read, and its pool checks a
    connection it hands out for data waiting; but between the send and the read nothing is
    waiting yet, so a connection back in the pool, or held by a thread, looked clean until the
    reply arrived (the stale-reply race: 9 failures in 15 runs on one machine). Counting is
    independent of timing: replies sent for minus replies read, and a send with any owed drops
    the connection. This covers every path through redis-py alike (commands, pipelines and
    transactions, blocking pops, the Sentinel and Cluster clients' node connections).

    A pub/sub connection is left alone (its replies are messages, read when they come): it is
    one while a ``PubSub`` has registered its connect callback.
    """

    _owed = 0  # replies sent for and not yet read
    _batch = 1  # commands in the next packed send (pack_commands says; a single command is 1)
    _pubsub = False
    _handshake = False  # connecting: AUTH, HELLO, SELECT... sent and read by redis-py itself

    def connect(self, *args: Any, **kwargs: Any) -> None:
        self._connecting(super().connect, args, kwargs)  # type: ignore[misc]

    def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        # (redis-py 6+: what connect() calls, and what its own send calls on a closed connection)
        self._connecting(super().connect_check_health, args, kwargs)  # type: ignore[misc]

    def _connecting(self, connect: Any, args: Any, kwargs: Any) -> None:
        if getattr(self, "_sock", None) is not None:  # (connected already: a no-op, nothing to reset)
            connect(*args, **kwargs)
            return
        self._handshake = True
        try:
            connect(*args, **kwargs)
        finally:
            self._handshake = False
        self._owed = 0  # (a new connection: the handshake read what it sent)
        kernel_timeouts(self)

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        batch, self._batch = self._batch, 1
        if self._handshake:  # (a new connection's own commands: some are sent before any is read)
            super().send_packed_command(command, check_health)  # type: ignore[misc]
            return
        if self._owed and not self._pubsub:
            self.disconnect()  # (a reply is owed: a fresh connection owes none)
        # The handshake of a new connection and the health check's PING are sends and reads of
        # their own, done here, before this command counts, so that they find nothing owed.
        if getattr(self, "_sock", None) is None:
            self.connect()
        if check_health:
            self.check_health()  # type: ignore[attr-defined]
        # Counted before the send: an interrupt between the two costs a needless reconnect, the
        # other order could lose track of a reply.
        self._owed += batch
        try:
            super().send_packed_command(command, False)  # type: ignore[misc]
        except redis.ConnectionError as exc:
            _raise_timeout_if_kernel(exc, "Timeout writing to socket")  # (redis-py's words)
            raise

    def pack_commands(self, commands: Any) -> Any:
        commands = list(commands)
        packed = super().pack_commands(commands)  # type: ignore[misc]
        self._batch = len(commands)
        return packed

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            response = super().read_response(*args, **kwargs)  # type: ignore[misc]
        except redis.ResponseError:  # (an error reply: read all the same)
            self._paid()
            raise
        except redis.ConnectionError as exc:
            _raise_timeout_if_kernel(exc, f"Timeout reading from {self._host_error()}")  # type: ignore[attr-defined]
            raise
        self._paid()
        return response

    def _paid(self) -> None:
        if self._owed:
            self._owed -= 1

    def disconnect(self, *args: Any, **kwargs: Any) -> None:
        self._owed = 0
        self._batch = 1
        super().disconnect(*args, **kwargs)  # type: ignore[misc]

    def register_connect_callback(self, callback: Any) -> None:
        self._pubsub = True
        super().register_connect_callback(callback)  # type: ignore[misc]

    def deregister_connect_callback(self, callback: Any) -> None:
        self._pubsub = False
        super().deregister_connect_callback(callback)  # type: ignore[misc]


@functools.cache
def accounted(connection_class: type) -> type:
    """``connection_class`` with :class:`ReplyAccounting` (one class per base, made once)."""
    if issubclass(connection_class, ReplyAccounting):
        return connection_class
    return type(f"Accounted{connection_class.__name__}", (ReplyAccounting, connection_class), {})


def kernel_timeouts(connection: Any) -> None:
    """Have the kernel enforce a new connection's socket timeout, and Python see a blocking socket.

    A Python socket with a timeout polls before every send and every read: two system calls,
    each releasing and taking back the GIL. In a worker whose threads all want the GIL, each
    release hands it to another thread, on another CPU when the process isn't pinned: about a
    quarter of a small job's CPU went to those hand-overs (bench/wakeups.py, futex calls per job).
    With ``SO_RCVTIMEO``/``SO_SNDTIMEO`` the send or the read itself times out: one call, and the
    same timeout. redis-py then sees the timeout as an error of the socket (EAGAIN), which
    :func:`_raise_timeout_if_kernel` turns back into the ``TimeoutError`` it raises for its own.

    Plain TCP and unix sockets only: a TLS socket (``rediss://``) keeps Python's timeout (its
    reads may need writes). A per-call timeout redis-py sets (a pub/sub ``get_message``, the
    pool's check of a connection it hands out) still works: it restores the parser's saved
    timeout afterwards, set to None here, so the socket is blocking again, under the kernel's.
    """
    sock = getattr(connection, "_sock", None)
    if type(sock) is not socket.socket:
        return
    timeout = sock.gettimeout()
    if not timeout:  # (None: no timeout asked for; 0 can't be: redis-py connects blocking)
        return
    seconds = int(timeout)
    value = struct.pack("ll", seconds, int((timeout - seconds) * 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
    sock.settimeout(None)
    # What redis-py's parsers restore after a per-call timeout (the Python and hiredis parsers).
    parser = getattr(connection, "_parser", None)
    if hasattr(parser, "_socket_timeout"):  # (the hiredis parser; its _buffer is a bytearray)
        parser._socket_timeout = None  # type: ignore[union-attr]
    elif hasattr(getattr(parser, "_buffer", None), "socket_timeout"):  # (redis-py's own: a SocketBuffer)
        parser._buffer.socket_timeout = None  # type: ignore[union-attr]


def _raise_timeout_if_kernel(exc: redis.ConnectionError, message: str) -> None:
    """Raise the kernel's timeout (EAGAIN on a blocking socket) as redis-py's TimeoutError."""
    if isinstance(exc.__context__, BlockingIOError):
        raise redis.TimeoutError(message) from exc


# -- direct commands ---------------------------------------------------------------------------
# A plain command on a connection a thread holds, sent and read without redis-py's wrapping of it.
#
# A worker's processor thread holds one connection for its jobs' commands (push/runtime.py's
# ``HeldClient``). Through redis-py, a small command such as a job's ``INCR`` cost about 23 µs of
# Python work around its two system calls: the retry wrapper and its closures, the observability
# records (not enabled), redis-py 8's check of every command for ``HIMPORT SET``, the encoding of
# each argument, and the connection's own read path. Here the same command is packed by hiredis
# in one call, sent and read through the connection's own ``send_packed_command`` and
# ``read_response`` (this package's reply accounting and kernel timeouts, redis-py's parser, its
# error replies, its decoding), and given the client's response callback: about 11 µs
# (bench/sidekiq/fair.md).
#
# Only what that covers exactly goes this way (:func:`packed` says None otherwise, and the
# command goes redis-py's way): arguments that are ``str`` (UTF-8, strict: the client's
# encoding), ``bytes`` or ``int``, a one-word command name, no option but ``keys``, hiredis
# installed, and no client-side cache or observability collector in redis-py. A command whose
# connection fails (sent or read) is made again redis-py's way, with its retries: at most one
# attempt more than redis-py alone makes (none where its Retry makes none).


_pack: Any
try:
    from hiredis import pack_command as _pack
except ImportError:  # (the hiredis extra is optional: without it, every command goes redis-py's way)
    _pack = None


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
