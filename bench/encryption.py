"""What encrypted arguments cost a job, in µs: on the push side and on the run side (issue 36).

    .venv/bin/python bench/encryption.py [--n 20000] [--reps 5] [--out results.json]

Starts a private redis-server, sets Django up with cogworker at its defaults plus one
ENCRYPTION_KEYS entry, and times in one thread, each ``--reps`` times over (the median kept), two
job classes alike but for ``encrypt = True``, with the same arguments (three values, ~100 bytes of
JSON; and a ~1 KB row):

* push: ``JobSetter.build`` (the payload: sealed or not) and the whole ``perform_async`` (the PUSH
  script to a lone Redis); the cost of encryption is the difference, sealed minus plain;
* run: what a worker does with a fetched payload before ``perform``: decode its JSON, then
  ``perform_arguments`` (the one place it decrypts; a plain payload's arguments are read as they
  are). The cost is again the difference.

A seal is one AES-256-GCM encryption of the arguments' JSON (with a 12-byte random nonce) and a
base64 of it; an open, the reverse. Not part of ``make bench``'s page: a figure for the docs
(docs/encryption.md) and for the issue; it moves with the machine's load, compare within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import RedisServer  # noqa: E402

SMALL = ("someone@example.com", 4242, {"card": "4111-1111-1111-1111", "amount": 19.99})
ROW = ({f"field_{i}": f"value number {i} of a row of personal data" for i in range(20)},)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=20000, help="calls per timing (default 20,000)")
    p.add_argument("--reps", type=int, default=5, help="timings per row, the median kept (default 5)")
    p.add_argument("--out", help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-encryption-") as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        try:
            figures = run(server, args)
        finally:
            server.stop()
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")


def run(server: RedisServer, args: argparse.Namespace) -> dict:
    os.environ["COGWORKER_REDIS_URL"] = server.url
    import django
    from django.conf import settings

    from django_cogworker.features.encryption.keys import new_key

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django_cogworker"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        USE_TZ=True, COGWORKER={"ENCRYPTION_KEYS": [new_key()]},
    )
    from django_cogworker import Job

    # Defined before django.setup(), as an app's jobs.py is (push/discovery.py).
    class Plain(Job):
        name = "bench.Plain"

        def perform(self, *args: object) -> None: ...

    class Sealed(Job):
        name = "bench.Sealed"
        encrypt = True

        def perform(self, *args: object) -> None: ...

    django.setup()
    from django.db import connection

    from django_cogworker.features.encryption.codec import perform_arguments
    from django_cogworker.features.encryption.keys import ring_for
    from django_cogworker.push import payload as payloads
    from django_cogworker.push import runtime
    from django_cogworker.push.job import JobSetter

    connection.ensure_connection()  # (as in a view: the on-commit check looks at open connections)
    redis = runtime.get_redis()
    ring = ring_for(runtime.get_config().encryption_keys)
    n, reps = args.n, args.reps

    def timed(plain_fn: Callable[[], object], sealed_fn: Callable[[], object]) -> tuple[float, float]:
        """µs per call of each: the medians of ``reps`` timings of ``n`` calls, the two taken in turn
        (a change in the machine's load falls on both)."""
        runs: tuple[list[float], list[float]] = ([], [])
        for _ in range(reps):
            for fn, into in ((plain_fn, runs[0]), (sealed_fn, runs[1])):
                started = time.perf_counter()
                for _ in range(n):
                    fn()
                into.append((time.perf_counter() - started) / n * 1e6)
        return statistics.median(runs[0]), statistics.median(runs[1])

    def measure(arguments: tuple) -> dict:
        plain, sealed = JobSetter(Plain, {}), JobSetter(Sealed, {})
        plain_raw = payloads.encode(plain.build(arguments, {}))
        sealed_raw = payloads.encode(sealed.build(arguments, {}))
        job_plain, job_sealed = Plain(), Sealed()
        opened = perform_arguments(job_sealed, payloads.decode(sealed_raw), ring)
        assert list(opened[0]) == list(arguments), "sealed arguments open to what was pushed"
        rows = {
            "build": timed(lambda: plain.build(arguments, {}), lambda: sealed.build(arguments, {})),
            "perform_async": timed(lambda: Plain.perform_async(*arguments), lambda: Sealed.perform_async(*arguments)),
            "run: decode + arguments": timed(lambda: perform_arguments(job_plain, payloads.decode(plain_raw), ring),
                                             lambda: perform_arguments(job_sealed, payloads.decode(sealed_raw), ring)),
        }
        redis.flushdb()
        return {"payload_bytes": {"plain": len(plain_raw), "sealed": len(sealed_raw)},
                **{name: {"plain_us": round(a, 2), "sealed_us": round(b, 2), "added_us": round(b - a, 2)}
                   for name, (a, b) in rows.items()}}

    figures: dict = {"machine": machine(), "n": n, "reps": reps, "cases": {}}
    for label, arguments in (("3 values, ~100 B", SMALL), ("a row, ~1 KB", ROW)):
        case = figures["cases"][label] = measure(arguments)
        size = case["payload_bytes"]
        print(f"\n{label}: payload {size['plain']} B plain, {size['sealed']} B sealed")
        print(f"  {'':28}{'plain µs':>10}{'sealed µs':>11}{'added µs':>10}")
        for name, row in case.items():
            if name != "payload_bytes":
                print(f"  {name:28}{row['plain_us']:10.2f}{row['sealed_us']:11.2f}{row['added_us']:10.2f}")
    print(f"\n{figures['machine']}; n={n}, median of {reps}")
    return figures


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        idle = Path("/sys/devices/system/cpu/cpuidle/current_driver").read_text().strip()
    except OSError:
        idle = "?"
    return f"{cpu}, cpuidle {idle}, Python {platform.python_version()}"


if __name__ == "__main__":
    main(sys.argv[1:])
