"""What the admin's pages cost on the data of issue 12 (a benchmark, not a test).

    .venv/bin/python bench/tools/admin_bad_data.py [--case all] [--big-mb 10] [--dead 1000000]

Each case runs in a fresh process, against a private redis-server, through Django's test
client (in process): the server's time for the page, its HTML size, the bytes Redis sent,
and how much the process's peak RSS grew while serving it.

- ``big``: 50 dead entries of ``--big-mb`` MB each: a 50-per-page list, one entry's page,
  a substring filter.
- ``queues``: 10,000 queue names (one job in every tenth): the dashboard, the queues page.
- ``retry``: "Retry all" over ``--dead`` dead entries: the first request.

Set PYTHONPATH to another checkout's root to measure that code (the "before" figures).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
REPO = Path(os.environ.get("COGWORKER_CODE", BENCH.parent))
sys.path[:0] = [str(REPO), str(BENCH.parent / "tests")]


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _get(client, redis, url: str, method: str = "get", data: dict | None = None) -> dict:
    sent = redis.info("stats")["total_net_output_bytes"]
    peak = _rss_mb()
    started = time.perf_counter()
    response = getattr(client, method)(url, data or {})
    ms = (time.perf_counter() - started) * 1000
    return {"url": url, "status": response.status_code, "ms": round(ms, 1), "html_bytes": len(response.content),
            "redis_bytes_sent": redis.info("stats")["total_net_output_bytes"] - sent,
            "peak_rss_mb_before": round(peak, 1), "peak_rss_mb_after": round(_rss_mb(), 1)}


def run_case(case: str, options: argparse.Namespace) -> list[dict]:
    from admin_client import admin_client

    with admin_client() as (client, redis, keys):
        from django_cogworker.push import payload as payloads

        base = "/admin/django_cogworker/"
        now = time.time()

        def entry(i: int, args: list) -> str:
            return payloads.encode({"jid": f"{i:024x}", "class": "testproject.demo.jobs.RecordJob", "args": args,
                                    "kwargs": {}, "queue": "default", "retry": 5, "created_at": now,
                                    "enqueued_at": now, "failed_at": now, "retry_count": 5,
                                    "error_class": "RuntimeError", "error_message": f"boom {i}"})

        client.get(base + "dashboard/")  # templates loaded, connections made
        rows = []
        if case == "big":
            big = "x" * (options.big_mb * 1_000_000)
            for i in range(50):
                redis.zadd(keys.dead, {entry(i, [big]): now - i})
            del big
            token = f"{now!r}|{0:024x}"
            rows.append(_get(client, redis, f"{base}dead/job/{token}/"))
            rows.append(_get(client, redis, f"{base}dead/?q=boom+7"))
            rows.append(_get(client, redis, f"{base}dead/?per_page=50"))
        elif case == "queues":
            pipe = redis.pipeline(transaction=False)
            for i in range(options.queues):
                pipe.sadd(keys.queues, f"tenant-{i:06d}")
                if i % 10 == 0:
                    pipe.lpush(keys.queue(f"tenant-{i:06d}"), entry(i, [i]))
            pipe.execute()
            rows.append(_get(client, redis, f"{base}dashboard/"))
            rows.append(_get(client, redis, f"{base}queue/"))
        elif case == "retry":
            pipe = redis.pipeline(transaction=False)
            for start in range(0, options.dead, 2_000):
                pipe.zadd(keys.dead, {entry(i, [i]): now - i for i in range(start, min(start + 2_000, options.dead))})
                if len(pipe) >= 25:
                    pipe.execute()
            pipe.execute()
            rows.append(_get(client, redis, f"{base}dead/", "post", {"action": "retry_all", "confirmed": "yes"}))
            rows[-1]["moved"] = redis.llen(keys.queue("default"))
        return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", default="all", choices=("all", "big", "queues", "retry"))
    parser.add_argument("--big-mb", type=int, default=10)
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--dead", type=int, default=1_000_000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        print(json.dumps(run_case(options.case, options)))
        return
    for case in ("big", "queues", "retry") if options.case == "all" else (options.case,):
        argv = [sys.executable, __file__, "--child", "--case", case, "--big-mb", str(options.big_mb),
                "--queues", str(options.queues), "--dead", str(options.dead)]
        out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
        for row in json.loads(out.strip().splitlines()[-1]):
            print(case, json.dumps(row))


if __name__ == "__main__":
    main()
