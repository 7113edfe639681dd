"""Where a no-op job's CPU goes between threads: wake-ups, CPU migrations and CPU per job, unpinned
against pinned to one CPU, at several concurrencies (issue: "one worker process that spends its CPU
on jobs, not on handing the GIL between threads").

For each row: N ``NoopIncr`` jobs (one INCR each) pushed in bulk to a private redis-server, then one
``runcogworker -c C`` drains them. From the first job done to the last, it reads:

* jobs/s, and the worker's CPU per job (user + sys of the whole process, /proc);
* context switches per job, voluntary (a thread blocked: on the GIL, a queue, a socket) and not
  (preempted), summed over the worker's threads (/proc/<pid>/task/*/status);
* with ``perf`` on PATH, CPU migrations per job (a thread woken on another CPU than it last ran
  on: ``perf stat -e cpu-migrations -p``), the software counter every kernel has.

Pinned rows run the same command under ``taskset -c 1``. Both run with ``CPU_AFFINITY = "none"``:
by default a lone worker bound by its GIL keeps itself on one CPU after its first second
(engine/process/confine.py), which would make the unpinned row a pinned one. Rows run one after the other; the
figures compare within a run, on one machine: say which (``lscpu``'s model name and the cpuidle
driver, both printed first).

    .venv/bin/python bench/wakeups.py                      # N = 20,000, c2/c10/c25, unpinned and pinned
    .venv/bin/python bench/wakeups.py --n 5000 --c 10      # one concurrency

``make bench`` runs the same table (``rows()``, against the bench's redis-server) into its page.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import redis

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT)]

from harness import RedisServer, cpuidle_driver  # noqa: E402 - after the path above

CLK_TCK = os.sysconf("SC_CLK_TCK")
COUNTER = "bench:done"
# Counted by ``perf stat`` over the drain: threads woken on another CPU, and futex calls (a thread
# waiting for, or waking, another: the GIL, a queue.SimpleQueue, a lock).
PERF_EVENTS = ("cpu-migrations", "syscalls:sys_enter_futex")


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "?")
    return f"{os.cpu_count()} CPUs, {model}, cpuidle driver: {cpuidle_driver() or '(no cpuidle)'}"


def threads_snapshot(pid: int) -> tuple[float, float, int, int]:
    """(CPU seconds of the process, of which in the kernel, voluntary, involuntary context switches over
    its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu, system = (int(fields[11]) + int(fields[12])) / CLK_TCK, int(fields[12]) / CLK_TCK
    voluntary = involuntary = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    voluntary += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    involuntary += int(line.split()[1])
        except FileNotFoundError:  # (a thread that ended meanwhile)
            continue
    return cpu, system, voluntary, involuntary


def drain(url: str, n: int, concurrency: int, pinned: bool) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COGWORKER_", "DJANGO_SETTINGS"))}
    env.update(PYTHONPATH=os.pathsep.join([str(BENCH), str(ROOT)]), COGWORKER_REDIS_URL=url, BENCH_REDIS_URL=url,
               DJANGO_SETTINGS_MODULE="benchproject.settings", PYTHONUNBUFFERED="1", BENCH_CPU_AFFINITY="none")
    r = redis.Redis.from_url(url)
    r.flushdb()
    push = subprocess.run([sys.executable, "-c", (
        "import django, time; django.setup()\n"
        "from benchproject.jobs import NoopIncr\n"
        f"n = {n}\n"
        "for start in range(0, n, 1000):\n"
        "    NoopIncr.perform_bulk([(time.time(),)] * min(1000, n - start))\n")], env=env, cwd=BENCH, check=False,
        capture_output=True, text=True)
    if push.returncode:
        raise RuntimeError(push.stderr)
    argv = [sys.executable, str(BENCH / "manage.py"), "runcogworker", "-c", str(concurrency), "-q", "default"]
    if pinned:
        argv = ["taskset", "-c", "1", *argv]
    worker = subprocess.Popen(argv, env=env, cwd=BENCH, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while int(r.get(COUNTER) or 0) < 1:
            if time.monotonic() > deadline or worker.poll() is not None:
                raise RuntimeError("the worker ran no job")
            time.sleep(0.002)
        perf = None
        if shutil.which("perf"):
            perf = subprocess.Popen(["perf", "stat", "-x,", "-e", ",".join(PERF_EVENTS),
                                     "-p", str(worker.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    text=True)
        start_done, start = int(r.get(COUNTER) or 0), time.monotonic()
        cpu0, sys0, vol0, invol0 = threads_snapshot(worker.pid)
        while int(r.get(COUNTER) or 0) < n:
            if worker.poll() is not None:
                raise RuntimeError("the worker exited")
            time.sleep(0.005)
        elapsed = time.monotonic() - start
        cpu1, sys1, vol1, invol1 = threads_snapshot(worker.pid)
        counts = dict.fromkeys(PERF_EVENTS, float("nan"))
        if perf is not None:
            perf.send_signal(signal.SIGINT)
            _, err = perf.communicate(timeout=10)
            for line in err.splitlines():
                parts = line.split(",")
                if len(parts) > 2 and parts[2] in counts and parts[0].strip().isdigit():
                    counts[parts[2]] = int(parts[0])
        jobs = n - start_done
        return {"jobs_per_s": jobs / elapsed, "cpu_us": (cpu1 - cpu0) / jobs * 1e6,
                "sys_share": (sys1 - sys0) / max(cpu1 - cpu0, 1e-9),
                "voluntary": (vol1 - vol0) / jobs, "involuntary": (invol1 - invol0) / jobs,
                "migrations": counts["cpu-migrations"] / jobs, "futex": counts["syscalls:sys_enter_futex"] / jobs}
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
        r.close()


def rows(url: str, n: int, concurrencies: Sequence[int] = (2, 10, 25), runs: int = 1) -> Iterator[dict[str, Any]]:
    """The table, one row at a time: each concurrency unpinned then pinned, the median of ``runs`` drains
    (by jobs/s). ``url``: a redis-server of the caller's, flushed before each drain."""
    for concurrency in concurrencies:
        for pinned in (False, True):
            done = sorted((drain(url, n, concurrency, pinned) for _ in range(runs)), key=lambda row: row["jobs_per_s"])
            yield {"label": f"-c {concurrency}" + (" pinned (CPU 1)" if pinned else " unpinned"),
                   "concurrency": concurrency, "pinned": pinned, **done[len(done) // 2]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=20000, help="jobs per drain (default 20,000)")
    p.add_argument("--c", type=int, action="append", help="a concurrency (repeatable; default 2, 10, 25)")
    p.add_argument("--runs", type=int, default=1, help="drains per row, the median kept")
    args = p.parse_args()
    print(machine())
    print(f"N = {args.n:,} NoopIncr jobs per drain; one runcogworker; median of {args.runs}")
    print(f"{'row':<22} {'jobs/s':>8} {'CPU µs/job':>11} {'vol. cs/job':>12} {'invol. cs/job':>14} "
          f"{'migrations/job':>15} {'futex/job':>10} {'kernel %':>9}")
    server = RedisServer(Path(os.environ.get("TMPDIR", "/tmp")) / f"cogworker-wakeups-{os.getpid()}").start()
    try:
        for row in rows(server.url, args.n, args.c or (2, 10, 25), args.runs):
            print(f"{row['label']:<22} {row['jobs_per_s']:>8,.0f} {row['cpu_us']:>11.0f} {row['voluntary']:>12.2f} "
                  f"{row['involuntary']:>14.2f} {row['migrations']:>15.2f} {row['futex']:>10.2f} "
                  f"{row['sys_share'] * 100:>8.0f}%", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
