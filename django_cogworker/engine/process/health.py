"""Health probes over HTTP: ``/healthz`` (alive) and ``/readyz`` (taking jobs), for Kubernetes and the like.

``/healthz`` answers 200 while the process's heartbeats reach Redis, 503 once its last good beat
(or its start, before the first) is older than twice HEARTBEAT_INTERVAL: the moment the others
start counting it as late. ``/readyz`` answers 200 while the process takes jobs, 503 while it is
starting (no beat yet, processors not started) or quiet (TSTP, a cap, a rolling restart, a stop).
Under ``--processes`` the supervisor answers for all its children (engine/process/supervisor.py):
200 only if every one of them is. Each answer carries a small JSON body saying why.

It listens on HEALTH_HOST (127.0.0.1 unless told otherwise: a probe from the kubelet reaches a
pod's own address, and nothing else should see it) and HEALTH_PORT, bound at startup so that a
port in use fails there, naming the setting.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

logger = logging.getLogger(__name__)

# Seconds a client may take to send its request: the supervisor answers on its only thread.
REQUEST_TIMEOUT = 2.0


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


class _Handler(BaseHTTPRequestHandler):
    timeout = REQUEST_TIMEOUT
    server: HealthServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        path = self.path.split("?", 1)[0]
        if path not in ("/healthz", "/readyz"):
            self._answer(404, {"error": "not found: /healthz or /readyz"})
            return
        try:
            health = self.server.state()
        except Exception:  # (a bug here must answer "unhealthy", not hang the probe or kill the thread)
            logger.exception("health state failed")
            self._answer(503, {"status": "error"})
            return
        ok = health.alive if path == "/healthz" else health.ready
        self._answer(200 if ok else 503, {"status": "ok" if ok else "failing", **health.detail})

    def _answer(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
        logger.debug("health probe: " + format, *args)


class HealthServer(HTTPServer):
    """The probe server: bound by ``runcogworker`` at startup, told its ``state`` by its owner.

    A lone worker serves it on the ``cogworker-health`` daemon thread (``start``, ``stop``); the
    supervisor, which must keep to one thread (it forks), calls ``serve_one`` from its select loop
    when ``fileno()`` is readable.
    """

    allow_reuse_address = True

    def __init__(self, host: str, port: int):
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.state: Callable[[], Health] = lambda: Health(False, False, {"status": "starting"})
        super().__init__((host, port), _Handler)
        self.timeout = 0  # (serve_one: handle what is there, never wait)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="cogworker-health", daemon=True)
        self._thread.start()

    def serve_one(self) -> None:
        self.handle_request()

    def stop(self) -> None:
        if self._thread is not None:
            self.shutdown()
            self._thread.join()
        self.server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.warning("health probe from %s failed", client_address, exc_info=True)


def bind(host: str, port: int) -> HealthServer:
    """The server bound to ``host``:``port``; OSError (in use, no such address) names the settings."""
    try:
        return HealthServer(host, port)
    except OSError as exc:
        raise OSError(f'COGWORKER["HEALTH_PORT"] {port} on COGWORKER["HEALTH_HOST"] {host!r}: {exc.strerror or exc}') \
            from None
