"""Measurement plumbing: a private redis-server, worker processes, process-tree CPU and RSS, Redis
counters, percentiles. Nothing here knows any job system (that is systems.py).

psutil is used when installed (the bench venv); the quick mode runs in the test venv without it,
so the same figures are read from /proc there (Linux only, like the bench).
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

try:
    import psutil
except ImportError:  # the test venv: /proc below
    psutil = None

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A redis-server of our own on a free loopback port, without persistence."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if not binary:
            raise RuntimeError("redis-server is not on PATH (bash scripts/ensure_redis_server.sh installs it)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        for _attempt in range(5):
            self.port = free_port()
            log = open(self.workdir / "redis.log", "ab")  # noqa: SIM115 - kept open by the child
            self.proc = subprocess.Popen(
                [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no",
                 "--dir", str(self.workdir), "--daemonize", "no"], stdout=log, stderr=subprocess.STDOUT)
            log.close()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if self.client().ping():
                        return self
                except redis.RedisError:
                    time.sleep(0.05)
            self.stop()
        raise RuntimeError(f"redis-server did not start; see {self.workdir / 'redis.log'}")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kw: Any) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=60, **kw)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def version(self) -> str:
        return str(self.client().info("server")["redis_version"])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# -- processes ---------------------------------------------------------------------------------

def _children_proc(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            kids.append(int(entry))
    return kids


def tree(pid: int) -> list[int]:
    """``pid`` and all its live descendants."""
    if psutil is not None:
        try:
            root = psutil.Process(pid)
            return [pid, *(p.pid for p in root.children(recursive=True))]
        except psutil.Error:
            return []
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        if os.path.exists(f"/proc/{p}"):
            out.append(p)
            todo.extend(_children_proc(p))
    return out


def _cpu_one(pid: int) -> float:
    """user + sys of one process, plus that of its reaped children (a fork-per-job worker's jobs).

    The process's own time comes from /proc/<pid>/task/*/schedstat (nanoseconds) where the kernel
    has it: utime/stime count whole clock ticks (10 ms), which a short drain (the quick mode's few
    hundred jobs through the bare loop) can finish inside. Threads that exited are not counted there;
    the workers measured here keep theirs for the whole drain.
    """
    try:
        own = 0
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                own += int(f.read().split()[0])
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        # fields[13:15] = cutime cstime (stat fields 16-17)
        return own / 1e9 + sum(int(x) for x in fields[13:15]) / CLK_TCK
    except (OSError, ValueError, IndexError):
        pass
    if psutil is not None:
        try:
            t = psutil.Process(pid).cpu_times()
            return t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        # fields[11:15] = utime stime cutime cstime (stat fields 14-17)
        return sum(int(x) for x in fields[11:15]) / CLK_TCK
    except (OSError, ValueError, IndexError):
        return 0.0


def _rss_one(pid: int) -> int:
    if psutil is not None:
        try:
            return psutil.Process(pid).memory_info().rss
        except psutil.Error:
            return 0
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return 0


def tree_cpu(pids: Sequence[int]) -> float:
    """CPU seconds (user + sys) used so far by the process trees rooted at ``pids``."""
    return sum(_cpu_one(p) for root in pids for p in tree(root))


def tree_cpu_all_threads(pids: Sequence[int]) -> float:
    """CPU seconds of the process trees rooted at ``pids``, threads that exited included: utime +
    stime (+ reaped children's) from /proc/<pid>/stat, in clock ticks (10 ms). ``tree_cpu`` reads the
    live threads' schedstat, finer but blind to a thread that ended: asgiref's ``async_to_sync`` runs
    each ``async def perform`` on a thread of its own that ends with it (the async-jobs section)."""
    total = 0.0
    for root in pids:
        for p in tree(root):
            try:
                with open(f"/proc/{p}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += sum(int(x) for x in fields[11:15]) / CLK_TCK
            except (OSError, ValueError, IndexError):
                pass
    return total


def tree_threads(pids: Sequence[int]) -> int:
    """Threads of the process trees rooted at ``pids`` now (``Threads:`` of /proc/<pid>/status)."""
    total = 0
    for root in pids:
        for p in tree(root):
            try:
                with open(f"/proc/{p}/status") as f:
                    total += next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
            except (OSError, ValueError, StopIteration):
                pass
    return total


class ThreadPeak:
    """The most threads the trees rooted at ``pids`` had at once, sampled every ``interval`` s on a
    thread of the bench's until ``stop()`` (which returns the peak)."""

    def __init__(self, pids: Sequence[int], interval: float = 0.01):
        import threading

        self.pids, self.interval, self.peak = list(pids), interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_threads(self.pids))
            self._stop.wait(self.interval)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def tree_rss(pids: Sequence[int]) -> int:
    """Resident bytes of the process trees rooted at ``pids`` (summed: shared pages count twice)."""
    return sum(_rss_one(p) for root in pids for p in tree(root))


@dataclass
class Worker:
    """A worker process we started (its own session, so its whole tree can be signalled)."""

    name: str
    proc: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 20) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        # Whatever is left of the tree (a forked child, a pool process): kill it.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


