#!/usr/bin/env python3
"""Drain throughput on a three-primary Redis Cluster vs a lone redis-server, side by side.

    .venv/bin/python bench/cluster_drain.py [--n 20000] [--reps 3] [-c 10]

Starts its own servers on free loopback ports (tests/helpers.py: RedisServer, Cluster), pushes N
``bench.NoopIncr`` jobs with perform_bulk, then times one ``runcogworker -c C`` (bench project,
reliable fetch) from its start until the counter reaches N; the worker's start-up is timed the
same way on both, so it is in both figures. Every key of ours is in one slot on the cluster
(docs/architecture.md): this measures what the cluster client and its routing cost, not more
shards' worth of capacity.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent / "tests"), str(BENCH.parent), str(BENCH)]


def drain(url: str, n: int, concurrency: int) -> float:
    """Seconds one worker takes to run ``n`` queued no-op jobs (from its start)."""
    env = {**os.environ, "COGWORKER_REDIS_URL": url, "DJANGO_SETTINGS_MODULE": "benchproject.settings"}
    code = f"""
import django, os
django.setup()
from django_cogworker import runtime
from benchproject.jobs import COUNTER, NoopIncr
r = runtime.get_redis()
r.delete(COUNTER)
for start in range(0, {n}, 1000):
    NoopIncr.set(on_commit=False).perform_bulk([[0.0]] * min(1000, {n} - start))
"""
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=BENCH)
    from helpers import client_for

    counter = client_for(url)
    started = time.monotonic()
    worker = subprocess.Popen([sys.executable, str(BENCH / "manage.py"), "runcogworker", "-c", str(concurrency)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while int(counter.get("bench:done") or 0) < n:
            if worker.poll() is not None:
                raise RuntimeError(f"worker exited with {worker.returncode}")
            time.sleep(0.01)
        return time.monotonic() - started
    finally:
        worker.terminate()
        worker.wait(30)
        counter.close()


def main() -> None:
    from helpers import Cluster, RedisServer

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("-c", type=int, default=10)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        lone = RedisServer(Path(tmp) / "lone").start()
        cluster = Cluster(Path(tmp) / "cluster").start()
        try:
            rates: dict[str, list[float]] = {"lone redis-server": [], "cluster, 3 primaries": []}
            for _ in range(args.reps):  # (interleaved: a slower minute of the machine hits both)
                for name, url in (("lone redis-server", lone.url), ("cluster, 3 primaries", cluster.url)):
                    rates[name].append(args.n / drain(url, args.n, args.c))
            for name, values in rates.items():
                print(f"{name:22} {statistics.median(values):8,.0f} jobs/s (median of {args.reps}: "
                      f"{', '.join(f'{v:,.0f}' for v in values)}), N={args.n:,}, -c {args.c}")
        finally:
            cluster.cleanup()
            lone.cleanup()


if __name__ == "__main__":
    main()
