#!/usr/bin/env python3
"""Drain throughput on a lone redis-server, a one-shard and a three-shard Redis Cluster.

    .venv/bin/python bench/tools/cluster_drain.py [--n 20000] [--reps 3] [-c 10] [--processes 1] [--queues 3]

Starts its own servers on free loopback ports (tests/helpers.py: RedisServer, Cluster), pushes N
``bench.NoopIncr`` jobs with perform_bulk, spread evenly over ``--queues`` queues, then times one
``runcogworker -c C -q <those queues>`` (bench project, reliable fetch) from its start until the
counter reaches N; the worker's start-up is in every figure. On a cluster each queue's keys live
in that queue's own slot (docs/architecture.md, "Redis Cluster"): the queue names are picked so
that on three shards each is served by a different primary, and where they landed is printed.
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

BENCH = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(BENCH.parent / "tests"), str(BENCH.parent), str(BENCH)]


def drain(url: str, n: int, concurrency: int, processes: int, queues: list[str]) -> float:
    """Seconds one worker takes to run ``n`` queued no-op jobs spread over ``queues`` (from its start)."""
    env = {**os.environ, "COGWORKER_REDIS_URL": url, "DJANGO_SETTINGS_MODULE": "benchproject.settings"}
    code = f"""
import django, os
django.setup()
from django_cogworker import runtime
from benchproject.jobs import COUNTER, NoopIncr
r = runtime.get_redis()
r.delete(COUNTER)
queues = {queues!r}
for start in range(0, {n}, 1000):
    for i, queue in enumerate(queues):
        count = len(range(start + i, min(start + 1000, {n}), len(queues)))
        NoopIncr.set(on_commit=False, queue=queue).perform_bulk([[0.0]] * count)
"""
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=BENCH)
    from helpers import client_for

    counter = client_for(url)
    started = time.monotonic()
    worker = subprocess.Popen([sys.executable, str(BENCH / "manage.py"), "runcogworker", "-c", str(concurrency),
                               "--processes", str(processes), "-q", ",".join(queues)],
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


def commands(node) -> int:
    """Commands ``node`` (a RedisServer) has processed so far."""
    client = node.client()
    try:
        return int(client.info("stats")["total_commands_processed"])
    finally:
        client.close()


def spread_queues(cluster, count: int) -> list[str]:
    """``count`` queue names whose slots different primaries of ``cluster`` serve (as far as it has them)."""
    from django_cogworker.broker.keys import Keys

    keys, names, ports = Keys("{cogworker}:", spread=True), [], []
    candidates = [(f"bench{i}", cluster.node_of(keys.queue(f"bench{i}")).port) for i in range(100)]
    for k in range(count):  # (the primaries in turn)
        want = cluster.nodes[k % len(cluster.nodes)].port
        name, port = next((n, p) for n, p in candidates if p == want and n not in names)
        names.append(name)
        ports.append(port)
    print("queues: " + ", ".join(f"{name} -> {keys.queue(name)} on :{port}"
                                 for name, port in zip(names, ports, strict=True)))
    return names


def main() -> None:
    from helpers import Cluster, RedisServer

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("-c", type=int, default=10)
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--queues", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        lone = RedisServer(Path(tmp) / "lone").start()
        one = Cluster(Path(tmp) / "one", masters=1).start()
        three = Cluster(Path(tmp) / "three").start()
        try:
            queues = spread_queues(three, args.queues)
            print(f"home slot (stats, schedule, retry, registries): {three.node_of('{cogworker}:queues').port}")
            setups = {"lone redis-server": (lone.url, [lone]), "cluster, 1 shard": (one.url, one.nodes),
                      "cluster, 3 shards": (three.url, three.nodes)}
            rates: dict[str, list[float]] = {name: [] for name in setups}
            load: dict[str, list[int]] = {}
            for _ in range(args.reps):  # (interleaved: a slower minute of the machine hits each)
                for name, (url, nodes) in setups.items():
                    before = [commands(node) for node in nodes]
                    rates[name].append(args.n / drain(url, args.n, args.c, args.processes, queues))
                    load[name] = [commands(node) - b for node, b in zip(nodes, before, strict=True)]
            for name, values in rates.items():
                print(f"{name:20} {statistics.median(values):8,.0f} jobs/s (median of {args.reps}: "
                      f"{', '.join(f'{v:,.0f}' for v in values)}), N={args.n:,}, {len(queues)} queues, "
                      f"-c {args.c}, --processes {args.processes}")
            for name, counts in load.items():  # (the last repetition: pushes, drain, and the bench's own reads)
                print(f"{name:20} Redis commands per shard: {', '.join(f'{c:,}' for c in counts)} "
                      f"({sum(counts) / args.n:.1f} per job)")
        finally:
            three.cleanup()
            one.cleanup()
            lone.cleanup()


if __name__ == "__main__":
    main()
