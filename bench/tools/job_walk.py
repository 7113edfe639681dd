"""The walk of one no-op job through a worker, from the fetch that takes it to the fetch that acks it.

    .venv/bin/python bench/tools/job_walk.py [--src CHECKOUT] [--tracing] [--full]

Starts a private redis-server, sets Django up with cogworker (CONCURRENCY 1, reliable fetch, TRACING
off unless ``--tracing``), pushes two no-op jobs and starts a Launcher on a thread, with
``threading.setprofile`` recording every call of the package's functions on the fetcher and processor
threads. The second job is the one walked (the first builds its class's plan and the connections):
from the fetcher's ``_gather`` before the fetch that takes it, through its processor, to the fetch
whose round trip carries its ack (where the fetcher, finding the queue empty, would block). With one
processor, the ack always rides that fetch, as under load.

Prints the walk, one ``module:function`` a line (comprehensions and lambdas folded into their
function, consecutive repeats merged; ``F`` the fetcher's thread, ``P`` the processor's) with
``--full``, grouped by module otherwise, then the count of modules and calls. ``--src`` walks another
checkout's package (``git worktree add /tmp/old REV``), run with that checkout's own interpreter (its
venv's editable install is found before a path): how docs/architecture.md's walk compares before
and after a change. Not part of ``make bench``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import RedisServer  # noqa: E402

Event = tuple[str, str, str, str]  # (thread, "call" or "return", module, qualname)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[2],
                   help="the checkout whose django_cogworker is walked (default: this one)")
    p.add_argument("--tracing", action="store_true", help="with TRACING on (opentelemetry installed)")
    p.add_argument("--full", action="store_true", help="one line per call, not grouped by module")
    args = p.parse_args(argv)
    sys.path.insert(0, str(args.src.resolve()))
    with tempfile.TemporaryDirectory(prefix="job-walk-") as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        try:
            events = trace(server.url, args.tracing)
        finally:
            server.stop()
    lines = walk(events)
    modules = list(dict.fromkeys(line.split()[1].split(":")[0] for line in lines))
    print("\n".join(lines if args.full else grouped(lines)))
    print(f"{len(modules)} modules, {len(lines)} calls: {', '.join(modules)}")


def trace(url: str, tracing: bool) -> list[Event]:
    import dataclasses

    import django
    from django.conf import settings

    from django_cogworker.conf import Config

    cogworker = {"REDIS_URL": url, "CONCURRENCY": 1}
    if "tracing" in {f.name for f in dataclasses.fields(Config)}:  # (a checkout older than TRACING has none)
        cogworker["TRACING"] = tracing
    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django_cogworker"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        USE_TZ=True, COGWORKER=cogworker,
    )
    import django_cogworker
    from django_cogworker import Job

    class WalkNoop(Job):  # (defined before django.setup(), as an app's jobs.py is)
        name = "walk.Noop"

        def perform(self) -> None: ...

    django.setup()
    from django_cogworker.broker.connection import make_redis
    from django_cogworker.engine.process.launcher import Launcher
    from django_cogworker.push import runtime

    package = os.path.dirname(django_cogworker.__file__) + os.sep
    print(f"walking {package}", file=sys.stderr)
    config = runtime.get_config()
    client = runtime.get_client()
    WalkNoop.perform_async()
    WalkNoop.perform_async()
    launcher = Launcher(config, make_redis(config))
    events: list[Event] = []
    lock = threading.Lock()
    recording = True

    def record(frame, event, arg):  # noqa: ANN001 - a profile function's signature
        if not recording or event not in ("call", "return"):
            return
        name = threading.current_thread().name
        code = frame.f_code
        if not (name.startswith(("cogworker-fetcher", "cogworker-processor")) and code.co_filename.startswith(package)):
            return
        if event == "return" and code.co_name != "retrieve":
            return
        module = code.co_filename[len(package):-3].replace(os.sep, ".").removesuffix(".__init__")
        with lock:
            events.append(("F" if "fetcher" in name else "P", event, module, code.co_qualname))

    def acked_both() -> bool:
        with lock:
            returns = sum(1 for e in events if e[1] == "return" and e[3].endswith(".retrieve"))
        return returns >= 3 and client.redis.llen(client.keys.queue("default")) == 0

    threading.setprofile(record)
    thread = threading.Thread(target=launcher.run, kwargs={"install_signals": False}, name="walk-launcher")
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not acked_both():
            if time.monotonic() > deadline:
                raise SystemExit("the two jobs were not fetched and acked within 20 s")
            time.sleep(0.05)
        time.sleep(0.2)
    finally:
        recording = False
        threading.setprofile(None)
        launcher.stop()
        thread.join(15)
    return events


def walk(events: list[Event]) -> list[str]:
    """The second job's walk, one ``T module:function`` a line (see the module's docstring)."""
    def calls(thread: str, pattern: str) -> list[int]:
        return [i for i, e in enumerate(events) if e[0] == thread and e[1] == "call" and re.search(pattern, e[3])]

    fetches = calls("F", r"\.retrieve$")
    start = max(i for i in calls("F", r"^Fetcher\._gather$") if i < fetches[1])
    stop = min(i for i in calls("F", r"(AckBatch\.before_block|SettlementQueue\.waiting)$") if i > fetches[2])
    runs = calls("P", r"^Processor\.process$")
    takes = calls("P", r"^Fetcher\.next_unit$")
    p_start = max(i for i in takes if i < runs[1])
    p_stop = min(i for i in takes if i > runs[1])
    lines: list[str] = []
    for i, (thread, event, module, name) in enumerate(events):
        if event != "call" or not (start <= i < stop if thread == "F" else p_start <= i < p_stop):
            continue
        line = f"{thread} {module}:{re.sub(r'[.]<locals>.*$', '', name)}"
        if not lines or lines[-1] != line:
            lines.append(line)
    return lines


def grouped(lines: list[str]) -> list[str]:
    """Consecutive calls in one module on one thread on one line: ``T module: f, g, h``."""
    groups: list[tuple[str, str, list[str]]] = []
    for line in lines:
        thread, rest = line.split(" ", 1)
        module, name = rest.split(":", 1)
        if groups and groups[-1][:2] == (thread, module):
            if groups[-1][2][-1] != name:
                groups[-1][2].append(name)
        else:
            groups.append((thread, module, [name]))
    return [f"{thread} {module}: {', '.join(names)}" for thread, module, names in groups]


if __name__ == "__main__":
    main(sys.argv[1:])
