"""Health probes over HTTP: ``/healthz`` (alive) and ``/readyz`` (can take jobs), for Kubernetes and the like.

``/healthz`` answers 200 while the process's heartbeats reach Redis, 503 once its last good beat
(or its start, before the first) is older than twice HEARTBEAT_INTERVAL: the moment the others
start counting it as late. ``/readyz`` answers 200 while the process takes jobs and reaches Redis
to fetch them (its last beat good and recent, its fetcher's last round trip good), 503 while it
is starting, quiet (TSTP, a cap, a rolling restart, a stop) or cut off from Redis. Under
``--processes`` the supervisor answers for all its children (engine/process/supervisor.py): 200
only if every one of them is. Each answer carries a small JSON body saying why.

It listens on HEALTH_HOST (127.0.0.1 unless told otherwise: a probe from the kubelet reaches a
pod's own address, and nothing else should see it) and HEALTH_PORT, bound at startup so that a
port in use fails there, naming the setting.

The server never waits on a client. Every socket is non-blocking and watched by one selector:
a request is read as it comes, answered once its headers are whole, and dropped (a 408) if it
isn't whole within REQUEST_TIMEOUT of its connection. http.server's handler read a line at a
time with a 2 s timeout per read: one client sending a header line a second held it for as long
as it liked, and the supervisor, which served probes on its own loop, reaped no child and heard
no TERM meanwhile, while every other probe timed out.
"""

from __future__ import annotations

import email.utils
import errno
import json
import logging
import math
import selectors
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from .children import Child

logger = logging.getLogger(__name__)

# Seconds a client has, from its connection, to send a whole request (not per read).
REQUEST_TIMEOUT = 2.0
# Connections held at once: past it the oldest is dropped, so idle sockets can't lock out a probe.
MAX_CLIENTS = 64
# The listen backlog; connections are accepted as they come, so it only absorbs a burst.
BACKLOG = 128
MAX_REQUEST = 8192  # bytes of request line and headers
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
           431: "Request Header Fields Too Large", 503: "Service Unavailable"}


@dataclass
class Health:
    """A verdict: alive (``/healthz``), ready (``/readyz``), and what they rest on."""

    alive: bool
    ready: bool
    detail: dict[str, Any] = field(default_factory=dict)


def beat_verdict(last_beat: float | None, started: float, now: float, interval: float) -> tuple[bool, float]:
    """(alive, age): alive while the last good beat, or the start before any, is at most 2 intervals old."""
    age = now - (last_beat if last_beat is not None else started)
    return age <= 2 * interval, age


def worker_verdict(state: str, alive: bool, failing: tuple[str, ...], detail: dict[str, Any]) -> Health:
    """A worker process's verdict: ``state`` (starting, running, quiet, stopping), whether it beats
    (``beat_verdict``), and which of its Redis round trips failed last ("heartbeat", "fetcher").

    Ready: running, and able to fetch: its last beat recent (a frozen Redis hangs the beats, it
    doesn't fail them) and neither the beat nor the fetch failing now (a Redis that is gone
    fails the fetcher's waiting call at once).
    """
    ready = state == "running" and alive and not failing
    return Health(alive, ready, {"state": state, **({"redis_failing": list(failing)} if failing else {}), **detail})


def fleet_verdict(children: Iterable[Child], newest: Iterable[Child | None], cut_off: Collection[int], *,
                  now: float, interval: float, quiet: bool, stopping: bool, generation: int) -> Health:
    """A supervisor's verdict on its ``children`` as they reported (report.py), ``newest`` being each
    slot's current one (None while a restart is due), ``cut_off`` those whose fetcher fails.

    Alive while every child beats (its last beat, or its start, within 2 intervals), retiring ones
    included; ready while every slot's newest child is ready, not quiet, beats and can fetch, and
    the supervisor is neither quiet nor stopping.
    """
    alive, shown, beating = True, [], set()
    for child in sorted(children, key=lambda c: (c.index, c.generation)):
        ok, age = beat_verdict(child.last_beat, child.started_at, now, interval)
        alive = alive and ok
        if ok:
            beating.add(child.pid)
        shown.append({"index": child.index, "pid": child.pid, "generation": child.generation,
                      "last_beat_age": round(age, 3), "ready": child.ready, "quiet": child.quiet,
                      "retiring": child.retiring, "can_fetch": ok and child.pid not in cut_off})
    newest = list(newest)
    started = all(c is not None and c.ready for c in newest)
    state = "stopping" if stopping else "quiet" if quiet else "running" if started else "starting"
    ready = state == "running" and all(
        c is not None and not c.quiet and c.pid in beating and c.pid not in cut_off for c in newest)
    return Health(alive, ready, {"state": state, "generation": generation, "processes": shown})


