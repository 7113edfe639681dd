#!/usr/bin/env python3
"""Benchmark django-cogworker against its peers, side by side, in one run on one machine.

    make bench                          # = python3 bench/run.py: the default run (N = 100,000)
    python3 bench/run.py --full         # adds the 1,000,000-job memory run
    python3 bench/run.py --n 20000      # a smaller N
    python3 bench/run.py --quick --out /tmp/b.json   # tiny, cogworker + floor only (the test-suite)
    python3 bench/run.py --sections batches          # some sections only (see --help)

The default and full modes create bench/.venv (the peers: rq, dramatiq, huey, celery; psutil,
matplotlib, py-spy), re-run themselves in it, try `apt-get install ruby-sidekiq` for Sidekiq, and
write bench/results/<timestamp>.json, bench/results/latest.json, docs/benchmarks.md and
docs/benchmarks.png. --quick runs with the interpreter it is given, measures cogworker and the bare
loop only, writes only --out, and takes well under a minute.

Every run starts its own redis-server on a free port (no persistence). Sections: drain (with worker
CPU, Redis commands, round trips and CPU per job), latency, enqueue, scheduled, idle, memory, scale,
profile (py-spy, when installed), batches (bench/batches.py: plain, batch and chord drains, the
callback's delay), limits (bench/limits.py: plain drains against a bucket and a concurrency limit
that never refuse: what a take and a release cost per job), outbox (bench/outbox.py: a push inside a
PostgreSQL transaction with OUTBOX off and on, and a relay's jobs/s); and outside --quick, real jobs (1 ms of
I/O, 200 µs of CPU: cogworker against Sidekiq) and wake-ups per job (bench/wakeups.py). Method and
caveats: docs/benchmarks.md.

A run limited by --sections writes bench/results/<timestamp>.json (and --out) but neither latest.json
nor the page: `python bench/report.py bench/results/latest.json bench/results/<timestamp>.json` puts
its sections into the page, beside those of the last full run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter as Tally
from pathlib import Path
from typing import Any

import stages  # (bench/, beside this script)

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
VENV = BENCH / ".venv"
RESULTS = BENCH / "results"

# Slow peers drain fewer jobs, so the run stays within its time; the N used is in the results.
N_CAPS = {"rq-fork": 2_000, "rq-simple": 20_000}
# Jobs per drain of the real-jobs and wake-ups sections at the default N (100,000), scaled with --n:
# a real-jobs drain lasts seconds, the section one to two minutes on a 2-CPU VM.
REAL_JOBS_N = {"IoWait": 5_000, "CpuBurn": 20_000}
WAKEUPS_N = 20_000
# In the order they run; --sections picks some (meta, machine and versions are always there).
SECTIONS = ("enqueue", "drain", "real_jobs", "wakeups", "batches", "limits", "outbox", "idle", "scheduled", "scale",
            "memory", "profile")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="tiny run, cogworker + bare loop only, no peer venv")
    mode.add_argument("--full", action="store_true", help="also the 1,000,000-job memory run")
    p.add_argument("--n", type=int, help="jobs per drain (default 100,000; quick: 300)")
    p.add_argument("--out", type=Path, help="write the JSON here (quick mode: only here)")
    p.add_argument("--only", help="comma-separated system keys to drain (e.g. cogworker-reliable-c10,floor); the "
                                  "real-jobs section keeps the listed ones of its systems, wake-ups run anyway")
    p.add_argument("--sections", help=f"comma-separated sections to run, of: {', '.join(SECTIONS)} (default: all; "
                                      "then neither latest.json nor the page is written)")
    p.add_argument("--batches-n", type=int, help="jobs per drain of the batches section (default 10,000; quick: 300)")
    p.add_argument("--batches-reps", type=int, help="drains of each way in the batches section (default 3; quick: 1)")
    p.add_argument("--limits-n", type=int, help="jobs per drain of the limits section (default 10,000; quick: 300)")
    p.add_argument("--limits-reps", type=int, help="drains of each way in the limits section (default 3; quick: 1)")
    p.add_argument("--reps", type=int, default=1,
                   help="drains of each system in the drain and real-jobs sections, in turn (all systems, then "
                        "all again): the median by jobs/s is kept, with the range (default 1)")
    p.add_argument("--no-venv", action="store_true", help="run with this interpreter, not bench/.venv")
    p.add_argument("--no-sidekiq", action="store_true", help="don't try to install or run Sidekiq")
    p.add_argument("--no-profile", action="store_true", help="skip the py-spy profile of a cogworker drain")
    p.add_argument("--baseline", metavar="REV",
                   help="also profile the worker of git revision REV (same job, same run): per-stage costs "
                        "before and after")
    p.add_argument("--no-docs", action="store_true", help="don't write docs/benchmarks.md and .png")
    args = p.parse_args(argv)
    unknown = set(args.sections.split(",")) - set(SECTIONS) if args.sections else set()
    if unknown:
        p.error(f"unknown section(s) {', '.join(sorted(unknown))}: of {', '.join(SECTIONS)}")
    return args


# -- the bench venv ----------------------------------------------------------------------------

def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def ensure_venv() -> Path:
    """Create bench/.venv and install the peers and the work tree into it, when out of date."""
    python = VENV / "bin" / "python"
    stamp = VENV / ".installed"
    sources = [BENCH / "requirements.txt", ROOT / "pyproject.toml"]
    if not (python.exists() and subprocess.run([str(python), "-m", "pip", "--version"],
                                               capture_output=True).returncode == 0):
        shutil.rmtree(VENV, ignore_errors=True)
        log(f"creating {VENV}")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        stamp.unlink(missing_ok=True)
    if not stamp.exists() or any(s.stat().st_mtime > stamp.stat().st_mtime for s in sources):
        log("installing the peers and django-cogworker into bench/.venv")
        subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                        "-e", str(ROOT), "-r", str(BENCH / "requirements.txt")], check=True)
        stamp.touch()
    return python


def in_bench_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV.resolve()


def ensure_sidekiq() -> str | None:
    """Install Debian's ruby-sidekiq if missing and possible; return why not, or None."""
    if shutil.which("sidekiq"):
        _ensure_ruby_hiredis()
        return None
    if not shutil.which("apt-get"):
        return "no apt-get on this machine"
    sudo = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if sudo is None:
        return "installing ruby-sidekiq needs root"
    log("installing ruby-sidekiq with apt-get (for the Sidekiq comparison)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    res = subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", "ruby-sidekiq"], env=env, capture_output=True,
                         text=True)
    if res.returncode != 0:
        subprocess.run([*sudo, "apt-get", "update", "-qq"], env=env, capture_output=True)
        res = subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", "ruby-sidekiq"], env=env,
                             capture_output=True, text=True)
    if res.returncode != 0 or not shutil.which("sidekiq"):
        return f"apt-get install ruby-sidekiq failed: {(res.stderr or res.stdout).strip()[-300:]}"
    _ensure_ruby_hiredis()
    return None


