"""Where a thread's time goes in the real-jobs section's "1 ms blocking I/O, -c 10" drain (issue 47,
point 4): ten processor threads whose job sleeps 1 ms could run 10,000 jobs a second; this says what
each thread does with the rest of its time, in wall time, per job.

    bench/.venv/bin/python bench/tools/io_gap.py                  # N = 5,000 IoWait jobs, -c 10
    bench/.venv/bin/python bench/tools/io_gap.py --n 20000 --runs 3 -- --prefetch 0   (args after --: runcogworker's)

A private redis-server; N ``IoWait`` jobs (GET, ``time.sleep(0.001)``, INCR: bench/benchproject/jobs.py)
pushed in bulk, then drained by ``runcogworker -c 10`` run under this file (``--worker``), which
wraps, from outside, on every processor thread, with two clocks (``perf_counter_ns``: wall;
``thread_time_ns``: this thread's CPU):

* ``Processor.process`` (one job's whole handling, settlement held for the next fetch included),
  ``call_perform`` (the job), the job's ``time.sleep``, and ``Fetcher.next_unit`` (a processor
  waiting for its next job: the fetch wait);
* the time between one ``process`` ending and the next beginning on the same thread (the loop's
  ``processor_idle``, ``next_unit``).

A stage's wall minus its thread CPU is time the thread was not running: blocked in a system call
(the sleep, a Redis round trip, a queue) or runnable but waiting for the GIL or a CPU. Stages that
make no blocking call (decode, hooks, settle's put) have only the GIL and the CPU to wait for.

Also measured, outside the worker: ``time.sleep(0.001)``'s real length here (one thread; and ten
threads sleeping at once, with and without a thread spinning in Python holding the GIL), the timer
slack, and the cpuidle driver. Prints Markdown tables; ``--out`` writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent.parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT)]

# -- inside the worker ------------------------------------------------------------------------

_records: dict[str, list[tuple[int, int, int]]] = {}  # stage -> [(start, wall ns, thread CPU ns)], one per call
_last_end = threading.local()


def _record(stage: str, wall: int, cpu: int, start: int) -> None:
    _records.setdefault(stage, []).append((start, wall, cpu))  # (list.append: atomic under the GIL)


def _timed(stage: str, fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        w, c = time.perf_counter_ns(), time.thread_time_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            _record(stage, time.perf_counter_ns() - w, time.thread_time_ns() - c, w)
    return wrapper


def _install() -> None:
    from benchproject import jobs

    from django_cogworker.engine.fetch import fetcher
    from django_cogworker.engine.process import launcher
    from django_cogworker.engine.run import processor

    real_process = processor.Processor.process

    def process(self: Any, unit: Any) -> Any:
        w, c = time.perf_counter_ns(), time.thread_time_ns()
        last = getattr(_last_end, "at", None)
        if last is not None:
            _record("between: end of one process to the start of the next", w - last[0], c - last[1], last[0])
        try:
            return real_process(self, unit)
        finally:
            we, ce = time.perf_counter_ns(), time.thread_time_ns()
            _record("process: one job's whole handling", we - w, ce - c, w)
            _last_end.at = (we, ce)

    processor.Processor.process = process
    launcher.call_perform = _timed("perform: the job (GET, sleep, INCR)", launcher.call_perform)
    fetcher.Fetcher.next_unit = _timed("next_unit: waiting for the next job (fetch wait)", fetcher.Fetcher.next_unit)

    class _Time:
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        sleep = staticmethod(_timed("sleep: time.sleep(0.001) in the job", time.sleep))

    jobs.time = _Time()

    def dump() -> None:
        out = os.environ["BENCH_IO_GAP_OUT"]
        Path(out).write_text(json.dumps(_records))

    atexit.register(dump)


def worker_main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchproject.settings")
    import django

    django.setup()
    _install()
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", *argv])


# -- outside: sleep's length --------------------------------------------------------------------

def sleep_lengths(n: int = 2000, threads: int = 1, spinner: bool = False) -> list[float]:
    """µs that ``time.sleep(0.001)`` took, on ``threads`` threads at once (and a thread spinning in
    Python beside them, holding the GIL but for the switch interval's hand-overs)."""
    out: list[float] = []
    stop = threading.Event()

    def sleeper() -> None:
        mine = []
        for _ in range(n // threads):
            t = time.perf_counter_ns()
            time.sleep(0.001)
            mine.append((time.perf_counter_ns() - t) / 1000)
        out.extend(mine)

    def spin() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    extra = [threading.Thread(target=spin)] if spinner else []
    for t in extra:
        t.start()
    ts = [threading.Thread(target=sleeper) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    stop.set()
    for t in extra:
        t.join()
    return out


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def timer_slack_ns() -> int | None:
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        return int(libc.prctl(30, 0, 0, 0, 0))  # PR_GET_TIMERSLACK
    except (OSError, AttributeError):
        return None


# -- the drain ----------------------------------------------------------------------------------

def drain(n: int, concurrency: int, extra: list[str], workdir: Path) -> dict[str, Any]:
    import harness

    server = harness.RedisServer(workdir / "redis").start()
    try:
        os.environ.update(COGWORKER_REDIS_URL=server.url, BENCH_REDIS_URL=server.url, BENCH_STATE_DIR=str(workdir),
                          DJANGO_SETTINGS_MODULE="benchproject.settings")
        import django

        django.setup()
        from benchproject.jobs import IoWait

        from django_cogworker.push import runtime

        runtime.reset()
        for start in range(0, n, 1000):
            IoWait.perform_bulk([(time.time(),)] * min(1000, n - start))
        out_file = workdir / "io-gap.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith("COGWORKER_")}
        env.update(PYTHONPATH=os.pathsep.join([str(BENCH), str(ROOT)]), COGWORKER_REDIS_URL=server.url,
                   BENCH_IO_GAP_OUT=str(out_file), PYTHONUNBUFFERED="1")
        worker = harness.spawn("io-gap", [sys.executable, __file__, "--worker", "runcogworker", "-c", str(concurrency),
                                          "--fetch", "reliable", "-q", "default", *extra],
                               env=env, cwd=BENCH, logdir=workdir)
        r = server.client()
        counter = harness.Counter(r)
        counter.wait_for(1, timeout=60, alive=worker.alive, interval=0.002)
        t0, c0 = time.perf_counter(), counter.value()
        cpu0 = harness.tree_cpu_all_threads([worker.pid])
        switches0 = _switches(worker.pid)
        counter.wait_for(n, timeout=120 + n / 50, alive=worker.alive)
        seconds = time.perf_counter() - t0
        cpu = harness.tree_cpu_all_threads([worker.pid]) - cpu0
        switches = {k: v - switches0.get(k, 0) for k, v in _switches(worker.pid).items()}
        worker.stop()
        records = json.loads(out_file.read_text())
        # Only calls that ended while jobs ran: each thread's first wait (for the first fetch) and last
        # (for jobs that never came, until the stop) are not the drain's.
        done = records["process: one job's whole handling"]
        first, last = min(s + w for s, w, _ in done), max(s + w for s, w, _ in done)
        records = {k: [(w, c) for s, w, c in rs if s >= first and s + w <= last] for k, rs in records.items()}
        jobs = n - c0
        return {"n": n, "concurrency": concurrency, "jobs_per_s": jobs / seconds,
                "worker_cpu_us_per_job": cpu / jobs * 1e6,
                "switches_per_job": {k: v / jobs for k, v in switches.items()},
                "stages": {stage: {"calls": len(rs), "wall_us": statistics.fmean(w for w, _ in rs) / 1000,
                                   "wall_p50_us": pct([w / 1000 for w, _ in rs], 50),
                                   "wall_p99_us": pct([w / 1000 for w, _ in rs], 99),
                                   "cpu_us": statistics.fmean(c for _, c in rs) / 1000}
                           for stage, rs in records.items()}}
    finally:
        server.stop()


def _switches(pid: int) -> dict[str, int]:
    """Voluntary and involuntary context switches over the process's live threads."""
    out = {"voluntary": 0, "involuntary": 0}
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        out["voluntary"] += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        out["involuntary"] += int(line.split()[1])
    except OSError:
        pass
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["--worker"]:
        worker_main(argv[1:])
        return 0
    extra: list[str] = []
    if "--" in argv:
        extra, argv = argv[argv.index("--") + 1:], argv[:argv.index("--")]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=5000)
    p.add_argument("-c", "--concurrency", type=int, default=10)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    import tempfile

    import harness

    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "")
    machine = {"cpu_model": model,
               "cpuidle_driver": harness.cpuidle_driver(), "loadavg": os.getloadavg(),
               "timer_slack_ns": timer_slack_ns(), "switch_interval_s": sys.getswitchinterval()}
    sleeps = {}
    for name, kw in (("1 thread", {}), ("10 threads at once", {"threads": 10}),
                     ("10 threads, one more spinning in Python", {"threads": 10, "spinner": True})):
        us = sleep_lengths(**kw)
        sleeps[name] = {"p50_us": pct(us, 50), "mean_us": statistics.fmean(us), "p99_us": pct(us, 99)}
    runs = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="io-gap-") as work:
            runs.append(drain(args.n, args.concurrency, extra, Path(work)))
    runs.sort(key=lambda r: r["jobs_per_s"])
    res = {"machine": machine, "sleep": sleeps, "drain": runs[len(runs) // 2],
           "jobs_per_s_all": [r["jobs_per_s"] for r in runs], "worker_args": extra}
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    d = res["drain"]
    print(f"{machine['cpu_model']}, cpuidle {machine['cpuidle_driver']}, load {machine['loadavg']}, timer slack "
          f"{machine['timer_slack_ns']} ns")
    print("\n| time.sleep(0.001) | p50 µs | mean µs | p99 µs |\n|---|---:|---:|---:|")
    for name, s in sleeps.items():
        print(f"| {name} | {s['p50_us']:.0f} | {s['mean_us']:.0f} | {s['p99_us']:.0f} |")
    print(f"\nDrain: {d['n']:,} IoWait, -c {d['concurrency']} {' '.join(extra)}: {d['jobs_per_s']:,.0f} jobs/s "
          f"(runs: {', '.join(f'{x:,.0f}' for x in res['jobs_per_s_all'])}), "
          f"worker CPU {d['worker_cpu_us_per_job']:.0f} µs/job, context switches/job {d['switches_per_job']}; "
          "a thread's budget per job: "
          f"{d['concurrency'] / d['jobs_per_s'] * 1e6:,.0f} µs")
    print("\n| stage (per processor thread) | calls/job | wall µs (mean) | p50 | p99 | thread CPU µs "
          "| not running µs |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    jobs = d["stages"]["process: one job's whole handling"]["calls"]
    for stage, s in d["stages"].items():
        print(f"| {stage} | {s['calls'] / jobs:.2f} | {s['wall_us']:.0f} | {s['wall_p50_us']:.0f} | "
              f"{s['wall_p99_us']:.0f} | {s['cpu_us']:.0f} | {s['wall_us'] - s['cpu_us']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
