"""Where a limited job's and a batch job's own worker CPU goes, stage by stage (issue 48, point 4).

    .venv/bin/python bench/tools/limit_stages.py [--n 20000] [--reps 5] [--profile]

Starts a private redis-server, sets Django up with two limited classes (a bucket and a concurrency
limit that never refuse, as the limits section's ``LimitedBucket`` and ``LimitedConcurrent``) and a
batch member, and times in one thread, on the real objects, per job (jobs taken ten at a time, as
one fetch of ``-c 10`` brings them):

* the limits feature's ``fetched`` hook alone, by stage: reading the payload, the ask (keys, the
  holder's token), the script's arguments, the one LIMIT_TAKE_MANY of ten (redis-py's packing, the
  round trip, Redis, the reply's parsing), what the reply gives (the Ticket);
* the whole hook (``ClassLimits.fetched``) and the release of its places (``Releases``: queued on a
  pipeline, executed, landed), as the fetcher runs them;
* a batch job's step: built from its payload (``step_for``), then its share of one BATCH_SUCCEED
  of ten.

``--profile`` prints a cProfile of the whole hook and release. Not part of ``make bench``: a tool for
looking at the limits' path; its figures move with the machine's load, compare them within one run.
"""

from __future__ import annotations

import argparse
import cProfile
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

FETCH = 10  # jobs per fetch


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=20000, help="jobs per timing (default 20,000)")
    p.add_argument("--reps", type=int, default=5, help="timings per row, the median kept (default 5)")
    p.add_argument("--profile", action="store_true", help="also print a cProfile of the hook and release")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="limit-stages-") as tmp:
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
    from django_cogworker import Job, Limiter

    bucket = Limiter.bucket("stages:bucket", 10**9, per=1)
    concurrent = Limiter.concurrent("stages:concurrent", 10**6, lease=60)

    class LimitedBucket(Job):
        name = "stages.LimitedBucket"
        limits = [bucket]

        def perform(self, t: float = 0.0) -> None: ...

    class LimitedConcurrent(Job):
        name = "stages.LimitedConcurrent"
        limits = [concurrent]

        def perform(self, t: float = 0.0) -> None: ...

    django.setup()
    from django_cogworker.engine.fetch.contract import Unit
    from django_cogworker.engine.settle.retry import RetryPolicy
    from django_cogworker.features.batches.steps import BatchSteps, step_for
    from django_cogworker.features.limits import gate as gates
    from django_cogworker.features.limits import scripts as limit_scripts
    from django_cogworker.features.limits.hook import FETCHED, ClassLimits
    from django_cogworker.features.limits.limiter import HELD
    from django_cogworker.push import payload as payloads
    from django_cogworker.push import runtime
    from django_cogworker.push.job import JobSetter

    client = runtime.get_client()
    r, keys = client.redis, client.keys
    config = runtime.get_config()
    gate = gates.LimitGate(r, keys, over_limit_max=config.over_limit_max, retry=RetryPolicy.__new__(RetryPolicy))
    hook = ClassLimits(gate)
    releases = gates.Releases(gate)
    steps = BatchSteps(r, keys, 3600.0)

    def raws(cls: type, extra: dict | None = None) -> list[bytes]:
        setter = JobSetter(cls, {})
        out = []
        for _ in range(FETCH):
            payload = setter.build([time.time()], {})
            payload.update(extra or {})
            out.append(payloads.encode(payload).encode())
        return out

    n = max(FETCH, args.n // FETCH * FETCH)
    rows: list[tuple[str, str, Callable[[], object]]] = []
    for label, cls in (("bucket", LimitedBucket), ("concurrent", LimitedConcurrent)):
        batch = raws(cls)
        decoded = [payloads.decode(raw) for raw in batch]
        limits = cls.limits
        asked = [gate._ask(payload, limits) for payload in decoded]
        def pack(asked: list = asked) -> tuple[list, list]:
            return gate.packing.many([(keyed, (refusal, token, parked)) for keyed, token, refusal, parked in asked])

        packed = pack()

        def take_call(packed: tuple = packed) -> list:
            return limit_scripts.LIMIT_TAKE_MANY(r, *packed)

        replies = take_call()

        def granted(asked: list = asked, replies: list = replies) -> None:
            for (keyed, token, _refusal, _parked), reply in zip(asked, replies, strict=True):
                taken = gate._granted(keyed, token, reply)
                if isinstance(taken, gates.Ticket):
                    for hold in taken.holds:
                        HELD.remove(hold)

        def whole(batch: list = batch) -> None:
            units = [Unit(raw, "default") for raw in batch]
            hook.fetched(units)
            tickets = [unit.notes[FETCHED] for unit in units if unit.notes and unit.notes.get(FETCHED)]
            if tickets:
                steps_ = [gates.Release(ticket, "") for ticket in tickets]
                pipe = r.pipeline(transaction=False)
                releases.queue(pipe, steps_)
                releases.landed(steps_, pipe.execute(raise_on_error=False))

        rows += [
            (label, "decode the payload", lambda batch=batch: [payloads.decode(raw) for raw in batch]),
            (label, "ask (keys, holder token)", lambda decoded=decoded, limits=limits:
             [gate._ask(payload, limits) for payload in decoded]),
            (label, "script arguments (held.py Packing)", pack),
            (label, "LIMIT_TAKE_MANY of 10 (pack, trip, parse)", take_call),
            (label, "the reply's Ticket", granted),
            (label, "whole: fetched hook + release", whole),
        ]
    member = raws(LimitedBucket, {"bid": "stages-batch"})
    member_payloads = [payloads.decode(raw) for raw in member]

    def batch_step() -> None:
        held = [step_for(payload, "success") for payload in member_payloads]
        pipe = r.pipeline(transaction=False)
        steps.queue(pipe, held)
        pipe.execute(raise_on_error=False)

    rows.append(("batch", "step_for + BATCH_SUCCEED of 10", batch_step))
    own: dict[tuple[str, str], list[float]] = {(a, b): [] for a, b, _fn in rows}
    wall: dict[tuple[str, str], list[float]] = {(a, b): [] for a, b, _fn in rows}
    for _rep in range(args.reps):
        for way, label, fn in rows:
            cpu, t = time.process_time(), time.perf_counter()
            for _ in range(n // FETCH):
                fn()
            wall[(way, label)].append((time.perf_counter() - t) / n * 1e6)
            own[(way, label)].append((time.process_time() - cpu) / n * 1e6)
    print(f"{n:,} jobs per timing ({FETCH} a fetch), median of {args.reps}; µs per job: this process's CPU, and wall")
    print(f"{'way':11} {'stage':48} {'CPU µs':>8} {'wall µs':>8}")
    for way, label, _fn in rows:
        print(f"{way:11} {label:48} {_median(own[(way, label)]):8.2f} {_median(wall[(way, label)]):8.2f}")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _way, label, fn in rows:
            if label.startswith("whole"):
                for _ in range(n // FETCH):
                    fn()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


if __name__ == "__main__":
    main(sys.argv[1:])
