"""Where one worker process's time goes per job, cogworker against Sidekiq, on a private redis-server.

For each system row (cogworker ``runcogworker -c C``; Sidekiq ``-c C`` fair, i.e. without redis-rb
4.8's deprecation warnings, and the variants that show what each setting is worth): N ``NoopIncr``
jobs (one INCR each) pushed in bulk, then one worker drains them. From the first job done to the
last it reads, per job:

* jobs/s (wall time: noisy on a shared machine) and the worker's CPU (user, sys: /proc/<pid>/stat);
* wake-ups: voluntary and involuntary context switches over its threads (/proc/<pid>/task/*/status)
  and, with ``perf``, futex calls (a thread waiting for, or waking, another: the GIL, Ruby's GVL,
  a queue) and CPU migrations;
* Redis: commands by name (INFO commandstats, Lua's included), round trips (read events) and
  Redis's CPU, less the bench's own polling.

Then, with ``--clock``: where cogworker's Python work goes, by stage (fetch, decode, ledger,
middleware chain, the job, ack/settle, stats, logging...), timed in thread CPU by bench/stage_clock.py
(``--clock``; ``--stages``: a py-spy profile, attributed by bench/stages.py, less exact).
With ``--instructions``: instructions per job of each worker, counted by ``valgrind
--tool=callgrind`` (load-independent, unlike the wall and CPU times): two drains of different N
under valgrind, the difference divided by the difference of N, so start-up and exit cancel out.

    bench/.venv/bin/python bench/profile_stages.py                   # N = 20,000, the table
    bench/.venv/bin/python bench/profile_stages.py --runs 3 --stages # median of 3, and the stages
    bench/.venv/bin/python bench/profile_stages.py --only cogworker,sidekiq --instructions

Runs in the bench venv (bench/run.py makes it; py-spy and hiredis are there). Prints Markdown tables,
and writes the figures as JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT)]

import harness  # noqa: E402 - after the path above
import redis  # noqa: E402
import stages  # noqa: E402
from systems import _sidekiq_payload  # noqa: E402

COUNTER = "bench:done"
PERF_EVENTS = ("cpu-migrations", "syscalls:sys_enter_futex")
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class Row:
    """One way of running a worker: its argv and environment, and how its jobs are pushed."""

    key: str
    label: str
    kind: str  # "cogworker" or "sidekiq"
    concurrency: int = 10
    env: dict[str, str] = field(default_factory=dict)

    def argv(self) -> list[str]:
        if self.kind == "cogworker":
            return [sys.executable, str(BENCH / "manage.py"), "runcogworker", "-c", str(self.concurrency),
                    "-q", "default"]
        return ["sidekiq", "-r", str(BENCH / "sidekiq" / "bench_jobs.rb"), "-c", str(self.concurrency),
                "-q", "default"]


ROWS = {
    "cogworker": Row("cogworker", "cogworker reliable -c 10 (hiredis)", "cogworker"),
    # (By default a lone worker bound by its GIL keeps its threads on one CPU: engine/process/confine.py.)
    "cogworker-free": Row("cogworker-free", "cogworker reliable -c 10, left free (CPU_AFFINITY none)", "cogworker",
                          env={"BENCH_CPU_AFFINITY": "none"}),
    "sidekiq": Row("sidekiq", "Sidekiq -c 10, fair (no warnings, hiredis)", "sidekiq"),
    "sidekiq-ruby-driver": Row("sidekiq-ruby-driver", "Sidekiq -c 10, no warnings, pure-Ruby driver", "sidekiq",
                               env={"BENCH_SIDEKIQ_HIREDIS": "0"}),
    "sidekiq-stock": Row("sidekiq-stock", "Sidekiq -c 10 as make bench ran it before (warnings, pure-Ruby driver)",
                         "sidekiq", env={"BENCH_SIDEKIQ_WARNINGS": "1", "BENCH_SIDEKIQ_HIREDIS": "0"}),
    "sidekiq-yjit": Row("sidekiq-yjit", "Sidekiq -c 10, fair, with YJIT (RUBYOPT=--yjit)", "sidekiq",
                        env={"RUBYOPT": "--yjit"}),
}


def worker_env(url: str, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COGWORKER_", "DJANGO_SETTINGS", "BENCH_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(BENCH), str(ROOT)]), COGWORKER_REDIS_URL=url, BENCH_REDIS_URL=url,
               REDIS_URL=url, DJANGO_SETTINGS_MODULE="benchproject.settings", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def push(row: Row, r: redis.Redis, url: str, n: int) -> None:
    """N NoopIncr jobs, in bulk (1,000 per call), before the worker starts, as bench/systems.py does."""
    if row.kind == "sidekiq":
        for start in range(0, n, 1000):
            now = time.time()
            pipe = r.pipeline(transaction=False)
            pipe.sadd("queues", "default")
            pipe.lpush("queue:default", *(_sidekiq_payload("NoopIncr", now) for _ in range(min(1000, n - start))))
            pipe.execute()
        return
    res = subprocess.run([sys.executable, "-c", (
        "import django, time; django.setup()\n"
        "from benchproject.jobs import NoopIncr\n"
        f"n = {n}\n"
        "for start in range(0, n, 1000):\n"
        "    NoopIncr.perform_bulk([(time.time(),)] * min(1000, n - start))\n")],
        env=worker_env(url, {}), cwd=BENCH, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(res.stderr)


def proc_snapshot(pid: int) -> dict[str, float]:
    """CPU (user, sys) and context switches (voluntary, involuntary) of ``pid`` over its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    out = {"user": int(fields[11]) / CLK_TCK, "sys": int(fields[12]) / CLK_TCK, "vol": 0.0, "invol": 0.0,
           "cpu": harness.tree_cpu([pid])}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    out["vol"] += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    out["invol"] += int(line.split()[1])
        except FileNotFoundError:
            continue
    return out


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 40) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def wait_count(r: redis.Redis, target: int, proc: subprocess.Popen, timeout: float, interval: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        v = int(r.get(COUNTER) or 0)
        if v >= target:
            return v
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited with the counter at {v} of {target}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"counter at {v} of {target} after {timeout:.0f}s")
        time.sleep(interval)