def _ensure_ruby_hiredis() -> None:
    """Debian's ruby-hiredis: Sidekiq's C reply parser, as hiredis is redis-py's (bench_jobs.rb loads
    it when present; without it Sidekiq runs the pure-Ruby driver, and the results' versions say so)."""
    if subprocess.run(["ruby", "-e", "require 'hiredis'"], capture_output=True).returncode == 0:
        return
    sudo = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if sudo is None or not shutil.which("apt-get"):
        return
    log("installing ruby-hiredis with apt-get (Sidekiq's C reply parser)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", "ruby-hiredis"], env=env, capture_output=True)


# -- the machine and the versions --------------------------------------------------------------

def machine() -> dict[str, Any]:
    import harness

    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = int(line.split()[1]) * 1024
    except OSError:
        pass
    # (The cpuidle driver decides how deep an idle CPU sleeps, so what a wake-up costs: haltpoll, on a
    # KVM guest, polls a while before halting.)
    return {"nproc": os.cpu_count(), "cpu_model": model or platform.processor(),
            "cpuidle_driver": harness.cpuidle_driver(), "ram_gb": round(ram / 2**30, 1),
            "kernel": platform.release(), "os": _os_name()}


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return platform.platform()


def versions(redis_version: str) -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version(), "redis-server": redis_version}
    for dist in ("django-cogworker", "Django", "redis", "hiredis", "rq", "dramatiq", "huey", "celery", "kombu",
                 "psutil", "matplotlib", "py-spy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    out["git"] = _git_describe()
    for name, argv in (("sidekiq", ["sidekiq", "-V"]), ("ruby", ["ruby", "-v"])):
        if shutil.which(argv[0]):
            res = subprocess.run(argv, capture_output=True, text=True)
            text = (res.stdout or res.stderr).strip().splitlines()
            if text:
                out[name] = text[-1].split(" INFO: ")[-1]
    if shutil.which("dpkg-query") and "sidekiq" in out:
        for pkg in ("ruby-redis", "ruby-hiredis"):
            res = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", pkg], capture_output=True, text=True)
            if res.returncode == 0 and res.stdout.strip():
                out[pkg] = res.stdout.strip()
    if "sidekiq" in out:
        # What bench_jobs.rb runs with: its Redis driver, YJIT or not, the warnings silenced or not.
        res = subprocess.run(["ruby", str(BENCH / "sidekiq" / "bench_jobs.rb")], capture_output=True, text=True,
                             env={**os.environ, "BENCH_CPU_BURN_LOOPS_RUBY": "1"})
        try:
            info = json.loads(res.stdout)
            out["sidekiq-redis-driver"] = info["driver"]
            out["sidekiq-yjit"] = str(info["yjit"]).lower()
            out["sidekiq-deprecation-warnings"] = "silenced" if info["silenced"] else "on"
        except (ValueError, KeyError):
            pass
    return out


def _git_describe() -> str:
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# -- the run -----------------------------------------------------------------------------------

class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path):
        import harness

        self.args = args
        self.quick = args.quick
        self.workdir = workdir
        self.h = harness
        self.server = harness.RedisServer(workdir / "redis").start()
        self.r = self.server.client()
        from systems import Ctx

        self.ctx = Ctx(url=self.server.url, r=self.r, logdir=workdir / "logs", state_dir=workdir)
        self.n = args.n or (300 if self.quick else 100_000)
        self.only = set(args.only.split(",")) if args.only else None
        q = self.quick
        # Sizes: (quick, default)
        self.p = {
            "latency_idle_jobs": 20 if q else 200, "latency_idle_rate": 100.0 if q else 50.0,
            "latency_loaded_seconds": 1.0 if q else 5.0,
            "idle_seconds": 3.0 if q else 10.0, "idle_settle_seconds": 2.0 if q else 5.0,
            "enqueue_one_jobs": 300 if q else 10_000, "enqueue_peer_jobs": 300 if q else 5_000,
            "enqueue_bulk_jobs": 300 if q else 100_000, "enqueue_reps": 1 if q else 3,
            "scheduled_jobs": 20 if q else 200, "scheduled_spread_seconds": 2.0 if q else 20.0,
            "scheduled_lead_seconds": 1.0 if q else 2.0,
            "scheduled_poll_interval_average": 0.5 if q else None,
            "scale_total": 5_000 if q else 1_000_000, "scale_small_total": 100 if q else 1_000,
            "scale_due": 100 if q else 1_000,
            "batches_n": args.batches_n or (300 if q else 10_000), "batches_reps": args.batches_reps or (1 if q else 3),
            "limits_n": args.limits_n or (300 if q else 10_000), "limits_reps": args.limits_reps or (1 if q else 3),
            "outbox_single": 200 if q else 5_000, "outbox_bulk": 2_000 if q else 100_000,
            "outbox_backlog": 2_000 if q else 100_000, "outbox_reps": 1 if q else 3,
        }
        self.results: dict[str, Any] = {"skipped": {}, "errors": {}}
        self._setup_django()

    def _setup_django(self) -> None:
        os.environ["COGWORKER_REDIS_URL"] = self.server.url
        os.environ["BENCH_REDIS_URL"] = self.server.url
        os.environ["BENCH_STATE_DIR"] = str(self.workdir)
        os.environ["DJANGO_SETTINGS_MODULE"] = "benchproject.settings"
        for path in (str(ROOT), str(BENCH)):
            if path not in sys.path:
                sys.path.insert(0, path)
        import django

        django.setup()
        from django_cogworker.push import runtime

        runtime.reset()

    def close(self) -> None:
        self.server.stop()

    # -- helpers ---------------------------------------------------------------------------

    def reset_redis(self) -> None:
        self.r.flushall()
        self.r.config_resetstat()

    def wait_ready(self, system: Any, workers: list, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not system.ready(self.ctx):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{system.key} not ready after {timeout}s")
            for w in workers:
                if not w.alive():
                    raise RuntimeError(f"{w.name} exited at start:\n{w.tail()}")
            time.sleep(0.05)

    def _lat_stats(self, samples: list[float], pushed: int, seconds: float) -> dict[str, Any]:
        rnd = self.h.rnd
        ms = [s * 1000 for s in samples]
        return {"jobs": len(ms), "rate_per_s": rnd(pushed / seconds) if seconds else 0.0,
                "p50_ms": rnd(self.h.percentile(ms, 50)), "p99_ms": rnd(self.h.percentile(ms, 99)),
                "max_ms": rnd(max(ms))}

    def latency(self, system: Any, workers: list, rate: float, *, jobs: int | None = None,
                seconds: float | None = None) -> dict[str, Any]:
        """Push Stamp(t) jobs one at a time at ``rate``/s; return push-to-start percentiles."""
        self.r.delete("bench:lat")
        counter = self.h.Counter(self.r)
        before = counter.value()
        total = jobs if jobs is not None else max(1, int(rate * (seconds or 1)))
        start = time.perf_counter()
        pushed = 0
        while pushed < total:
            due = int((time.perf_counter() - start) * rate) + 1
            while pushed < min(due, total):
                system.push_one(self.ctx, time.time())
                pushed += 1
            if pushed < total:
                wait = start + pushed / rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
        pushing = time.perf_counter() - start
        counter.wait_for(before + pushed, timeout=60 + pushed / max(rate, 1),
                         alive=lambda: all(w.alive() for w in workers))
        samples = [float(x) for x in self.r.lrange("bench:lat", 0, -1)]
        return self._lat_stats(samples, pushed, pushing)

    def idle_rates(self, seconds: float) -> dict[str, Any]:
        a = self.h.snap(self.r)
        time.sleep(seconds)
        b = self.h.snap(self.r)
        d = self.h.delta(a, b)
        rnd = self.h.rnd
        return {"seconds": rnd(d.seconds), "commands_per_s": rnd(d.commands / d.seconds),
                "round_trips_per_s": rnd(d.round_trips / d.seconds),
                "by_command_per_s": {k: rnd(v / d.seconds) for k, v in sorted(d.by_command.items())}}

    # -- drain -----------------------------------------------------------------------------

    def drain(self, system: Any, n: int, *, kind: str | None = None, latency: bool = True,
              idle: bool = True, then: Any = None) -> dict[str, Any]:
        """Drain ``n`` jobs, no-ops or (cogworker and Sidekiq) ``kind`` (IoWait, CpuBurn).

        ``then(workers)``: called once the drain is measured, before the workers stop (the batches
        section waits there for its callback); the dict it returns joins the results."""
        h, rnd = self.h, self.h.rnd
        self.reset_redis()
        log(f"{system.label}: pushing {n:,} {kind or 'no-op'} jobs")
        t = time.perf_counter()
        system.push_bulk(self.ctx, n, **({"kind": kind} if kind else {}))
        push_s = time.perf_counter() - t
        self.r.config_resetstat()
        log(f"{system.label}: pushed in {push_s:.1f}s; starting the worker")
        workers = system.start(self.ctx)
        pids = [w.pid for w in workers]
        alive = lambda: all(w.alive() for w in workers)  # noqa: E731
        out: dict[str, Any] = {"label": system.label, "worker": system.worker_desc, "n": n,
                               "processes": len(workers)}
        try:
            counter = h.Counter(self.r)
            started = (h.tree_cpu(pids), h.machine_busy(), h.own_cpu(), h.snap(self.r), counter.gets, 0)
            counter.wait_for(1, timeout=120, alive=alive, interval=0.002)
            # (The workers' CPU and Redis's counts read before the count: every job counted after c0
            # ran after them. Read after, a worker on a loaded machine ran jobs in between: the
            # quick mode's floor measured 0 µs a job, and a batch 0.2 INCRs a job.)
            cpu_a = h.tree_cpu(pids)
            busy_a, own_a = h.machine_busy(), h.own_cpu()
            a = h.snap(self.r)
            gets0 = counter.gets  # (c0's own GET is the bench's: counted out below)
            c0 = counter.value()
            if c0 >= n:  # (all run while being read: a short drain on a loaded machine, the quick mode's)
                cpu_a, busy_a, own_a, a, gets0, c0 = started  # measured from the start, the workers' startup in it
                out["measured_from_start"] = True
            counter.wait_for(n, timeout=120 + n / 50, alive=alive, interval=0.005)
            b = h.snap(self.r)
            cpu_b = h.tree_cpu(pids)
            busy_b, own_b = h.machine_busy(), h.own_cpu()
            jobs = n - c0
            d = h.delta(a, b, own_gets=counter.gets - gets0)
            other = (busy_b - busy_a) - (cpu_b - cpu_a) - d.cpu - (own_b - own_a)
            log(f"{system.label}: machine busy {busy_b - busy_a:.2f}s = worker {cpu_b - cpu_a:.2f} + redis {d.cpu:.2f} "
                f"+ bench {own_b - own_a:.2f} + other {other:.2f} over {d.seconds:.2f}s")
            out.update({
                "jobs_measured": jobs, "seconds": rnd(d.seconds), "jobs_per_s": rnd(jobs / d.seconds),
                "worker_cpu_us_per_job": rnd((cpu_b - cpu_a) / jobs * 1e6),
                "worker_cpu_cores": rnd((cpu_b - cpu_a) / d.seconds),
                "redis_commands_per_job": rnd(d.commands / jobs),
                "redis_round_trips_per_job": rnd(d.round_trips / jobs),
                "redis_cpu_us_per_job": rnd(d.cpu / jobs * 1e6),
                "redis_cpu_cores": rnd(d.cpu / d.seconds),
                "commands_per_job": {k: rnd(v / jobs) for k, v in sorted(d.by_command.items(), key=lambda kv: -kv[1])
                                     if v / jobs >= 0.001},
                "bulk_push_jobs_per_s": rnd(n / push_s),
                # Busy CPU of everything else on the machine during the drain (not the worker, Redis or
                # the bench): within ±0.1 of 0 on a quiet machine (accounting differs a little between
                # /proc/stat and per-process times); more means the figures were disturbed.
                "other_cpu_cores": rnd(other / d.seconds) if busy_b else 0.0,
                "rss_mb_after": rnd(h.tree_rss(pids) / 2**20),
            })
            log(f"{system.label}: {out['jobs_per_s']:,} jobs/s, {out['worker_cpu_us_per_job']} µs CPU/job, "
                f"{out['redis_round_trips_per_job']} round trips/job")
            if then is not None:
                out.update(then(workers))
            if latency:
                # Idle: a tenth of the drain rate at most (idle means idle, even for a slow system).
                idle_rate = min(self.p["latency_idle_rate"], out["jobs_per_s"] / 10)
                most = self.p["latency_idle_jobs"]
                idle_jobs = max(min(20, most), min(most, int(idle_rate * 5)))
                out["latency"] = {
                    "idle": self.latency(system, workers, idle_rate, jobs=idle_jobs),
                    "loaded": self.latency(system, workers, out["jobs_per_s"] / 2,
                                           seconds=self.p["latency_loaded_seconds"]),
                }
                out["latency"]["loaded"]["target_rate_per_s"] = rnd(out["jobs_per_s"] / 2)
                log(f"{system.label}: latency idle p50 {out['latency']['idle']['p50_ms']} ms, "
                    f"loaded p99 {out['latency']['loaded']['p99_ms']} ms")
            if idle:
                time.sleep(self.p["idle_settle_seconds"])
                out["idle"] = self.idle_rates(self.p["idle_seconds"])
        finally:
            for w in workers:
                w.stop()
        return out

    def run_drains(self, systems: list) -> None:
        self.results["drain"] = drains = {}
        self.results["latency"] = lat = {}
        self.results["idle"] = idle = self.results.get("idle", {})
        ready = []
        for system in systems:
            if self.only and system.key not in self.only:
                continue
            why = system.available()
            if why:
                self.results["skipped"][system.key] = why
                log(f"skipping {system.label}: {why}")
                continue
            ready.append(system)
        runs: dict[str, list[dict[str, Any]]] = {s.key: [] for s in ready}
        # Every system once, then every system again (--reps): a drift of the machine's load falls on all.
        for rep in range(self.args.reps):
            for system in ready:
                n = min(self.n, system.n_cap) if system.n_cap else self.n
                try:
                    # (Latency and idle rates once, in the first round: they are not what --reps is for.)
                    res = self.drain(system, n, idle=not self.quick and rep == 0, latency=rep == 0)
                except Exception as exc:
                    self.results["errors"][system.key] = f"{type(exc).__name__}: {exc}"
                    log(f"{system.label} FAILED: {exc}\n{traceback.format_exc()}")
                    continue
                if "latency" in res:
                    lat[system.key] = {"label": system.label, **res.pop("latency")}
                if "idle" in res:
                    idle[system.key] = {"label": system.label, "processes": res["processes"], **res.pop("idle")}
                runs[system.key].append(res)
                drains[system.key] = median_of(runs[system.key])
                self._save_partial()

    # -- real jobs: 1 ms of I/O, 200 µs of CPU ------------------------------------------------

    def real_jobs(self) -> None:
        """Drain jobs that do some work, through cogworker reliable and Sidekiq at c10 and c25: IoWait
        (GET, sleep 1 ms, INCR), where concurrency should pay up to C × 1,000 jobs/s, and CpuBurn (about
        200 µs of interpreter CPU, then INCR), where one process's GIL (Ruby: GVL) is the limit."""
        from benchproject import jobs
        from systems import Cogworker, Sidekiq

        rnd = self.h.rnd
        # Each side in turn at each concurrency: a drift in the machine's load falls on both.
        systems = [Cogworker("reliable", 10), Sidekiq(), Cogworker("reliable", 25), Sidekiq(concurrency=25)]
        if self.args.no_sidekiq:
            systems = [s for s in systems if not isinstance(s, Sidekiq)]
        ready = []
        for system in systems:
            why = system.available()
            if why:
                self.results["skipped"][f"real-{system.key}"] = why
            elif not self.only or system.key in self.only:
                ready.append(system)
        systems = ready
        self.results["real_jobs"] = out = {
            "io_sleep_ms": jobs.IO_SLEEP_S * 1000, "cpu_burn_target_us": jobs.CPU_BURN_TARGET_US,
            "cpu_burn": {"python": {"loops": jobs.CPU_BURN_LOOPS, "us": rnd(jobs.CPU_BURN_US)}}, "drain": {}}
        # Every drain burns the loops stated here: the bench's calibration, passed to the workers
        # (each would calibrate on its own otherwise, and differ by the noise of the moment).
        burn_env = {"BENCH_CPU_BURN_LOOPS_PYTHON": str(jobs.CPU_BURN_LOOPS)}
        if any(isinstance(s, Sidekiq) for s in systems):
            try:
                ruby = json.loads(subprocess.run(["ruby", str(BENCH / "sidekiq" / "bench_jobs.rb")], check=True,
                                                 capture_output=True, text=True, timeout=60).stdout)
                out["cpu_burn"]["ruby"] = ruby
                burn_env["BENCH_CPU_BURN_LOOPS_RUBY"] = str(ruby["loops"])
            except (subprocess.SubprocessError, OSError, ValueError) as exc:
                self.results["errors"]["real-ruby-calibration"] = f"{type(exc).__name__}: {exc}"
                systems = [s for s in systems if not isinstance(s, Sidekiq)]
        log(f"real jobs: CpuBurn calibrated to {out['cpu_burn']}")
        self.ctx.env.update(burn_env)
        try:
            for kind, default_n in REAL_JOBS_N.items():
                n = max(1_000, round(default_n * self.n / 100_000))
                runs: dict[str, list[dict[str, Any]]] = {}
                for _rep in range(self.args.reps):
                    for system in systems:
                        key = f"{system.key}/{kind}"
                        try:
                            res = self.drain(system, n, kind=kind, latency=False, idle=False)
                        except Exception as exc:
                            self.results["errors"][f"real-{key}"] = f"{type(exc).__name__}: {exc}"
                            log(f"{system.label} {kind} FAILED: {exc}\n{traceback.format_exc()}")
                            continue
                        runs.setdefault(key, []).append(res)
                        res = median_of(runs[key])
                        res.update(job=kind, concurrency=system.concurrency)
                        if kind == "IoWait":
                            # Each job holds a slot for the sleep at least: C slots, C / sleep jobs/s at most.
                            res["ideal_jobs_per_s"] = system.concurrency / jobs.IO_SLEEP_S
                            res["vs_ideal"] = rnd(res["jobs_per_s"] / res["ideal_jobs_per_s"])
                        out["drain"][key] = res
                        self._save_partial()
        finally:
            for name in burn_env:
                self.ctx.env.pop(name)

    # -- wake-ups per job (bench/wakeups.py) --------------------------------------------------

    def wakeups(self) -> None:
        """bench/wakeups.py's table, against this bench's redis-server: a no-op drain's CPU, context
        switches, CPU migrations and futex calls per job, at -c 2/10/25, unpinned and pinned to one CPU."""
        missing = [tool for tool in ("perf", "taskset") if not shutil.which(tool)]
        if missing:
            self.results["skipped"]["wakeups"] = f"{' and '.join(missing)} not on PATH"
            return
        import wakeups

        rnd = self.h.rnd
        n = max(5_000, round(WAKEUPS_N * self.n / 100_000))
        out: dict[str, Any] = {"machine": wakeups.machine(), "n": n, "rows": []}
        self.results["wakeups"] = out
        try:
            for row in wakeups.rows(self.server.url, n):
                # NaN: perf ran but could not count (a kernel without the futex tracepoint, say).
                out["rows"].append({k: None if isinstance(v, float) and not math.isfinite(v) else
                                    rnd(v) if isinstance(v, float) else v for k, v in row.items()})
                log(f"wake-ups {row['label']}: {row['jobs_per_s']:,.0f} jobs/s, {row['cpu_us']:.0f} µs CPU/job, "
                    f"{row['migrations']:.2f} migrations/job")
        except Exception as exc:
            self.results["errors"]["wakeups"] = f"{type(exc).__name__}: {exc}"
            log(f"wake-ups FAILED: {exc}\n{traceback.format_exc()}")

    # -- batches: plain jobs, in a batch, in a chord (bench/batches.py) -------------------------

    def batches(self) -> None:
        """The same no-op jobs plain, in one batch and as a chord's group, drained by two processes:
        what a batch adds per job (jobs/s, CPU, Redis commands), and the callback's delay."""
        import batches

        try:
            self.results["batches"] = batches.run(self, self.p["batches_n"], self.p["batches_reps"], log)
        except Exception as exc:
            self.results["errors"]["batches"] = f"{type(exc).__name__}: {exc}"
            log(f"batches FAILED: {exc}\n{traceback.format_exc()}")

    # -- limits: plain jobs against a bucket and a concurrency limit (bench/limits.py) -----------

    def limits(self) -> None:
        """The same no-op jobs plain and with a limit that never refuses, drained by two processes:
        what a limiter's take (and release) adds per job (CPU, Redis commands)."""
        import limits

        try:
            self.results["limits"] = limits.run(self, self.p["limits_n"], self.p["limits_reps"], log)
        except Exception as exc:
            self.results["errors"]["limits"] = f"{type(exc).__name__}: {exc}"
            log(f"limits FAILED: {exc}\n{traceback.format_exc()}")

    # -- outbox: a push inside a PostgreSQL transaction, OUTBOX off and on; the relay (bench/outbox.py)

    def outbox(self) -> None:
        """What OUTBOX costs a push inside a transaction (single, bulk), and a relay's jobs/s."""
        import outbox

        try:
            self.results["outbox"] = outbox.run(self, self.p, log)
        except Exception as exc:
            self.results["errors"]["outbox"] = f"{type(exc).__name__}: {exc}"
            log(f"outbox FAILED: {exc}\n{traceback.format_exc()}")

    # -- enqueue ---------------------------------------------------------------------------

    def enqueue(self) -> None:
        from benchproject.jobs import NoopIncr
        from systems import _floor_payload

        rnd = self.h.rnd
        out: dict[str, Any] = {}

        plan: list[tuple[str, int, Any, str]] = []

        def timed(name: str, jobs: int, fn: Any, label: str) -> None:
            plan.append((name, jobs, fn, label))

        one, bulk = self.p["enqueue_one_jobs"], self.p["enqueue_bulk_jobs"]

        def perform_async(n: int) -> None:
            for _ in range(n):
                NoopIncr.perform_async(time.time())

        def perform_async_short(n: int) -> None:
            # A queue that workers keep short. Every push is the PUSH script now, onto a backlog
            # or not (it was LPUSH alone onto a backlog, the row above): the same path as that
            # row, kept so that the results of earlier runs compare.
            perform_async(n)

        def perform_bulk(n: int) -> None:
            for start in range(0, n, 1000):
                now = time.time()
                NoopIncr.perform_bulk([(now,)] * min(1000, n - start))

        def lpush_loop(n: int) -> None:
            for _ in range(n):
                self.r.lpush("bare:queue", _floor_payload("noop", time.time()))

        def lpush_bulk(n: int) -> None:
            for start in range(0, n, 1000):
                now = time.time()
                self.r.lpush("bare:queue", *(_floor_payload("noop", now) for _ in range(min(1000, n - start))))

        timed("cogworker_perform_async", one, perform_async, "cogworker perform_async, one at a time")
        timed("cogworker_perform_async_short", one, perform_async_short,
              "cogworker perform_async, one at a time, as to a queue kept short")
        timed("bare_lpush", one, lpush_loop, "bare LPUSH loop, one at a time")
        timed("cogworker_perform_bulk", bulk, perform_bulk, "cogworker perform_bulk, 1,000 per call")
        timed("bare_lpush_bulk", bulk, lpush_bulk, "bare LPUSH of 1,000 payloads per call")
        from systems import Celery, Dramatiq, Huey, Rq, Sidekiq

        peers = [] if self.quick else [Rq(fork=False), Dramatiq(), Huey(), Celery()]
        if not self.quick and not self.args.no_sidekiq:
            peers.append(Sidekiq())
        for system in peers:
            if system.available() is None:
                key = system.key.replace("-simple", "")
                name = {"rq": "rq Queue.enqueue", "dramatiq": "dramatiq actor.send", "huey": "huey task()",
                        "celery": "celery task.delay",
                        "sidekiq": "Sidekiq wire format (MULTI SADD LPUSH EXEC), from Python"}[key]
                timed(f"{key}_one", self.p["enqueue_peer_jobs"],
                      lambda n, s=system: [s.push_one(self.ctx, time.time()) for _ in range(n)],
                      f"{name}, one at a time")
        # Round trips on loopback vary a lot from one second to the next on a small VM: every way is
        # timed in turn, ``reps`` times over, and the median is kept (with the spread).
        rates: dict[str, list[float]] = {name: [] for name, *_ in plan}
        for _rep in range(self.p["enqueue_reps"]):
            for name, jobs, fn, _label in plan:
                self.reset_redis()
                t = time.perf_counter()
                fn(jobs)
                rates[name].append(jobs / (time.perf_counter() - t))
        for name, jobs, _fn, label in plan:
            r = sorted(rates[name])
            out[name] = {"label": label, "jobs": jobs, "reps": len(r), "jobs_per_s": rnd(r[len(r) // 2]),
                         "min_jobs_per_s": rnd(r[0]), "max_jobs_per_s": rnd(r[-1])}
            log(f"enqueue {label}: {out[name]['jobs_per_s']:,} jobs/s (median of {len(r)})")
        self.results["enqueue"] = out

    # -- idle cogworker processes, and the idle worker's memory ------------------------------

    def idle_cogworker(self) -> None:
        from systems import Cogworker

        idle = self.results.setdefault("idle", {})
        mem = self.results.setdefault("memory", {})
        for count in (1, 3):
            system = Cogworker("reliable", 10, processes=count)
            self.reset_redis()
            workers = system.start(self.ctx, tag="-idle")
            try:
                self.wait_ready(system, workers)
                time.sleep(self.p["idle_settle_seconds"])
                if count == 1:
                    mem["cogworker_idle_mb"] = self.h.rnd(self.h.tree_rss([workers[0].pid]) / 2**20)
                res = self.idle_rates(self.p["idle_seconds"])
                idle[f"cogworker_{count}_process{'es' if count > 1 else ''}"] = {
                    "label": f"cogworker, {count} idle process{'es' if count > 1 else ''} (reliable c10)",
                    "processes": count, **res}
                log(f"idle, {count} cogworker process(es): {res['commands_per_s']} commands/s")
            finally:
                for w in workers:
                    w.stop()

    # -- scheduled precision ----------------------------------------------------------------

    def scheduled(self) -> None:
        from systems import Cogworker, Sidekiq

        out: dict[str, Any] = {}
        extra = {}
        pia = self.p["scheduled_poll_interval_average"]
        if pia:
            extra["BENCH_POLL_INTERVAL_AVERAGE"] = str(pia)
        candidates: list[tuple[Any, dict]] = [(Cogworker("reliable", 10), extra)]
        if not self.quick and not self.args.no_sidekiq:
            candidates.append((Sidekiq(), {}))
        for system, env in candidates:
            if system.available():
                continue
            self.reset_redis()
            workers = (system.start(self.ctx, tag="-sched", extra_env=env) if env
                       else system.start(self.ctx, tag="-sched"))
            try:
                self.wait_ready(system, workers)
                k, spread, lead = (self.p["scheduled_jobs"], self.p["scheduled_spread_seconds"],
                                   self.p["scheduled_lead_seconds"])
                now = time.time()
                for i in range(k):
                    system.push_at(self.ctx, now + lead + spread * i / max(k - 1, 1))
                counter = self.h.Counter(self.r)
                counter.wait_for(k, timeout=lead + spread + 60, alive=lambda ws=workers: all(w.alive() for w in ws),
                                 interval=0.05)
                samples = [float(x) for x in self.r.lrange("bench:lat", 0, -1)]
                res = self._lat_stats(samples, k, spread)
                res.pop("rate_per_s")
                res["min_ms"] = self.h.rnd(min(s * 1000 for s in samples))
                # (Sidekiq's average_scheduled_poll_interval is 5 s too, and is left at its default)
                res.update(label=system.label, spread_seconds=spread, processes=1,
                           poll_interval_average=(pia or 5.0) if system.key.startswith("cogworker") else 5.0)
                out[system.key.split("-")[0]] = res
                log(f"scheduled {system.label}: p50 {res['p50_ms']} ms, p99 {res['p99_ms']} ms late")
            except Exception as exc:
                self.results["errors"][f"scheduled-{system.key}"] = f"{type(exc).__name__}: {exc}"
                log(f"scheduled {system.label} FAILED: {exc}")
            finally:
                for w in workers:
                    w.stop()
        self.results["scheduled"] = out

    # -- scale: the poller with many scheduled entries --------------------------------------

    def scale(self) -> None:
        from benchproject.jobs import Stamp

        from django_cogworker.broker.keys import Keys
        from django_cogworker.engine.schedule.poller import Poller
        from django_cogworker.engine.settle.retry import RetryPolicy
        from django_cogworker.push import payload as payloads
        from django_cogworker.push import runtime

        config = runtime.get_config()
        redis = runtime.get_redis()
        keys = Keys(config.key_prefix)
        due_n = self.p["scale_due"]
        out: dict[str, Any] = {}
        for total in (self.p["scale_total"], self.p["scale_small_total"]):
            self.reset_redis()
            now = time.time()
            setter = Stamp.set(queue="scale")
            pipe = redis.pipeline(transaction=False)
            for i in range(due_n):
                pipe.zadd(keys.schedule, {payloads.encode(setter.build([now], {}, now=now)): now - 60 + i * 0.001})
            pipe.execute()
            template = payloads.encode(setter.build([now], {}, now=now))
            jid = json.loads(template)["jid"]
            future = total - due_n
            for start in range(0, future, 10_000):
                batch = {template.replace(jid, f"{i:024x}"): now + 86_400 + i
                         for i in range(start, min(start + 10_000, future))}
                redis.zadd(keys.schedule, batch)
            assert redis.zcard(keys.schedule) == total
            poller = Poller(config=config, redis=redis, keys=keys, retry=RetryPolicy(config, ()), key_guard=None,
                            orphans=None, process_count=lambda: 1)
            a = self.h.snap(self.r)
            cpu = time.process_time()
            t = time.perf_counter()
            moved = poller.enqueue_due()
            seconds = time.perf_counter() - t
            cpu = time.process_time() - cpu
            b = self.h.snap(self.r)
            d = self.h.delta(a, b)
            if moved != due_n or redis.llen(keys.queue("scale")) != due_n:
                raise RuntimeError(f"the poller moved {moved} of {due_n} due entries")
            rnd = self.h.rnd
            out[f"among_{total}"] = {
                "scheduled_entries": total, "due": due_n, "seconds": rnd(seconds),
                "us_per_due_job": rnd(seconds / due_n * 1e6), "poller_cpu_us_per_due_job": rnd(cpu / due_n * 1e6),
                "redis_commands_per_due_job": rnd(d.commands / due_n),
                "redis_round_trips_per_due_job": rnd(d.round_trips / due_n),
                "redis_cpu_us_per_due_job": rnd(d.cpu / due_n * 1e6),
                "redis_used_memory_mb": rnd(int(b.info.get("used_memory", 0)) / 2**20),
            }
            log(f"scale: {due_n} due among {total:,}: {out[f'among_{total}']['us_per_due_job']} µs per due job")
        self.reset_redis()
        self.results["scale"] = out

    # -- memory after many jobs -------------------------------------------------------------

    def memory(self) -> None:
        from systems import Cogworker

        mem = self.results.setdefault("memory", {})
        base = self.results.get("drain", {}).get("cogworker-reliable-c10")
        if base and "rss_mb_after" in base:
            mem[f"cogworker_after_{base['n']}_mb"] = base["rss_mb_after"]
        if self.args.full:
            res = self.drain(Cogworker("reliable", 10), 1_000_000, latency=False, idle=False)
            mem["cogworker_after_1000000_mb"] = res["rss_mb_after"]
            self.results["drain_1m"] = res

    # -- profile ----------------------------------------------------------------------------

    def profile(self) -> None:
        """py-spy record of one cogworker drain, sampling the thread holding the GIL (``--gil``).

        A raw (collapsed stacks) run gives the top frames in the JSON; a second run, the flame graph
        SVG. The worker runs as py-spy's child (attaching to a pid needs ptrace rights that
        sandboxes often lack) and is stopped with SIGINT to the group, as Ctrl-C would.
        """
        spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
        if self.quick or self.args.no_profile or not spy:
            self.results["skipped"]["profile"] = "py-spy not installed" if not spy else "not asked for"
            return
        from systems import Cogworker

        system = Cogworker("reliable", 10)
        n = min(self.n, 50_000)
        out: dict[str, Any] = {"system": system.label, "n": n, "mode": "py-spy record --gil --function --rate 200"}
        svg = RESULTS / "profile.svg"
        for fmt, path in (("raw", self.workdir / "profile.txt"), ("flamegraph", svg)):
            self.reset_redis()
            system.push_bulk(self.ctx, n)
            workers = system.start(self.ctx, tag=f"-profile-{fmt}", wrap=[
                spy, "record", "--gil", "--function", "--rate", "200", "--format", fmt, "-o", str(path), "--"])
            try:
                self.h.Counter(self.r).wait_for(n, timeout=300, alive=workers[0].alive, interval=0.05)
                os.killpg(workers[0].pid, signal.SIGINT)
                try:
                    workers[0].proc.wait(90)
                except subprocess.TimeoutExpired:
                    log(f"py-spy ({fmt}) did not exit after SIGINT; killing it")
            except Exception as exc:
                self.results["errors"][f"profile-{fmt}"] = f"{type(exc).__name__}: {exc}"
            finally:
                for w in workers:
                    w.stop()
        raw = self.workdir / "profile.txt"
        if raw.exists():
            out.update(summarise_profile(raw.read_text()))
            out["stages"] = stages.per_job(raw.read_text(), n, 200)
        out["svg"] = str(svg.relative_to(ROOT)) if svg.exists() else None
        if self.args.baseline:
            out["baseline"] = self._profile_baseline(spy, system, n)
        self.results["profile"] = out

    def baseline_env(self) -> tuple[str, dict[str, str]]:
        """(short sha, worker environment) to run the worker of ``--baseline REV``: its django_cogworker,
        unpacked once per run, with this bench's project, jobs and settings. Raises when git can't."""
        rev = self.args.baseline
        tree = self.workdir / "baseline"
        sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.strip()
        if not tree.exists():
            tree.mkdir()
            archive = subprocess.run(["git", "archive", rev, "django_cogworker"], cwd=ROOT, check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        # (Its package first on the path, which manage.py sees to: the bench project stays this tree's.)
        return sha, {"PYTHONPATH": os.pathsep.join([str(BENCH), str(tree)]), "BENCH_COGWORKER_TREE": str(tree)}

    def _profile_baseline(self, spy: str, system: Any, n: int) -> dict[str, Any]:
        """The same raw profile of the worker as of ``--baseline REV`` (its django_cogworker, this
        bench's job and settings): the per-stage costs before a change, measured in this run."""
        rev = self.args.baseline
        try:
            sha, env = self.baseline_env()
        except (subprocess.CalledProcessError, OSError) as exc:
            self.results["errors"]["profile-baseline"] = f"{rev}: {exc}"
            return {"rev": rev}
        path = self.workdir / "profile-baseline.txt"
        self.reset_redis()
        system.push_bulk(self.ctx, n)
        workers = system.start(self.ctx, tag="-profile-baseline", extra_env=env, wrap=[
            spy, "record", "--gil", "--function", "--rate", "200", "--format", "raw", "-o", str(path), "--"])
        try:
            self.h.Counter(self.r).wait_for(n, timeout=300, alive=workers[0].alive, interval=0.05)
            os.killpg(workers[0].pid, signal.SIGINT)
            workers[0].proc.wait(90)
        except Exception as exc:
            self.results["errors"]["profile-baseline"] = f"{type(exc).__name__}: {exc}"
        finally:
            for w in workers:
                w.stop()
        out: dict[str, Any] = {"rev": sha}
        if path.exists():
            out["stages"] = stages.per_job(path.read_text(), n, 200)
        return out

    def _save_partial(self) -> None:
        path = self.workdir / "partial.json"
        path.write_text(json.dumps(self.results, indent=1, default=str))


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The drain of median jobs/s among ``runs`` (an upper median for an even count: of 2, the faster),
    its CPU per job the median of the runs', with the number of runs and the range of jobs/s."""
    ordered = sorted(runs, key=lambda r: r["jobs_per_s"])
    out = dict(ordered[len(ordered) // 2])
    if len(runs) > 1:
        cpu = sorted(r["worker_cpu_us_per_job"] for r in runs)
        out.update(reps=len(runs), worker_cpu_us_per_job=cpu[len(cpu) // 2],
                   jobs_per_s_range=[ordered[0]["jobs_per_s"], ordered[-1]["jobs_per_s"]],
                   worker_cpu_us_per_job_all=[r["worker_cpu_us_per_job"] for r in runs])
    return out


def summarise_profile(raw: str, top: int = 15) -> dict[str, Any]:
    """Top frames of a py-spy raw (collapsed stacks) profile: self samples and inclusive samples."""
    own: Tally[str] = Tally()
    incl: Tally[str] = Tally()
    threads: Tally[str] = Tally()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [f.strip() for f in stack.split(";") if f.strip()]
        if frames and frames[0].startswith(("thread (", "process ")):
            threads[frames[0]] += n
        frames = [_short(f) for f in frames if not f.startswith(("thread (", "process "))]
        if frames:
            own[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    pct = lambda c: round(100 * c / total, 1) if total else 0.0  # noqa: E731
    return {"samples": total,
            "top_self": [{"frame": f, "pct": pct(c)} for f, c in own.most_common(top)],
            "top_inclusive": [{"frame": f, "pct": pct(c)} for f, c in incl.most_common(top)]}


def _short(frame: str) -> str:
    """``func (path/to/module.py:123)`` -> ``func (module.py:123)``."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    return f"{name} ({where.rsplit('/', 1)[-1]})" if where else name


def check_values(obj: Any, where: str = "") -> list[str]:
    """Every number in the results must be finite (NaN and inf say a measurement went wrong)."""
    bad = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            bad += check_values(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            bad += check_values(v, f"{where}[{i}]")
    elif isinstance(obj, float) and not math.isfinite(obj):
        bad.append(where)
    return bad


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if not args.quick and not args.no_venv and not in_bench_venv():
        python = ensure_venv()
        os.execv(str(python), [str(python), str(Path(__file__).resolve()), *argv])
    sections = args.sections.split(",") if args.sections else list(SECTIONS)
    partial = set(sections) != set(SECTIONS)
    sidekiq_note = None
    if not args.quick and not args.no_sidekiq and {"enqueue", "drain", "real_jobs", "scheduled"} & set(sections):
        sidekiq_note = ensure_sidekiq()
    started = time.time()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    mode = "quick" if args.quick else "full" if args.full else "default"
    if args.quick:
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="cogbench-", suffix=".tmp",
                                        dir=str(args.out.parent) if args.out else None))
    else:
        RESULTS.mkdir(exist_ok=True)
        workdir = RESULTS / f"{stamp}.tmp"
        workdir.mkdir()
    bench = Bench(args, workdir)
    ok = False
    try:
        from systems import all_systems, quick_systems

        res = bench.results
        res["meta"] = {"timestamp": stamp, "mode": mode, "n": bench.n, "argv": argv, "params": bench.p,
                       **({"sections": sections} if partial else {}),
                       "n_caps": {} if args.quick else N_CAPS, "loadavg_start": round(os.getloadavg()[0], 2)}
        res["machine"] = machine()
        res["versions"] = versions(bench.server.version())
        if sidekiq_note:
            res["skipped"]["sidekiq"] = sidekiq_note
        log(f"{mode} run, N = {bench.n:,}, redis {bench.server.url}, work dir {workdir}"
            + (f", sections {', '.join(sections)}" if partial else ""))
        if "enqueue" in sections:
            bench.enqueue()
        if "drain" in sections:
            systems = quick_systems() if args.quick else all_systems(N_CAPS)
            if args.no_sidekiq:
                systems = [s for s in systems if s.key != "sidekiq"]
                res["skipped"]["sidekiq"] = "--no-sidekiq"
            bench.run_drains(systems)
        if not args.quick and "real_jobs" in sections:
            bench.real_jobs()
        if not args.quick and "wakeups" in sections:
            bench.wakeups()
        for name, section in (("batches", bench.batches), ("limits", bench.limits), ("outbox", bench.outbox),
                              ("idle", bench.idle_cogworker), ("scheduled", bench.scheduled), ("scale", bench.scale),
                              ("memory", bench.memory), ("profile", bench.profile)):
            if name in sections:
                section()
        res["meta"]["duration_s"] = round(time.time() - started, 1)
        res["meta"]["loadavg_end"] = round(os.getloadavg()[0], 2)
        ok = True
    finally:
        bench.close()
        if not ok:
            log(f"run failed; logs and partial results kept in {workdir}")
    bad = check_values(bench.results)
    if bad:
        bench.results["errors"]["non_finite"] = bad
    text = json.dumps(bench.results, indent=1, default=str) + "\n"
    outputs = [args.out] if args.out else []
    if not args.quick:
        # (latest.json and the page are a full run's: a partial run is merged in by report.py.)
        outputs += [RESULTS / f"{stamp}.json", *([] if partial else [RESULTS / "latest.json"])]
    for path in outputs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        log(f"wrote {path}")
    if not args.quick and not args.no_docs and not partial:
        import report

        report.write(bench.results)
    elif not args.quick and partial:
        log(f"to put these sections into the page: python bench/report.py bench/results/latest.json "
            f"bench/results/{stamp}.json")
    if bench.results["errors"]:
        log(f"errors: {json.dumps(bench.results['errors'], indent=1)}")
        log(f"worker logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
