"""Test infrastructure: private redis-server processes, worker subprocesses, polling.

srv = RedisServer(tmp_path, appendonly=True).start()   # extra server for fault tests
srv.kill(); srv.restart()                               # kill -9, then same port and dir

with Worker("-c", "2", env={"COGWORKER_REDIS_URL": srv.url}) as w:
    identity = w.wait_ready()
    ...
    w.term(); assert w.wait(30) == 0
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PREFIX = "cogworker:"
# Worker env for end-to-end and fault tests: small thresholds so a crash is noticed in seconds.
FAST_ENV = {
    "COGWORKER_HEARTBEAT_INTERVAL": "0.5",
    "COGWORKER_ORPHAN_THRESHOLD": "3",
    "COGWORKER_POLL_INTERVAL_AVERAGE": "0.2",
    "COGWORKER_SHUTDOWN_TIMEOUT": "5",
}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (another process may still take it: callers retry)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def in_thread(fn):
    """Run ``fn`` on a new thread; return what it returned (or raise what it raised)."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    if "error" in out:
        raise out["error"]
    return out["value"]


def wait_until(predicate: Callable[[], Any], timeout: float = 10, interval: float = 0.05, message: str = ""):
    """Poll `predicate` until it returns something truthy, and return that; AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            what = message or getattr(predicate, "__name__", repr(predicate))
            raise AssertionError(f"timed out after {timeout}s waiting for: {what} (last value: {value!r})")
        time.sleep(interval)


def poll(predicate: Callable[[], Any], timeout: float = 10, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` passes; return whether it held.

    For a wait whose end the test then examines either way (what is still missing is counted, or
    handed to another process); where not holding is the failure, use ``wait_until``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True


def redis_server_binary() -> str:
    """Path of redis-server; fails loudly (never skips): the suite cannot mean anything without it."""
    path = shutil.which("redis-server")
    if not path:
        raise RuntimeError(
            "redis-server is not on PATH. The test-suite starts its own Redis servers; install it "
            "(`bash scripts/ensure_redis_server.sh`, or apt-get install redis-server) or run `make test`."
        )
    return path


def connect(url: str, **kwargs: Any) -> Any:
    """A client of ``url``: a redis:// one, a redis+sentinel:// one (its primary) or a
    redis+cluster:// seed list (redis-py's cluster client); the caller closes it."""
    from django_cogworker.broker.sentinel import is_sentinel_url, make_sentinel_redis

    if is_sentinel_url(url):
        return make_sentinel_redis(url, kwargs)
    if url.startswith(("redis+cluster://", "rediss+cluster://")):
        from redis.cluster import ClusterNode, RedisCluster

        seeds = url.partition("://")[2].split(",")
        return RedisCluster(startup_nodes=[ClusterNode(*s.rsplit(":", 1)) for s in seeds], **kwargs)
    return redis.Redis.from_url(url, **kwargs)