def drain(row: Row, server: harness.RedisServer, n: int, logdir: Path, wrap: list[str] | None = None) -> dict[str, Any]:
    """One drain of ``n`` jobs by ``row``'s worker (under ``wrap``, a profiler, if given): the figures per job."""
    r = server.client()
    r.flushall()
    push(row, r, server.url, n)
    r.config_resetstat()
    log = open(logdir / f"{row.key}.log", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([*(wrap or []), *row.argv()], env=worker_env(server.url, row.env), cwd=BENCH,
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    try:
        wait_count(r, 1, proc, 120, 0.002)
        pid = proc.pid if not wrap else _child(proc.pid)
        perf = None
        if shutil.which("perf") and not wrap:
            perf = subprocess.Popen(["perf", "stat", "-x,", "-e", ",".join(PERF_EVENTS), "-p", str(pid)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        p0 = proc_snapshot(pid)
        a = harness.snap(r)
        gets = 0
        c0 = int(r.get(COUNTER) or 0)
        t0 = time.monotonic()
        while int(r.get(COUNTER) or 0) < n:
            gets += 1
            if proc.poll() is not None or time.monotonic() - t0 > 600:
                raise RuntimeError("the worker exited or stalled")
            time.sleep(0.01)
        gets += 2
        b = harness.snap(r)
        p1 = proc_snapshot(pid)
        elapsed = time.monotonic() - t0
        counts = dict.fromkeys(PERF_EVENTS, float("nan"))
        if perf is not None:
            perf.send_signal(signal.SIGINT)
            _, err = perf.communicate(timeout=10)
            for line in err.splitlines():
                parts = line.split(",")
                if len(parts) > 2 and parts[2] in counts and parts[0].strip().isdigit():
                    counts[parts[2]] = int(parts[0])
        jobs = n - c0
        d = harness.delta(a, b, own_gets=gets)
        return {"jobs": jobs, "jobs_per_s": jobs / elapsed,
                "cpu_us": (p1["cpu"] - p0["cpu"]) / jobs * 1e6,
                "user_us": (p1["user"] - p0["user"]) / jobs * 1e6, "sys_us": (p1["sys"] - p0["sys"]) / jobs * 1e6,
                "vol_cs": (p1["vol"] - p0["vol"]) / jobs, "invol_cs": (p1["invol"] - p0["invol"]) / jobs,
                "futex": counts["syscalls:sys_enter_futex"] / jobs, "migrations": counts["cpu-migrations"] / jobs,
                "redis_commands": d.commands / jobs, "round_trips": d.round_trips / jobs,
                "redis_cpu_us": d.cpu / jobs * 1e6,
                "by_command": {k: round(v / jobs, 3) for k, v in sorted(d.by_command.items(), key=lambda kv: -kv[1])
                               if v / jobs >= 0.001}}
    finally:
        stop(proc, signal.SIGINT if wrap else signal.SIGTERM, timeout=90)
        r.close()


def _child(pid: int) -> int:
    """The worker under a profiler that started it: the profiler's one child."""
    for _ in range(100):
        kids = harness._children_proc(pid)
        if kids:
            return kids[0]
        time.sleep(0.05)
    return pid


# -- py-spy stages of cogworker ------------------------------------------------------------------

def pyspy_stages(server: harness.RedisServer, n: int, logdir: Path, rate: int = 500,
                 gil: bool = False) -> dict[str, Any]:
    """A ``py-spy record`` of a cogworker -c 10 drain of ``n`` jobs: µs per job by stage.

    Without ``gil``, every thread on a CPU at each sample is counted (py-spy leaves out those blocked
    in a system call: waiting for the GIL, a queue or a socket), so the total is the Python process's
    on-CPU time, the kernel's side of its system calls included, and compares with its CPU per job.
    With ``gil``, only the thread holding the GIL (py-spy's detection of it misses samples on 3.11:
    the shares hold, the total reads low)."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if not spy:
        return {"skipped": "py-spy not installed (the bench venv has it)"}
    raw = logdir / ("profile-gil.txt" if gil else "profile-cpu.txt")
    row = ROWS["cogworker"]
    r = server.client()
    r.flushall()
    push(row, r, server.url, n)
    proc = subprocess.Popen([spy, "record", *(["--gil"] if gil else []), "--function", "--rate", str(rate),
                             "--format", "raw", "-o", str(raw), "--", *row.argv()],
                            env=worker_env(server.url, {}), cwd=BENCH,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_count(r, n, proc, 600, 0.05)
    finally:
        stop(proc, signal.SIGINT, timeout=90)
    return stages.per_job(raw.read_text(), n, rate) if raw.exists() else {"skipped": "py-spy wrote nothing"}


# -- thread-CPU clock of each stage of cogworker (bench/stage_clock.py) -----------------------------

def clock_stages(server: harness.RedisServer, n: int, logdir: Path) -> dict[str, Any]:
    """A cogworker -c 10 drain of ``n`` jobs under bench/stage_clock.py: thread CPU µs per job by stage
    (less the wrappers' own cost), beside the process's CPU per job in the same drain."""
    out_file = logdir / "stage-clock.json"
    row = Row("cogworker-clock", "cogworker -c 10 under stage_clock", "cogworker",
              env={"BENCH_STAGE_CLOCK_OUT": str(out_file)})
    argv = row.argv
    row.argv = lambda: [sys.executable, str(BENCH / "stage_clock.py"), *argv()[2:]]  # type: ignore[method-assign]
    res = drain(row, server, n, logdir)
    time.sleep(0.5)
    data = json.loads(out_file.read_text())
    cost = data["wrapper_ns"]
    rows = []
    for stage, v in data["stages"].items():
        if v["calls"]:
            rows.append({"stage": stage, "calls_per_job": v["calls"] / n,
                         "us_per_job": max(0.0, v["ns"] - v["calls"] * cost) / n / 1000})
    rows.sort(key=lambda x: x["stage"])
    wrapped = sum(x["us_per_job"] for x in rows)
    wrappers = sum(v["calls"] for v in data["stages"].values()) * cost / n / 1000
    rows.append({"stage": "other threads (heartbeat, poller, ticker, main), GC, unwrapped code",
                 "calls_per_job": 0.0, "us_per_job": max(0.0, res["cpu_us"] - wrapped - wrappers)})
    rows.append({"stage": "(the wrappers' own cost, measured and taken out above)", "calls_per_job": 0.0,
                 "us_per_job": wrappers})
    return {"cpu_us_per_job": res["cpu_us"], "jobs_per_s": res["jobs_per_s"], "wrapper_ns": cost, "stages": rows}


# -- instructions per job (valgrind) ---------------------------------------------------------------

def instructions(row: Row, server: harness.RedisServer, logdir: Path, small: int, large: int) -> dict[str, Any]:
    """Instructions per job of ``row``'s worker: (Ir of a drain of ``large`` − Ir of ``small``) / (large − small),
    each a whole run under callgrind (start-up and exit cancel out)."""
    if not shutil.which("valgrind"):
        return {"skipped": "valgrind not installed"}
    irs = {}
    for n in (small, large):
        out = logdir / f"callgrind-{row.key}-{n}.out"
        wrap = ["valgrind", "--tool=callgrind", "--trace-children=no", f"--callgrind-out-file={out}"]
        r = server.client()
        r.flushall()
        push(row, r, server.url, n)
        proc = subprocess.Popen([*wrap, *row.argv()], env=worker_env(server.url, row.env), cwd=BENCH,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_count(r, n, proc, 1800, 0.2)
            time.sleep(1)
        finally:
            stop(proc, signal.SIGTERM, timeout=300)
        text = out.read_text(errors="replace") if out.exists() else ""
        m = re.search(r"^(?:summary|totals):\s*(\d+)", text, re.M)
        if not m:
            return {"skipped": f"callgrind wrote no total for N={n}"}
        irs[n] = int(m.group(1))
    return {"small": small, "large": large, "ir_small": irs[small], "ir_large": irs[large],
            "instructions_per_job": (irs[large] - irs[small]) / (large - small)}


# -- the report ------------------------------------------------------------------------------------

def median_row(results: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(results, key=lambda x: x["jobs_per_s"])
    out = dict(ordered[len(ordered) // 2])
    for k in ("cpu_us", "user_us", "sys_us", "vol_cs", "invol_cs", "futex", "migrations", "redis_commands",
              "round_trips", "redis_cpu_us"):
        vals = sorted(x[k] for x in results)
        out[k] = vals[len(vals) // 2]
    out["runs"] = len(results)
    out["jobs_per_s_range"] = [ordered[0]["jobs_per_s"], ordered[-1]["jobs_per_s"]]
    return out


def print_table(table: dict[str, dict[str, Any]]) -> None:
    print("| worker | jobs/s | CPU µs/job (user + sys) | vol. cs/job | invol. cs/job | futex/job | migrations/job "
          "| Redis cmds/job | round trips/job | Redis CPU µs/job |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key, x in table.items():
        print(f"| {ROWS[key].label} | {x['jobs_per_s']:,.0f} | {x['cpu_us']:.0f} ({x['user_us']:.0f} + "
              f"{x['sys_us']:.0f}) | {x['vol_cs']:.2f} | {x['invol_cs']:.2f} | {x['futex']:.2f} | "
              f"{x['migrations']:.2f} | {x['redis_commands']:.2f} | {x['round_trips']:.2f} | {x['redis_cpu_us']:.1f} |")
    print()
    for key, x in table.items():
        print(f"- {key}: " + ", ".join(f"{k} {v}" for k, v in x["by_command"].items()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=20000, help="jobs per drain (default 20,000)")
    p.add_argument("--runs", type=int, default=2, help="drains per row, in turn; the median kept (default 2)")
    p.add_argument("--only", default="cogworker,cogworker-free,sidekiq,sidekiq-ruby-driver,sidekiq-stock,sidekiq-yjit",
                   help=f"comma-separated rows, of {', '.join(ROWS)}")
    p.add_argument("--stages", action="store_true", help="also py-spy stages of a cogworker drain (on-CPU threads)")
    p.add_argument("--clock", action="store_true", help="also thread-CPU per stage of cogworker (stage_clock.py)")
    p.add_argument("--gil", action="store_true", help="the stages of the thread holding the GIL only (py-spy --gil)")
    p.add_argument("--instructions", action="store_true", help="also instructions per job under callgrind")
    p.add_argument("--instr-n", default="500,2500", help="the two N of the callgrind drains (default 500,2500)")
    p.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = p.parse_args()
    keys = args.only.split(",")
    unknown = set(keys) - set(ROWS)
    if unknown:
        p.error(f"unknown row(s) {', '.join(sorted(unknown))}")
    if any(ROWS[k].kind == "sidekiq" for k in keys) and not shutil.which("sidekiq"):
        p.error("sidekiq is not installed (apt-get install ruby-sidekiq ruby-hiredis)")
    work = Path(tempfile.mkdtemp(prefix="cogworker-stages-"))
    machine = (f"{os.cpu_count()} CPUs, "
               + next((ln.split(':', 1)[1].strip() for ln in Path('/proc/cpuinfo').read_text().splitlines()
                       if ln.startswith('model name')), '?')
               + f", cpuidle driver {harness.cpuidle_driver() or '(none)'}")
    print(f"{machine}; N = {args.n:,} NoopIncr jobs per drain, median of {args.runs}; logs in {work}", flush=True)
    server = harness.RedisServer(work / "redis").start()
    results: dict[str, Any] = {"machine": machine, "n": args.n, "runs": args.runs,
                               "loadavg_start": os.getloadavg()[0], "drain": {}}
    try:
        per: dict[str, list[dict[str, Any]]] = {k: [] for k in keys}
        for _ in range(args.runs):  # (in turn: a drift in the machine's load falls on every row)
            for key in keys:
                res = drain(ROWS[key], server, args.n, work)
                per[key].append(res)
                print(f"  {key}: {res['jobs_per_s']:,.0f} jobs/s, {res['cpu_us']:.0f} µs CPU/job", flush=True)
        results["drain"] = {k: median_row(v) for k, v in per.items()}
        results["loadavg_end"] = os.getloadavg()[0]
        print()
        print_table(results["drain"])
        if args.stages:
            res = pyspy_stages(server, args.n, work, gil=args.gil)
            results["stages"] = res
            what = "GIL-held" if args.gil else "on-CPU"
            print(f"\n| stage (cogworker -c 10, py-spy{' --gil' if args.gil else ''}) | {what} µs/job | % |"
                  "\n|---|---:|---:|")
            for s in res.get("stages", []):
                print(f"| {s['stage']} | {s['us_per_job']} | {s['pct']} |")
            if "gil_us_per_job" in res:
                print(f"| **total** | {res['gil_us_per_job']} | 100 |")
        if args.clock:
            res = clock_stages(server, args.n, work)
            results["clock"] = res
            cpu = res["cpu_us_per_job"]
            print("\n| stage (cogworker -c 10, thread CPU, stage_clock.py) | calls/job | µs/job | % of CPU |"
                  "\n|---|---:|---:|---:|")
            for s in res["stages"]:
                print(f"| {s['stage']} | {s['calls_per_job']:.2f} | {s['us_per_job']:.1f} | "
                      f"{100 * s['us_per_job'] / cpu:.0f}% |")
            print(f"| **the worker's CPU per job in this drain** | | {cpu:.1f} | 100% |")
        if args.instructions:
            small, large = (int(x) for x in args.instr_n.split(","))
            results["instructions"] = {}
            for key in keys:
                res = instructions(ROWS[key], server, work, small, large)
                results["instructions"][key] = res
                print(f"instructions per job, {key}: {res.get('instructions_per_job', res.get('skipped'))}",
                      flush=True)
    finally:
        server.stop()
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
