"""Where a ``perform_async`` spends its time, stage by stage, against a bare redis-py LPUSH loop.

    .venv/bin/python bench/tools/push_stages.py [--n 20000] [--reps 5] [--profile]

Starts a private redis-server, sets Django up with cogworker at its defaults (ENQUEUE_ON_COMMIT on,
no client middleware, sqlite), and times in one thread, each ``--reps`` times over (median kept):

* each stage of a push alone, on the real objects: building the payload (jid, dict, JSON check),
  the ``perform`` arity check, the on-commit check (outside a transaction, with the default
  database connection opened, as in a view), the JSON encoding, the Redis command (the PUSH
  script, every push's; LPUSH alone and LPUSH + SADD pipelined, for comparison). The client
  middleware chain costs nothing here: with none configured the chain is the write itself;
* the whole ``perform_async`` (the PUSH script, onto a backlog or not), and the bare loop the
  bench compares it with (``bench/sections/enqueue.py``'s
  ``bare_lpush``: a payload of the same size built with ``json.dumps`` and pushed with
  ``r.lpush`` on a client with the bench's connection settings);
* the server's own time per command (``INFO commandstats``).

``--profile`` prints a cProfile of the ``perform_async`` loop. Not part of ``make bench``: a tool
for looking at the enqueue path; its figures move with the machine's load, compare them within one
run.
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import os
import pstats
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness import RedisServer  # noqa: E402


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=20000, help="calls per timing (default 20,000)")
    p.add_argument("--reps", type=int, default=5, help="timings per row, the median kept (default 5)")
    p.add_argument("--profile", action="store_true", help="also print a cProfile of perform_async")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="push-stages-") as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        try:
            run(server, args)
        finally:
            server.stop()


def run(server: RedisServer, args: argparse.Namespace) -> None:
    os.environ["COGWORKER_REDIS_URL"] = server.url
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django_cogworker"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        USE_TZ=True,
    )
    from django_cogworker import Job

    # Defined before django.setup(), as an app's jobs.py is: a class defined after it, outside every
    # installed app, is refused at its push (no worker would know it: push/discovery.py).
    class NoopIncr(Job):
        name = "bench.NoopIncr"

        def perform(self, t: float = 0.0) -> None: ...

    django.setup()
    import json
    import secrets

    from django.db import connection

    from django_cogworker.broker import scripts
    from django_cogworker.push import payload as payloads
    from django_cogworker.push import runtime
    from django_cogworker.push.arguments import check_call
    from django_cogworker.push.job import JobSetter

    connection.ensure_connection()  # (a view has its connection open: the on-commit check sees it)
    client = runtime.get_client()
    r = client.redis
    bare = server.client()  # the bench's bare loop's client
    setter = JobSetter(NoopIncr, {})
    now = time.time()
    sample = setter.build([now], {})
    sample["enqueued_at"] = now
    raw = payloads.encode(sample)
    key, listing = client.keys.queue("default"), client.keys.queues

    def floor_payload(t: float) -> str:  # bench/systems.py's _floor_payload
        return json.dumps({"jid": secrets.token_hex(12), "class": "noop", "args": [t], "kwargs": {},
                           "queue": "default", "retry": True, "created_at": t, "enqueued_at": t})

    def pipelined() -> None:
        pipe = r.pipeline(transaction=False)
        pipe.lpush(key, raw)
        pipe.sadd(listing, "default")
        pipe.execute()

    # One job to the default queue as the client sends it; each call with a token of its own
    # (the pusher's receipt answers a token it holds without writing: a retry).
    push_keys, push_args = scripts.push_args(client.keys.push_receipt("bench"), "", listing, "",
                                             [(key, "default", [(raw, None, None, "", 0, None)])])
    tokens = itertools.count()

    def push_script() -> None:
        scripts.PUSH(r, push_keys, [str(next(tokens)), *push_args[1:]])

    stages: list[tuple[str, Callable[[], object]]] = [
        ("build payload (jid, dict, JSON check)", lambda: setter.build([time.time()], {})),
        ("argument check (perform arity)", lambda: check_call(NoopIncr, [now], {})),
        ("on-commit check (no transaction)", lambda: client.defer(_never) if client.defer else None),
        ("encode (JSON)", lambda: payloads.encode(sample)),
        ("Redis: PUSH script (EVALSHA)", push_script),
        ("Redis: LPUSH alone", lambda: r.lpush(key, raw)),
        ("Redis: LPUSH + SADD pipelined", pipelined),
        ("bare loop's payload (json.dumps)", lambda: floor_payload(time.time())),
        ("bare loop's LPUSH (bench client)", lambda: bare.lpush("bare:queue", raw)),
        ("perform_async", lambda: NoopIncr.perform_async(time.time())),
        ("bare LPUSH loop (bench/sections/enqueue.py)", lambda: bare.lpush("bare:queue", floor_payload(time.time()))),
    ]
    n = args.n
    wall: dict[str, list[float]] = {label: [] for label, _fn in stages}
    own: dict[str, list[float]] = {label: [] for label, _fn in stages}
    for _rep in range(args.reps):
        for label, fn in stages:
            r.flushdb()
            cpu, t = time.process_time(), time.perf_counter()
            for _ in range(n):
                fn()
            wall[label].append((time.perf_counter() - t) / n * 1e6)
            own[label].append((time.process_time() - cpu) / n * 1e6)
    print(f"{n:,} calls per timing, median of {args.reps}; µs per call: wall, and this process's CPU "
          f"(the client's share: a round trip's wait is the rest)")
    print(f"{'stage':45} {'wall µs':>8} {'calls/s':>10} {'CPU µs':>8}")
    for label, _fn in stages:
        print(f"{label:45} {_median(wall[label]):8.2f} {1e6 / _median(wall[label]):10,.0f} {_median(own[label]):8.2f}")
    pa, floor = "perform_async", "bare LPUSH loop (bench/sections/enqueue.py)"
    print(f"perform_async / bare loop: {_median(wall[floor]) / _median(wall[pa]):.2f}x wall, "
          f"client CPU {_median(own[pa]) - _median(own[floor]):+.2f} µs per push")

    r.config_resetstat()
    for _ in range(n):
        push_script()
        r.lpush(key, raw)
        r.sadd(listing, "default")
    stats = r.info("commandstats")
    print("server time per command (INFO commandstats, µs):",
          ", ".join(f"{name[4:]} {stats[name]['usec_per_call']:.2f}" for name in
                    ("cmdstat_evalsha", "cmdstat_lpush", "cmdstat_sadd") if name in stats))
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            NoopIncr.perform_async(time.time())
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _never() -> None:
    raise AssertionError("the on-commit check took a push outside a transaction")


if __name__ == "__main__":
    main(sys.argv[1:])
