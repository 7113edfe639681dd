"""One bench run's shared state, handed to every section's ``run(bench)``: its private redis-server,
Django set up against it, the sizes (``bench.p``), the results being written (``bench.results``), and
the measurements several sections make: a drain (``drain``), push-to-start latency, idle rates.

Nothing here knows a section: each section module (bench/sections/) says what it measures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import harness
from environment import log
from systems import Ctx, System

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent


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


class Bench:
    """``params``: each section's PARAMS, name -> (quick, default); an argument of the same name
    (``--batches-n`` is ``batches_n``) overrides it."""

    def __init__(self, args: argparse.Namespace, workdir: Path, params: Iterable[tuple[str, tuple[Any, Any]]]):
        self.args = args
        self.quick: bool = args.quick
        self.workdir = workdir
        self.server = harness.RedisServer(workdir / "redis").start()
        self.r = self.server.client()
        self.ctx = Ctx(url=self.server.url, r=self.r, logdir=workdir / "logs", state_dir=workdir)
        self.n: int = args.n or (300 if self.quick else 100_000)
        self.only = set(args.only.split(",")) if args.only else None
        self.p: dict[str, Any] = {name: getattr(args, name, None) or (quick if self.quick else default)
                                  for name, (quick, default) in params}
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

    def reset_redis(self) -> None:
        self.r.flushall()
        self.r.config_resetstat()

    def save_partial(self) -> None:
        """The results so far, in the work directory (kept when the run fails)."""
        (self.workdir / "partial.json").write_text(json.dumps(self.results, indent=1, default=str))

    def wait_ready(self, system: System, workers: list, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not system.ready(self.ctx):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{system.key} not ready after {timeout}s")
            for w in workers:
                if not w.alive():
                    raise RuntimeError(f"{w.name} exited at start:\n{w.tail()}")
            time.sleep(0.05)

    # -- latency and idle rates (the drain section's, the scheduled and the idle sections') ---------

    @staticmethod
    def lat_stats(samples: list[float], pushed: int, seconds: float) -> dict[str, Any]:
        rnd = harness.rnd
        ms = [s * 1000 for s in samples]
        return {"jobs": len(ms), "rate_per_s": rnd(pushed / seconds) if seconds else 0.0,
                "p50_ms": rnd(harness.percentile(ms, 50)), "p99_ms": rnd(harness.percentile(ms, 99)),
                "max_ms": rnd(max(ms))}

    def latency(self, system: System, workers: list, rate: float, *, jobs: int | None = None,
                seconds: float | None = None) -> dict[str, Any]:
        """Push Stamp(t) jobs one at a time at ``rate``/s; return push-to-start percentiles."""
        self.r.delete("bench:lat")
        counter = harness.Counter(self.r)
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
        return self.lat_stats(samples, pushed, pushing)

    def idle_rates(self, seconds: float) -> dict[str, Any]:
        a = harness.snap(self.r)
        time.sleep(seconds)
        b = harness.snap(self.r)
        d = harness.delta(a, b)
        rnd = harness.rnd
        return {"seconds": rnd(d.seconds), "commands_per_s": rnd(d.commands / d.seconds),
                "round_trips_per_s": rnd(d.round_trips / d.seconds),
                "by_command_per_s": {k: rnd(v / d.seconds) for k, v in sorted(d.by_command.items())}}

    # -- a drain -----------------------------------------------------------------------------------

    def drain(self, system: Any, n: int, *, kind: str | None = None, latency: bool = True,
              idle: bool = True, then: Callable[[list], dict[str, Any]] | None = None,
              cpu: Callable[[list[int]], float] | None = None, threads: bool = False) -> dict[str, Any]:
        """Drain ``n`` jobs, no-ops or (cogworker and Sidekiq) ``kind`` (IoWait, CpuBurn).

        ``cpu``: how the workers' CPU is read (``harness.tree_cpu`` by default); ``threads``: sample
        the workers' thread count while they run, its peak as ``threads_peak``.

        ``then(workers)``: called once the drain is measured, before the workers stop (the batches
        section waits there for its callback); the dict it returns joins the results."""
        h, rnd = harness, harness.rnd
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
        tree_cpu = cpu or h.tree_cpu
        sampler = h.ThreadPeak(pids) if threads else None
        out: dict[str, Any] = {"label": system.label, "worker": system.worker_desc, "n": n,
                               "processes": len(workers)}
        try:
            counter = h.Counter(self.r)
            started = (tree_cpu(pids), h.machine_busy(), h.own_cpu(), h.snap(self.r), counter.gets, 0)
            counter.wait_for(1, timeout=120, alive=alive, interval=0.002)
            # (The workers' CPU and Redis's counts read before the count: every job counted after c0
            # ran after them. Read after, a worker on a loaded machine ran jobs in between: the
            # quick mode's floor measured 0 µs a job, and a batch 0.2 INCRs a job.)
            cpu_a = tree_cpu(pids)
            busy_a, own_a = h.machine_busy(), h.own_cpu()
            a = h.snap(self.r)
            gets0 = counter.gets  # (c0's own GET is the bench's: counted out below)
            c0 = counter.value()
            if c0 >= n:  # (all run while being read: a short drain on a loaded machine, the quick mode's)
                cpu_a, busy_a, own_a, a, gets0, c0 = started  # measured from the start, the workers' startup in it
                out["measured_from_start"] = True
            counter.wait_for(n, timeout=120 + n / 50, alive=alive, interval=0.005)
            b = h.snap(self.r)
            cpu_b = tree_cpu(pids)
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
            if sampler is not None:
                out["threads_peak"] = sampler.stop()
            for w in workers:
                w.stop()
        return out

    # -- the --baseline revision's worker (the profile and batches sections) -------------------------

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