def _ping(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


class RedisServer:
    """A redis-server child process on 127.0.0.1 that a test can start, kill -9 and restart.

    `dir` holds its data and log (redis.log). With appendonly=True every write is fsynced before
    the reply (appendfsync always), so data acknowledged before kill() is there after restart().
    The port is picked free at the first start() unless given, and kept by restart().
    """

    def __init__(
        self,
        dir: str | os.PathLike | None = None,
        port: int | None = None,
        appendonly: bool = False,
        extra_args: tuple[str, ...] | list[str] = (),
        password: str | None = None,
    ):
        self._own_dir = dir is None
        self.dir = Path(dir) if dir is not None else Path(tempfile.mkdtemp(prefix="cogworker-redis-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port
        self.appendonly = appendonly
        self.extra_args = list(extra_args)
        # With a password the server requires AUTH (--requirepass) and `url` carries it.
        self.password = password
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def log_path(self) -> Path:
        return self.dir / "redis.log"

    def client(self, **kwargs) -> redis.Redis:
        """A new client on this server (caller closes it)."""
        return redis.Redis.from_url(self.url, **kwargs)

    def _argv(self) -> list[str]:
        argv = [
            redis_server_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--daemonize",
            "no",
            "--logfile",
            str(self.log_path),
        ]
        if self.appendonly:
            argv += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            argv += ["--appendonly", "no"]
        if self.password:
            argv += ["--requirepass", self.password]
        return argv + self.extra_args

    def start(self, timeout: float = 10) -> RedisServer:
        if self.running:
            raise RuntimeError(f"redis-server already running on port {self.port}")
        # A port from free_port() can be taken before redis binds it: then retry with another.
        # A known port (given, or from an earlier start) is kept: restart() relies on that.
        pinned = self.port is not None
        for _ in range(1 if pinned else 5):
            if not pinned:
                self.port = free_port()
            self.proc = subprocess.Popen(
                self._argv(),
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + timeout
            while self.proc.poll() is None and time.monotonic() < deadline:
                if _ping(self.url):
                    return self
                time.sleep(0.02)
            self._reap()
        tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
        raise RuntimeError(f"redis-server did not come up on port {self.port}; log:\n{tail}")

    def _reap(self, timeout: float = 10) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL, as a crash would: nothing is saved beyond what the AOF already has."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 10) -> None:
        """Graceful stop (SIGTERM, which also makes Redis flush the AOF); SIGKILL past timeout."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._reap()

    def restart(self, timeout: float = 10) -> RedisServer:
        """Stop if running, then start again on the same port and dir."""
        self.stop()
        return self.start(timeout)

    def cleanup(self) -> None:
        """Stop and, if the dir was made here, remove it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self if self.running else self.start()

    def __exit__(self, *exc) -> None:
        self.cleanup()


class Cluster:
    """A Redis Cluster of ``masters`` redis-server primaries (no replicas) on free loopback ports
    (one primary: a cluster of one shard, every slot its own).

    Each node is a RedisServer started with ``--cluster-enabled yes``; ``start`` joins them with
    ``redis-cli --cluster create`` and waits until every node says ``cluster_state:ok``.
    ``url`` is the ``redis+cluster://`` seed list; ``cleanup`` stops every node by its pid.
    """

    def __init__(self, dir: str | os.PathLike, masters: int = 3):
        self.dir = Path(dir)
        self.nodes = [
            RedisServer(self.dir / f"node{i}", extra_args=(
                "--cluster-enabled", "yes", "--cluster-config-file", str(self.dir / f"node{i}" / "nodes.conf"),
                "--cluster-node-timeout", "2000"), port=cluster_port())
            for i in range(masters)
        ]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def start(self, timeout: float = 30) -> Cluster:
        """Start the nodes and join them."""
        try:
            for node in self.nodes:
                node.start()
            if len(self.nodes) == 1:  # (redis-cli --cluster create wants three: one node takes every slot)
                client = self.nodes[0].client()
                client.execute_command("CLUSTER ADDSLOTSRANGE", 0, 16383)
                client.close()
                wait_until(self._ok, timeout=timeout, interval=0.1, message="cluster_state:ok")
                return self
            subprocess.run(
                [shutil.which("redis-cli") or "redis-cli", "--cluster", "create",
                 *(f"127.0.0.1:{node.port}" for node in self.nodes), "--cluster-replicas", "0", "--cluster-yes"],
                check=True, capture_output=True, timeout=timeout)
            wait_until(self._ok, timeout=timeout, interval=0.1, message="cluster_state:ok on every node")
        except BaseException:
            self.cleanup()
            raise
        return self

    def _ok(self) -> bool:
        for node in self.nodes:
            client = node.client()
            try:
                if client.execute_command("CLUSTER INFO").get("cluster_state") != "ok":
                    return False
            finally:
                client.close()
        return True

    def node_of(self, key: str) -> RedisServer:
        """The node whose primary serves ``key``'s slot."""
        client = self.nodes[0].client()
        try:
            slot = client.execute_command("CLUSTER KEYSLOT", key)
            for start, end, primary, *_ in client.execute_command("CLUSTER SLOTS"):
                if start <= slot <= end:
                    return next(node for node in self.nodes if node.port == int(primary[1]))
        finally:
            client.close()
        raise AssertionError(f"no node serves slot {slot}")

    def add_replica(self, primary: RedisServer, timeout: float = 30) -> RedisServer:
        """Start one more node and make it a replica of ``primary``; return it once in sync."""
        index = len(self.nodes)
        replica = RedisServer(self.dir / f"node{index}", extra_args=(
            "--cluster-enabled", "yes", "--cluster-config-file", str(self.dir / f"node{index}" / "nodes.conf"),
            "--cluster-node-timeout", "2000"), port=cluster_port())
        self.nodes.append(replica)
        replica.start()
        client = primary.client()
        try:
            primary_id = client.execute_command("CLUSTER MYID")
        finally:
            client.close()
        subprocess.run([shutil.which("redis-cli") or "redis-cli", "--cluster", "add-node",
                        f"127.0.0.1:{replica.port}", f"127.0.0.1:{primary.port}", "--cluster-slave",
                        "--cluster-master-id", _text(primary_id)], check=True, capture_output=True, timeout=timeout)

        def synced() -> bool:
            c = replica.client()
            try:
                return c.info("replication").get("master_link_status") == "up" and self._ok()
            except redis.RedisError:
                return False
            finally:
                c.close()

        wait_until(synced, timeout=timeout, interval=0.1, message="the replica in sync")
        return replica

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.cleanup()


def cluster_port() -> int:
    """A free port for a cluster node: at most 55535, its cluster bus port (+10000) free too."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 55535)
        if _free(port) and _free(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


client_for = connect  # (the name the cluster tests use)


# Every Worker started in this test process, until conftest.py's clean_redis kills what is left of
# them after each test (kill_started): a worker a test left running (no ``with``, or killed -9 alone
# with its --processes children TERMed) stopped gracefully into the next test, its counts flushed and
# its jobs handed back into that test's Redis after its FLUSHDB.
STARTED: list[Worker] = []


def kill_started() -> None:
    """SIGKILL every process the Workers started so far began (each its group), and forget them."""
    while STARTED:
        started = STARTED.pop()
        started.kill9()
        started.kill_group()


class Worker:
    """`python manage.py runcogworker *args` as a subprocess of the test, started at construction.

    env: overrides on top of os.environ (which carries the suite's COGWORKER_REDIS_URL), e.g.
    {"COGWORKER_REDIS_URL": srv.url, "COGWORKER_CONCURRENCY": "2"}. Output (stdout+stderr) goes to
    `log_path` (default: a file in a new temp dir). As a context manager it is killed (-9) on exit,
    with every process it started: it runs in a session (process group) of its own, which its
    ``--processes`` children share. (Killing the supervisor alone TERMed its children, which then
    stopped gracefully up to SHUTDOWN_TIMEOUT later, flushing their counts and handing jobs back
    into the Redis of the next test, after its FLUSHDB: that test's counts were off.)
    """

    def __init__(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        log_path: str | os.PathLike | None = None,
        prefix: str = DEFAULT_PREFIX,
        cwd: str | os.PathLike = REPO_ROOT,
    ):
        self.args = [str(a) for a in args]
        # The suite's settings (the test project's plus its PostgreSQL and MariaDB databases), as in the
        # test process: a worker reads the outbox rows a test wrote in any of them.
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "DJANGO_SETTINGS_MODULE": "testproject.suite_settings"}
        self.env.update({k: str(v) for k, v in (env or {}).items()})
        self.redis_url = self.env.get("COGWORKER_REDIS_URL") or self.env.get("REDIS_URL")
        self.prefix = prefix
        if log_path is None:
            # Kept after the worker exits (tests read it then); removed when the test run ends.
            log_dir = tempfile.mkdtemp(prefix="cogworker-worker-")
            atexit.register(shutil.rmtree, log_dir, ignore_errors=True)
            log_path = Path(log_dir) / "worker.log"
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.identity: str | None = None
        self._log_file = open(self.log_path, "ab")  # closed by wait() / __exit__
        STARTED.append(self)  # (killed with its group at the test's end: conftest.py's clean_redis)
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "runcogworker", *self.args],
            cwd=cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _find_identity(self, client: redis.Redis) -> str | None:
        for identity in client.smembers(self.prefix + "processes"):
            info = client.hget(f"{self.prefix}process:{identity}", "info")
            try:
                if info and json.loads(info).get("pid") == self.pid:
                    return identity
            except ValueError:
                continue
        return None

    def wait_ready(self, timeout: float = 20) -> str:
        """Wait until this process has registered itself in Redis; returns its identity."""
        if not self.redis_url:
            raise RuntimeError("Worker has no COGWORKER_REDIS_URL/REDIS_URL to poll")
        client = connect(self.redis_url, decode_responses=True)
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if not self.alive:
                    code = self.proc.returncode
                    raise AssertionError(f"worker exited with {code} before ready; log:\n{self.log()}")
                try:
                    self.identity = self._find_identity(client)
                except redis.ConnectionError:
                    self.identity = None  # a fault test may have Redis down for a moment
                if self.identity:
                    return self.identity
                time.sleep(0.05)
        finally:
            client.close()
        raise AssertionError(f"worker pid {self.pid} not registered after {timeout}s; log:\n{self.log()}")

    def children(self, client: redis.Redis) -> dict[str, dict]:
        """Identity -> info of the registered worker processes this (--processes N) supervisor forked."""
        found = {}
        for identity in client.smembers(self.prefix + "processes"):
            info = client.hget(f"{self.prefix}process:{_text(identity)}", "info")
            try:
                info = json.loads(info) if info else None
            except ValueError:
                continue
            # (the supervisor's identity is "<host>:<pid>:<hex>", like a worker's)
            if info and str(info.get("supervisor", "")).split(":")[1:2] == [str(self.pid)]:
                found[_text(identity)] = info
        return found

    def signal(self, sig: int) -> None:
        if self.alive:
            self.proc.send_signal(sig)

    def term(self) -> None:
        self.signal(signal.SIGTERM)

    def kill9(self) -> None:
        self.signal(signal.SIGKILL)

    def stall(self) -> None:
        """SIGSTOP, and wait until the kernel has stopped it (a frozen VM, a process cut off)."""
        self.signal(signal.SIGSTOP)
        wait_until(lambda: _state(self.pid) in ("T", "t"), timeout=10, interval=0.01, message="the worker stopped")

    def wake(self) -> None:
        """SIGCONT: a stalled worker carries on where it stopped."""
        self.signal(signal.SIGCONT)

    def wait(self, timeout: float = 30) -> int:
        """Exit code (negative: killed by that signal); AssertionError if still running after timeout."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker pid {self.pid} still running after {timeout}s; log:\n{self.log()}")
        self._log_file.close()
        return code

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.kill9()
        self.kill_group()  # (before the leader is reaped: its group's id can't be anyone else's yet)
        self.proc.wait(10)
        self._log_file.close()

    def kill_group(self) -> None:
        """SIGKILL whatever is left of the processes this worker started (its children, a supervisor's)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)


def every_value(rb: redis.Redis) -> list[tuple[bytes, bytes]]:
    """(key, value) for every key of the database (a bytes client), whatever its type: each read whole, as
    text (DUMP's compression could hide what a test looks for), a stream's entries as JSON."""
    found = []
    for key in rb.scan_iter(count=1000):
        kind = rb.type(key)
        if kind == b"string":
            value = rb.get(key) or b""
        elif kind == b"list":
            value = b"\n".join(rb.lrange(key, 0, -1))
        elif kind == b"set":
            value = b"\n".join(rb.smembers(key))
        elif kind == b"zset":
            value = b"\n".join(member for member, _score in rb.zrange(key, 0, -1, withscores=True))
        elif kind == b"hash":
            value = b"\n".join(k + b"=" + v for k, v in rb.hgetall(key).items())
        elif kind == b"stream":
            value = b"\n".join(json.dumps({k.decode(): v.decode() for k, v in fields.items()}).encode()
                               for _id, fields in rb.xrange(key))
        else:
            value = rb.dump(key) or b""
        found.append((key, value))
    return found


def worker(tmp_path: Path, *args: str, name: str = "worker", env: dict[str, str] | None = None) -> Worker:
    """`runcogworker *args` on FAST_ENV (plus ``env``), its log at ``tmp_path/<name>.log``."""
    return Worker(*args, env={**FAST_ENV, **(env or {})}, log_path=tmp_path / f"{name}.log")


def supervisor(tmp_path: Path, *args: str, processes: int = 2, env: dict[str, str] | None = None) -> Worker:
    """`runcogworker --processes N *args` on FAST_ENV (plus ``env``), its log at ``tmp_path/supervisor.log``."""
    return Worker("--processes", str(processes), *args, env={**FAST_ENV, **(env or {})},
                  log_path=tmp_path / "supervisor.log")


def round_trips(monkeypatch: Any) -> dict[str, int]:
    """Count every redis-py client's round trips (a command, a pipeline) from now on: ``{"n": ...}``."""
    trips = {"n": 0}
    for cls, name in ((redis.Redis, "execute_command"), (redis.client.Pipeline, "execute")):
        real = getattr(cls, name)

        def counted(self: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            trips["n"] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, counted)
    return trips


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _state(pid: int) -> str:
    """The state letter of process ``pid`` in /proc ("T": stopped by a signal)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie nobody reaped, as an orphan in a container may stay, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def refuse(client: redis.Redis, how: str) -> None:
    """Make Redis refuse writes server-wide ("oom": out of memory; "noreplicas": a primary set with
    ``min-replicas-to-write`` whose replica has gone, as after a failover; "readonly": a replica of
    a master that isn't there; "masterdown": such a replica that refuses reads too). ``serve_again``
    undoes it."""
    if how == "oom":
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 1)
    elif how == "noreplicas":
        client.config_set("min-replicas-to-write", 1)
    else:
        client.replicaof("127.0.0.1", free_port())
        if how == "masterdown":
            client.config_set("replica-serve-stale-data", "no")


def serve_again(client: redis.Redis) -> None:
    client.config_set("maxmemory", 0)
    client.config_set("min-replicas-to-write", 0)
    client.config_set("replica-serve-stale-data", "yes")
    client.replicaof("NO", "ONE")


class Proxy:
    """A TCP proxy in front of a redis-server, for the faults a network makes. Each connection
    through it is a connection to the server; until told otherwise, bytes flow both ways.

    proxy = Proxy(srv.port)                      # proxy.url() reaches srv
    proxy.freeze()                               # the subscriptions through it go silent both ways,
                                                 # their sockets open (a partition, a dropped flow)
    proxy.on_next_reply("drop")                  # the next command is applied, and its connection
                                                 # closed before the reply: redis-py sends it again
    proxy.on_next_reply(lambda: refuse(c, how))  # run first, then the reply goes through
    proxy.close()

    ``on_next_reply`` is armed by the next command any connection sends (a connection already open:
    its handshake is done). Connections opened after ``freeze()`` flow normally.
    """

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.subscribers: list[socket.socket] = []
        self.frozen: list[socket.socket] = []
        self.dropped = 0  # replies dropped by on_next_reply("drop")
        self._armed: Any = None
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def freeze(self) -> None:
        self.frozen.extend(self.subscribers)

    def on_next_reply(self, action: Any) -> None:
        with self._lock:
            self._armed = action

    def close(self) -> None:
        self.listener.close()
        with self._lock:
            _close(*self._sockets)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            with self._lock:
                self._sockets += [client, upstream]
            pending: list[Any] = []  # what to do with the next replies on this connection
            threading.Thread(target=self._pump, args=(client, upstream, client, pending), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, client, pending), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, client: socket.socket, pending: list[Any]) -> None:
        while data := _recv(src):
            if src is client:
                if b"SUBSCRIBE" in data and client not in self.subscribers:
                    self.subscribers.append(client)
                with self._lock:
                    if self._armed is not None:  # (marked before it is sent: its reply can't come first)
                        pending.append(self._armed)
                        self._armed = None
            elif pending:
                action = pending.pop()
                if action == "drop":
                    self.dropped += 1
                    break
                action()
            if client in self.frozen:
                continue  # dropped
            try:
                dst.sendall(data)
            except OSError:
                break
        _close(src, dst)


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _close(*sockets: socket.socket) -> None:
    for sock in sockets:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()


class Sentinels:
    """A primary, one replica and three sentinels on 127.0.0.1 (free ports), for failover tests.

    sentinels = Sentinels(tmp_path).start()    # replica in sync, every sentinel knows the others
    sentinels.url                               # redis+sentinel://127.0.0.1:p1,...:p3/<service>/0
    sentinels.primary.kill()                    # kill -9 the primary (by its pid)
    sentinels.wait_failover()                   # until a sentinel names the replica as primary
    sentinels.cleanup()

    Low ``down_after`` and ``failover_timeout`` (milliseconds) make a failover take seconds.
    Every process is stopped by its own pid; nothing listens on 6379.
    """

    def __init__(self, dir: str | os.PathLike, service: str = "cogmaster", down_after: int = 1000,
                 failover_timeout: int = 3000, primary_args: tuple[str, ...] = ()):
        self.dir = Path(dir)
        self.service = service
        self.down_after, self.failover_timeout = down_after, failover_timeout
        self.primary = RedisServer(self.dir / "primary", extra_args=primary_args)
        self.replica: RedisServer | None = None
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def start(self, timeout: float = 20) -> Sentinels:
        try:
            return self._start(timeout)
        except BaseException:
            self.cleanup()  # (nothing left running when a start fails)
            raise

    def _start(self, timeout: float) -> Sentinels:
        self.primary.start()
        self.replica = RedisServer(self.dir / "replica",
                                   extra_args=("--replicaof", "127.0.0.1", str(self.primary.port))).start()
        wait_until(lambda: replication_info(self.replica).get("master_link_status") == "up",
                   timeout=timeout, message="the replica in sync with the primary")
        for i in range(3):
            self._start_sentinel(i)
        wait_until(self._all_know_each_other, timeout=timeout, interval=0.1,
                   message="every sentinel seeing the replica and the two other sentinels")
        return self

    def _start_sentinel(self, i: int) -> None:
        home = self.dir / f"sentinel{i}"
        home.mkdir(parents=True, exist_ok=True)
        for _ in range(5):  # (a free port may be taken before the sentinel binds it)
            port = free_port()
            conf = home / "sentinel.conf"  # (rewritten by the sentinel: it must be writable)
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndaemonize no\ndir {home}\nlogfile {home / 'sentinel.log'}\n"
                f"sentinel monitor {self.service} 127.0.0.1 {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {self.service} {self.down_after}\n"
                f"sentinel failover-timeout {self.service} {self.failover_timeout}\n"
                f"sentinel parallel-syncs {self.service} 1\n")
            proc = subprocess.Popen([redis_server_binary(), str(conf), "--sentinel"], cwd=home,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            url = f"redis://127.0.0.1:{port}"
            if wait_until(lambda p=proc, u=url: p.poll() is not None or _ping(u), timeout=10) and proc.poll() is None:
                self.ports.append(port)
                self.procs.append(proc)
                return
            proc.wait(10)
        raise RuntimeError(f"sentinel {i} did not come up; see {home / 'sentinel.log'}")

    def sentinel_client(self, i: int = 0) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.ports[i], decode_responses=True, socket_timeout=2)

    def _all_know_each_other(self) -> bool:
        for i in range(len(self.ports)):
            client = self.sentinel_client(i)
            try:
                state = client.sentinel_master(self.service)
                if int(state["num-other-sentinels"]) < 2 or int(state["num-slaves"]) < 1:
                    return False
            except redis.RedisError:
                return False
            finally:
                client.close()
        return True

    def primary_ports(self) -> list[int | None]:
        """The primary's port as each sentinel names it (None: that one doesn't answer)."""
        ports: list[int | None] = []
        for i in range(len(self.ports)):
            client = self.sentinel_client(i)
            try:
                ports.append(int(client.sentinel_get_master_addr_by_name(self.service)[1]))
            except (redis.RedisError, TypeError):
                ports.append(None)
            finally:
                client.close()
        return ports

    def wait_failover(self, timeout: float = 30) -> float:
        """Wait until every sentinel names the replica as primary (and it acts as one); return the seconds waited."""
        assert self.replica is not None
        started = time.monotonic()

        def promoted() -> bool:
            return (set(self.primary_ports()) == {self.replica.port}
                    and replication_info(self.replica).get("role") == "master")

        wait_until(promoted, timeout=timeout, interval=0.05, message="the sentinels promoting the replica")
        return time.monotonic() - started

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        self.procs.clear()
        for server in (self.primary, self.replica):
            if server is not None:
                server.cleanup()

    def __enter__(self) -> Sentinels:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.cleanup()


def replication_info(server: RedisServer) -> dict:
    """INFO replication of ``server`` ({} when it doesn't answer)."""
    client = server.client(socket_timeout=2)
    try:
        return client.info("replication")
    except redis.RedisError:
        return {}
    finally:
        client.close()
