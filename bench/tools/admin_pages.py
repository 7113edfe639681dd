"""How long the admin's list pages take on big sets (a benchmark, not a test).

    .venv/bin/python bench/tools/admin_pages.py [--entries 1000000] [--repeat 5]

Starts a private redis-server (no persistence, a free port), fills the dead and
scheduled sets with ``--entries`` payloads each (pipelined), then times each
list page through Django's test client, in process, so the figure is the
server's time to build the page: the first, middle and last pages, the job and
substring filters, and a job's detail page. Prints a Markdown table of the
median and worst of ``--repeat`` runs.

1% of the payloads are of another job class and 0.01% carry the word
"needle" in their error message, so the filters have something to find.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from admin_client import admin_client  # noqa: E402  (the private server and the logged-in client)

MAIN_JOB = "testproject.demo.jobs.RecordJob"
RARE_JOB = "testproject.demo.jobs.FailJob"
CHUNK = 2_000


def fill(client, key: str, count: int, now: float) -> float:
    """Add ``count`` payloads to the sorted set ``key``; return the seconds it took."""
    from django_cogworker.push import payload as payloads

    started = time.perf_counter()
    pipe = client.pipeline(transaction=False)
    for base in range(0, count, CHUNK):
        members = {}
        for i in range(base, min(base + CHUNK, count)):
            members[payloads.encode({
                "jid": f"{i:024x}", "class": RARE_JOB if i % 100 == 7 else MAIN_JOB,
                "args": [f"order-{i}", i], "kwargs": {"attempt": i % 5}, "queue": "default", "retry": 5,
                "created_at": now - 90_000, "enqueued_at": now - 86_000, "failed_at": now - 86_000 + i % 1000,
                "retry_count": 5, "error_class": "RuntimeError",
                "error_message": ("needle in the stack" if i % 10_000 == 3 else f"upstream timed out after {i % 30}s"),
            })] = now - 86_400 + i * 0.01
        pipe.zadd(key, members)
        if len(pipe) >= 25:
            pipe.execute()
    pipe.execute()
    return time.perf_counter() - started


def timed(client, url: str, repeat: int) -> tuple[float, float, int]:
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        response = client.get(url)
        runs.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (url, response.status_code)
    return statistics.median(runs), max(runs), len(response.content)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000, help="entries in each of dead and scheduled")
    parser.add_argument("--repeat", type=int, default=5)
    options = parser.parse_args()

    with admin_client() as (client, redis, keys):
        from django_cogworker import api
        from django_cogworker.push import runtime

        now = time.time()
        for key in (keys.dead, keys.schedule):
            seconds = fill(redis, key, options.entries, now)
            print(f"filled {key} with {options.entries:,} entries in {seconds:.1f}s", file=sys.stderr)
        info = redis.info("memory")
        print(f"redis {redis.info('server')['redis_version']}, used memory {info['used_memory_human']}",
              file=sys.stderr)

        rows = []
        for page, title in (("dead", "Dead"), ("scheduled", "Scheduled")):
            url = f"/admin/django_cogworker/{page}/"
            pages = api.DeadSet().page().pages if page == "dead" else api.ScheduledSet().page().pages
            token = (api.DeadSet() if page == "dead" else api.ScheduledSet()).page(pages // 2).items[0].token
            for label, query in (("first page", "?page=1"), ("middle page", f"?page={pages // 2}"),
                                 ("last page", f"?page={pages}"), ("last page, 500 per page",
                                                                   f"?page={pages // 20}&per_page=500"),
                                 ("filter: job (1% match)", f"?job={RARE_JOB}"),
                                 ("filter: substring (0.01% match)", "?q=needle"),
                                 ("filter: job + substring, none match", f"?job={RARE_JOB}&q=nothing-here"),
                                 ("job detail", f"job/{quote(token)}/")):
                target = url + query if query.startswith("?") else url + query
                median, worst, size = timed(client, target, options.repeat)
                rows.append((title, label, median, worst, size))
        median, worst, size = timed(client, "/admin/django_cogworker/dashboard/", options.repeat)
        rows.append(("Dashboard", "-", median, worst, size))
        runtime.reset()

    print(f"\n{options.entries:,} dead + {options.entries:,} scheduled entries; median / worst of "
          f"{options.repeat} runs; server time (Django test client, in process)\n")
    print("| page | view | median ms | worst ms | HTML bytes |")
    print("|---|---|---:|---:|---:|")
    for title, label, median, worst, size in rows:
        print(f"| {title} | {label} | {median:.1f} | {worst:.1f} | {size:,} |")


if __name__ == "__main__":
    main()
