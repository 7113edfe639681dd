"""The health probes in process: the server against hostile clients, and the verdicts it answers.

The server (engine/process/health.py) is run here on its own thread, as a lone worker runs it;
the supervisor's way (polled from its loop) is tested with a real supervisor in
tests/workers/test_health_workers.py, which shares this file's clients (``probe``, ``Dribbler``).
"""

from __future__ import annotations

import json
import logging
import select
import socket
import threading
import time
from dataclasses import dataclass

import pytest
from helpers import poll, wait_until

from django_cogworker.engine.process.children import Child
from django_cogworker.engine.process.health import (
    REQUEST_TIMEOUT,
    Health,
    HealthServer,
    fleet_verdict,
    worker_verdict,
)


@dataclass
class Answer:
    status: int  # 0: no answer (refused, timed out, cut)
    headers: dict[str, str]
    body: dict


def probe(port: int, path: str = "/healthz", method: str = "GET", timeout: float = 5.0) -> Answer:
    """One request on a socket of its own; ``status`` 0 when nothing answered within ``timeout``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: probe\r\n\r\n".encode())
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
    except OSError:
        return Answer(0, {}, {})
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    if not lines[0].startswith("HTTP/1."):
        return Answer(0, {}, {})
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return Answer(int(lines[0].split()[1]), headers, json.loads(body) if body else {})


class Dribbler:
    """A slow client: sends a probe's request line, then one header line every ``every`` seconds,
    never the blank line that ends a request; when the server drops it, it connects again.

    ``mid_request()`` says whether it is connected now with at least two lines sent and no answer:
    the premise of a test that probes beside it.
    """

    def __init__(self, port: int, every: float = 0.2):
        self.port, self.every = port, every
        self.connections = 0
        self.lines = 0  # sent on the current connection
        self.answers: list[bytes] = []  # the first line of what the server said before dropping it
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dribbler", daemon=True)

    def __enter__(self) -> Dribbler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def mid_request(self) -> bool:
        return self._thread.is_alive() and self.lines >= 2

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
                    self.lines = 0
                    self.connections += 1
                    sock.sendall(b"GET /healthz HTTP/1.1\r\n")
                    self._dribble(sock)
            except OSError as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                self._stop.wait(self.every)

    def _dribble(self, sock: socket.socket) -> None:
        while not self._stop.wait(self.every):
            if select.select([sock], [], [], 0)[0]:  # (the server answered, or closed)
                self.lines = 0
                self.answers.append(sock.recv(65536).split(b"\r\n", 1)[0])
                return
            sock.sendall(b"X-Dribble: %d\r\n" % self.lines)
            self.lines += 1


@pytest.fixture
def server():
    server = HealthServer("127.0.0.1", 0)
    server.state = lambda: Health(True, False, {"state": "quiet"})
    server.start()
    yield server
    server.stop()


def port_of(server: HealthServer) -> int:
    return server.server_address[1]


def test_each_probe_answers_from_the_state_with_a_server_header_that_names_no_version(server):
    port = port_of(server)
    healthz = probe(port, "/healthz")
    assert (healthz.status, healthz.body) == (200, {"status": "ok", "state": "quiet"})
    assert healthz.headers["Server"] == "cogworker" and "Python" not in str(healthz.headers)
    assert (healthz.headers["Content-Type"], healthz.headers["Connection"]) == ("application/json", "close")
    assert probe(port, "/readyz").body == {"status": "failing", "state": "quiet"}
    assert probe(port, "/readyz").status == 503
    assert probe(port, "/healthz?verbose=1").status == 200
    assert probe(port, "/nope").status == 404
    head = probe(port, "/healthz", method="HEAD")
    assert (head.status, head.body, head.headers["Content-Length"]) == (200, {}, healthz.headers["Content-Length"])
    assert (probe(port, "/healthz", method="POST").status, probe(port, "/healthz", "POST").headers["Allow"]) == \
        (405, "GET, HEAD")


def test_a_state_that_raises_answers_503_and_the_server_goes_on(server, caplog):
    def broken():
        raise RuntimeError("a bug in the verdict")

    server.state = broken
    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        assert probe(port_of(server)).status == 503
    assert "health state failed" in caplog.text
    server.state = lambda: Health(True, True)
    assert probe(port_of(server), "/readyz").status == 200


def test_a_client_that_dribbles_its_request_holds_up_no_other_probe_and_is_cut_at_the_deadline(server):
    # http.server read a line at a time, 2 s per read: one header line a second held the server
    # (and the supervisor serving on its loop) for as long as the client liked.
    port = port_of(server)
    with Dribbler(port) as slow:
        wait_until(slow.mid_request, timeout=10, message="the slow client in the middle of its request")
        first = slow.connections
        for _ in range(5):
            assert probe(port).status == 200
        assert slow.connections == first  # (premise: still the same request, still coming)
        # Cut within the deadline of the whole request, though each line came well within it.
        wait_until(lambda: slow.answers, timeout=REQUEST_TIMEOUT + 10, message="the slow client cut off")
        assert slow.answers[0] == b"HTTP/1.1 408 Request Timeout" and not slow.errors


def test_idle_connections_beyond_any_backlog_keep_no_probe_out(server):
    # http.server's backlog was 5: a handful of sockets that connect and send nothing filled it.
    port = port_of(server)
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(80)]
    try:
        for _ in range(3):
            assert probe(port).status == 200
    finally:
        for sock in idle:
            sock.close()


def test_a_client_that_hangs_up_mid_request_leaves_no_traceback(server, caplog):
    port = port_of(server)
    with caplog.at_level(logging.DEBUG, logger="django_cogworker"):
        for how in ("close", "reset"):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            if how == "reset":  # (an RST, not a FIN: the read fails)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            sock.close()
        assert probe(port).status == 200
        poll(lambda: sum("hung up" in r.getMessage() or "Connection reset" in r.getMessage()
                         for r in caplog.records) >= 2, timeout=10)  # (both seen: logged at DEBUG)
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]


def test_the_polled_server_never_waits_on_a_client(caplog):
    # The supervisor's way: serve() from its own loop, after each wake-up. With a client in the
    # middle of its request, a round returns at once instead of reading on.
    server = HealthServer("127.0.0.1", 0, request_timeout=1.0)
    try:
        port = port_of(server)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as slow:
            slow.sendall(b"GET /healthz HTTP/1.1\r\n")
            assert select.select([server.fileno()], [], [], 10)[0]  # (the owner's select wakes for it)
            server.serve()
            assert len(server._clients) == 1 and 0 < server.next_deadline() <= 1.0
            started = time.monotonic()
            while time.monotonic() - started < 0.5:
                server.serve()  # (each round returns: the client sends nothing more)
            wait_until(lambda: server.serve() and not server._clients, timeout=10, message="cut at its deadline")
            assert slow.recv(100).startswith(b"HTTP/1.1 408 ")
    finally:
        server.close()


# -- the verdicts -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("state", "alive", "failing", "ready"), [
    ("running", True, (), True),
    ("running", True, ("fetcher",), False),  # Redis gone: the fetcher's waiting call failed at once
    ("running", True, ("heartbeat",), False),
    ("running", False, (), False),  # Redis frozen: no beat for 2 intervals, none failed yet
    ("starting", True, (), False),
    ("quiet", True, (), False),
])
def test_a_worker_is_ready_while_it_runs_and_reaches_redis(state, alive, failing, ready):
    verdict = worker_verdict(state, alive, failing, {"identity": "x"})
    assert (verdict.alive, verdict.ready) == (alive, ready)
    assert verdict.detail["state"] == state and verdict.detail.get("redis_failing", []) == list(failing)


def test_a_supervisor_is_ready_while_every_slot_s_newest_child_can_fetch():
    now, interval = 100.0, 0.5
    a = Child(11, 0, 0, 90.0, None, ready=True, last_beat=99.8)
    b = Child(12, 1, 0, 90.0, None, ready=True, last_beat=99.9)

    def verdict(newest=(a, b), cut_off=(), **kw):
        return fleet_verdict([a, b], list(newest), set(cut_off), now=now, interval=interval,
                             **{"quiet": False, "stopping": False, "generation": 0, **kw})

    assert (verdict().alive, verdict().ready, verdict().detail["state"]) == (True, True, "running")
    cut = verdict(cut_off=[12])
    assert (cut.alive, cut.ready) == (True, False)
    assert [p["can_fetch"] for p in cut.detail["processes"]] == [True, False]
    b.last_beat = 98.9  # (over 2 intervals: frozen, or cut off with its beats failing)
    assert (verdict().alive, verdict().ready) == (False, False)
    b.last_beat = 99.9
    assert not verdict(newest=(a, None)).ready  # a restart due
    assert verdict(quiet=True).detail["state"] == "quiet" and not verdict(quiet=True).ready
    b.ready = False
    assert verdict().detail["state"] == "starting" and not verdict().ready