def spawn(name: str, argv: Sequence[str], *, env: dict[str, str], cwd: Path, logdir: Path) -> Worker:
    logdir.mkdir(parents=True, exist_ok=True)
    log = logdir / f"{name}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(list(argv), env=env, cwd=str(cwd), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return Worker(name, proc, log)


def machine_busy() -> float:
    """CPU seconds the whole machine has spent busy (all CPUs, from /proc/stat); 0.0 where unreadable."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / CLK_TCK


def cpuidle_driver() -> str | None:
    """The kernel's cpuidle driver (how an idle CPU sleeps, so what waking it costs), None without cpuidle."""
    try:
        return Path("/sys/devices/system/cpu/cpuidle/current_driver").read_text().strip() or None
    except OSError:
        return None


def own_cpu() -> float:
    """CPU seconds of this (the bench) process."""
    t = os.times()
    return t.user + t.system


# -- Redis counters ----------------------------------------------------------------------------

# The bench's own commands, never counted as a system's: its INFO snapshots and CONFIG RESETSTAT.
OWN_COMMANDS = ("info", "config|resetstat", "config")


@dataclass
class Snap:
    """One INFO ALL: time, per-command calls, read/write events, Redis CPU seconds."""

    t: float
    calls: dict[str, int]
    reads: int
    writes: int
    cpu: float
    info: dict[str, Any] = field(repr=False, default_factory=dict)


def snap(r: redis.Redis) -> Snap:
    info = r.info("all")
    t = time.perf_counter()
    calls = {k[len("cmdstat_"):]: int(v["calls"]) for k, v in info.items() if k.startswith("cmdstat_")}
    return Snap(t, calls, int(info.get("total_reads_processed", 0)), int(info.get("total_writes_processed", 0)),
                float(info["used_cpu_user"]) + float(info["used_cpu_sys"]), info)


@dataclass
class RedisDelta:
    seconds: float
    commands: int
    round_trips: int
    cpu: float
    by_command: dict[str, int]


def delta(a: Snap, b: Snap, own_gets: int = 0) -> RedisDelta:
    """What happened in Redis between ``a`` and ``b``, less the bench's own traffic.

    Own traffic: INFO and CONFIG (by name), ``own_gets`` GETs of the counter (the completion poll),
    and, for round trips, one event per own request (the GETs and the INFO that made ``b``; the
    INFO that made ``a`` was read before it was counted).
    """
    by = {}
    for name in set(a.calls) | set(b.calls):
        if name in OWN_COMMANDS or name.startswith("config"):
            continue
        n = b.calls.get(name, 0) - a.calls.get(name, 0)
        if name == "get":
            n -= own_gets
        if n > 0:
            by[name] = n
    return RedisDelta(seconds=b.t - a.t, commands=sum(by.values()),
                      round_trips=max(0, (b.reads - a.reads) - own_gets - 1),
                      cpu=max(0.0, b.cpu - a.cpu), by_command=by)


class Counter:
    """Polls the completion counter (GET ``key``) and remembers how many GETs that took."""

    def __init__(self, r: redis.Redis, key: str = "bench:done"):
        self.r = r
        self.key = key
        self.gets = 0

    def value(self) -> int:
        self.gets += 1
        return int(self.r.get(self.key) or 0)

    def wait_for(self, target: int, timeout: float, alive: Callable[[], bool] = lambda: True,
                 interval: float = 0.005) -> int:
        """Poll until the counter reaches ``target``; return it. TimeoutError or RuntimeError (dead)."""
        deadline = time.monotonic() + timeout
        last_alive_check = 0.0
        while True:
            v = self.value()
            if v >= target:
                return v
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError(f"counter at {v} of {target} after {timeout:.0f}s")
            if now - last_alive_check > 0.5:
                last_alive_check = now
                if not alive():
                    raise RuntimeError(f"worker exited with the counter at {v} of {target}")
            time.sleep(interval)


# -- numbers -----------------------------------------------------------------------------------

def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))
    return ordered[k]


def rnd(x: float, digits: int = 3) -> float:
    """Round to ``digits`` significant figures (JSON stays readable)."""
    if not x or not math.isfinite(x):
        return x
    return round(x, max(0, digits - 1 - int(math.floor(math.log10(abs(x))))))


def median_row(runs: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    """One way's row of an on/off section: the median of each of ``keys`` over its ``runs`` (rounded),
    and the runs themselves (those keys only) under "runs", for the page's ranges."""
    row: dict[str, Any] = {k: rnd(statistics.median(r[k] for r in runs)) for k in keys}
    row["runs"] = [{k: r[k] for k in keys} for r in runs]
    return row


def fewer_pct(off: float, on: float) -> float:
    """How many percent fewer ``on`` is than ``off`` (jobs/s, pushes/s): below zero when more."""
    return round(100 * (1 - on / off), 1)