@dataclass
class _Client:
    sock: socket.socket
    address: Any
    deadline: float
    data: bytearray = field(default_factory=bytearray)


class HealthServer:
    """The probe server: bound by ``runcogworker`` at startup, told its ``state`` by its owner.

    A lone worker serves it on the ``cogworker-health`` daemon thread (``start``, ``stop``). The
    supervisor keeps to one thread (it forks, and a fork copies no other thread but every lock one
    holds): it watches ``fileno()`` in its select loop and calls ``serve()`` after each wake-up,
    which handles what is there without waiting; ``next_deadline()`` bounds its sleep. A forked
    child calls ``discard()``. Each round is one ``select`` of the selector, reads of what arrived,
    and the answers, each one non-blocking ``send`` of a few hundred bytes.
    """

    def __init__(self, host: str, port: int, *, clock: Callable[[], float] = time.monotonic,
                 request_timeout: float = REQUEST_TIMEOUT, max_clients: int = MAX_CLIENTS):
        self.clock, self.request_timeout, self.max_clients = clock, request_timeout, max_clients
        self.state: Callable[[], Health] = lambda: Health(False, False, {"state": "starting"})
        self.socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind((host, port))
            self.socket.listen(BACKLOG)
        except OSError:
            self.socket.close()
            raise
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.socket, selectors.EVENT_READ)
        self._clients: dict[int, _Client] = {}
        # (Out of descriptors, accept fails while the socket stays readable: it is left unwatched
        # until then, or the owner's loop would spin on it.)
        self._accept_paused_until: float | None = None
        # (the thread's wake-up at stop: a socketpair watched by the same selector)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the owner's side ---------------------------------------------------------------------

    def fileno(self) -> int:
        """The selector's descriptor: readable when a connection or a request's bytes wait."""
        return self._selector.fileno()

    def next_deadline(self) -> float:
        """Seconds until the oldest request runs out of time (inf with none): when ``serve`` is due."""
        if not self._clients:
            return math.inf
        return max(0.0, min(c.deadline for c in self._clients.values()) - self.clock())

    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve_forever, name="cogworker-health", daemon=True)
        self._thread.start()

    def _serve_forever(self) -> None:
        while not self._stopping.is_set():
            if not self.serve(min(1.0, self.next_deadline())):
                self._stopping.wait(0.5)

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass
            self._thread.join(5)
        self.close()

    def close(self) -> None:
        for client in list(self._clients.values()):
            self._drop(client)
        self._selector.close()
        for sock in (self.socket, self._wake_r, self._wake_w):
            sock.close()

    def discard(self) -> None:
        """In a forked child: close this process's copies, and only those.

        No unregister: the selector's epoll (or kqueue) set is shared with the parent across a
        fork, and removing a socket from it here would remove it for the supervisor.
        """
        for client in self._clients.values():
            client.sock.close()
        self._clients.clear()
        for closable in (self._selector, self.socket, self._wake_r, self._wake_w):
            closable.close()

    # -- a round ------------------------------------------------------------------------------

    def serve(self, timeout: float = 0.0) -> bool:
        """Accept, read and answer what is there, waiting at most ``timeout``; drop the late.

        False if the round failed (logged): a bug here must not end the supervisor, nor the probes
        for good."""
        try:
            self._round(timeout)
        except Exception:
            logger.exception("health server round failed")
            return False
        return True

    def _round(self, timeout: float) -> None:
        if self._accept_paused_until is not None and self.clock() >= self._accept_paused_until:
            self._accept_paused_until = None
            self._selector.register(self.socket, selectors.EVENT_READ)
        # (The clients' requests first, new connections last: a flood of connections must not drop
        # a probe whose request is already there.)
        ready = sorted(self._selector.select(timeout), key=lambda event: event[0].fileobj is self.socket)
        for key, _events in ready:
            if key.fileobj is self.socket:
                self._accept()
            elif key.fileobj is self._wake_r:
                try:
                    self._wake_r.recv(64)
                except OSError:
                    pass
            else:
                client = self._clients.get(key.fd)
                if client is not None:
                    self._read(client)
        now = self.clock()
        for client in [c for c in self._clients.values() if c.deadline <= now]:
            logger.debug("health probe from %s: no whole request within %.1fs", client.address, self.request_timeout)
            self._answer(client, 408, {"error": f"no whole request within {self.request_timeout:g}s"})

    def _accept(self) -> None:
        for _ in range(self.max_clients):  # (a flood can't keep the owner's loop here)
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # (EMFILE, a connection reset before it was taken)
                logger.debug("health server: accept failed: %s", exc)
                if exc.errno in (errno.EMFILE, errno.ENFILE) and self._accept_paused_until is None:
                    self._selector.unregister(self.socket)
                    self._accept_paused_until = self.clock() + 0.5
                return
            sock.setblocking(False)
            if len(self._clients) >= self.max_clients:
                oldest = min(self._clients.values(), key=lambda c: c.deadline)
                logger.debug("health server: %d connections open, dropping the oldest (%s)", self.max_clients,
                             oldest.address)
                self._drop(oldest)
            client = _Client(sock, address, self.clock() + self.request_timeout)
            self._clients[sock.fileno()] = client
            self._selector.register(sock, selectors.EVENT_READ)
            self._read(client)  # (a probe's request is most often there already: answered before a drop)

    def _read(self, client: _Client) -> None:
        try:
            chunk = client.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # (the client hung up: its business, no traceback)
            logger.debug("health probe from %s: %s", client.address, exc)
            self._drop(client)
            return
        if not chunk:
            logger.debug("health probe from %s: hung up before a whole request", client.address)
            self._drop(client)
            return
        client.data += chunk
        end = client.data.find(b"\r\n\r\n")
        if end < 0:
            end = client.data.find(b"\n\n")
        if end < 0:
            if len(client.data) > MAX_REQUEST:
                self._answer(client, 431, {"error": f"request headers over {MAX_REQUEST} bytes"})
            return
        self._respond(client, bytes(client.data[:end]).split(b"\n", 1)[0].strip())

    def _respond(self, client: _Client, line: bytes) -> None:
        parts = line.split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            self._answer(client, 400, {"error": "not an HTTP/1.x request"})
            return
        method, path = parts[0], parts[1].split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            self._answer(client, 405, {"error": "GET or HEAD only"}, head=False)
            return
        if path not in (b"/healthz", b"/readyz"):
            self._answer(client, 404, {"error": "not found: /healthz or /readyz"}, head=method == b"HEAD")
            return
        try:
            health = self.state()
        except Exception:  # (a bug here must answer "unhealthy", not hang the probe or end the server)
            logger.exception("health state failed")
            self._answer(client, 503, {"status": "error"}, head=method == b"HEAD")
            return
        ok = health.alive if path == b"/healthz" else health.ready
        logger.debug("health probe from %s: %s %d", client.address, path.decode(), 200 if ok else 503)
        self._answer(client, 200 if ok else 503, {"status": "ok" if ok else "failing", **health.detail},
                     head=method == b"HEAD")

    def _answer(self, client: _Client, code: int, body: dict[str, Any], head: bool = False) -> None:
        data = json.dumps(body).encode()
        headers = [f"HTTP/1.1 {code} {REASONS[code]}", "Server: cogworker",
                   f"Date: {email.utils.formatdate(usegmt=True)}", "Content-Type: application/json",
                   f"Content-Length: {len(data)}", "Cache-Control: no-store", "Connection: close"]
        if code == 405:
            headers.append("Allow: GET, HEAD")
        message = ("\r\n".join(headers) + "\r\n\r\n").encode() + (b"" if head else data)
        try:
            # (a few hundred bytes into an empty send buffer: all of it, or the client is gone)
            sent = client.sock.send(message)
            if sent < len(message):
                logger.debug("health probe from %s: took %d of %d bytes of its answer", client.address, sent,
                             len(message))
        except OSError as exc:
            logger.debug("health probe from %s: answer not sent: %s", client.address, exc)
        self._drop(client)

    def _drop(self, client: _Client) -> None:
        self._clients.pop(client.sock.fileno(), None)
        try:
            self._selector.unregister(client.sock)
        except (KeyError, ValueError):
            pass
        client.sock.close()


def bind(host: str, port: int) -> HealthServer:
    """The server bound to ``host``:``port``; OSError (in use, no such address) names the settings."""
    try:
        return HealthServer(host, port)
    except OSError as exc:
        raise OSError(f'COGWORKER["HEALTH_PORT"] {port} on COGWORKER["HEALTH_HOST"] {host!r}: {exc.strerror or exc}') \
            from None
