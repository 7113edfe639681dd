"""The systems measured: how each pushes jobs (in bulk, one at a time, scheduled) and how its standard
worker is started. Every system runs the same job (benchproject/jobs.py, peers/, sidekiq/): one INCR
of ``bench:done`` for the drain, and ``Stamp(t)`` (RPUSH now - t to ``bench:lat`` + INCR) for the
latencies, so completion and latency are seen the same way for everyone. cogworker and Sidekiq also
have the real jobs, ``IoWait`` and ``CpuBurn`` (``push_bulk``'s ``kind``), for the real-jobs section.

Pushing in bulk uses each library's own bulk path where it has one (cogworker perform_bulk, rq
enqueue_many, kombu's producer batch, Sidekiq's LPUSH of many payloads), and otherwise its one-job
call with the Redis commands collected on a pipeline (dramatiq, huey): the push is not what a drain
measures, the queue is filled before the worker starts.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from harness import Worker, spawn

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
CHUNK = 1000


@dataclass
class Ctx:
    """What every system needs: the Redis server, where to log, the environment for workers."""

    url: str
    r: redis.Redis
    logdir: Path
    state_dir: Path
    env: dict[str, str] = field(default_factory=dict)

    def worker_env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("COGWORKER_", "DJANGO_SETTINGS"))}
        env.update(PYTHONPATH=os.pathsep.join([str(BENCH), str(ROOT)]), BENCH_REDIS_URL=self.url,
                   COGWORKER_REDIS_URL=self.url, DJANGO_SETTINGS_MODULE="benchproject.settings",
                   BENCH_STATE_DIR=str(self.state_dir), PYTHONUNBUFFERED="1")
        env.update(self.env)
        env.update(extra)
        return env


def _bin(name: str) -> str | None:
    """A console script of the running venv (the bench venv), else one on PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


class System:
    key = ""
    label = ""
    worker_desc = ""
    n_cap: int | None = None  # largest N this system drains in a run (slow ones), labelled in the results
    processes = 1

    def available(self) -> str | None:
        """None when this system can run here, else why not."""
        return None

    def push_bulk(self, ctx: Ctx, n: int) -> None:
        """Push ``n`` no-op jobs; cogworker and Sidekiq take a ``kind`` too (a job class of both sides)."""
        raise NotImplementedError

    def push_one(self, ctx: Ctx, t: float) -> None:
        """Push one Stamp(t) job, the way an application pushes one job."""
        raise NotImplementedError

    def start(self, ctx: Ctx, tag: str = "") -> list[Worker]:
        raise NotImplementedError

    def ready(self, ctx: Ctx) -> bool:
        return True


# -- cogworker ---------------------------------------------------------------------------------

class Cogworker(System):
    """``runcogworker``: ``processes`` > 1 runs them under one supervisor (``--processes N``, each
    worker pinned to a CPU of its own by CPU_AFFINITY's default), unless ``by_hand``: N separate
    commands (each kept on one CPU while GIL-bound, as a lone worker is: engine/process/confine.py).
    ``affinity`` sets CPU_AFFINITY ("0": a lone worker pinned to CPU 0; "none": left free)."""

    def __init__(self, fetch: str = "reliable", concurrency: int = 10, processes: int = 1, *,
                 by_hand: bool = False, affinity: str | None = None):
        self.fetch = fetch
        self.concurrency = concurrency
        self.processes = processes
        self.by_hand = by_hand
        self.affinity = affinity
        suffix = (f"-x{processes}" + ("-by-hand" if by_hand else "")) if processes > 1 else ""
        free = affinity == "none"
        self.key = f"cogworker-{fetch}-c{concurrency}{suffix}" + (
            "-free" if free else f"-cpu{affinity}" if affinity else "")
        self.label = f"cogworker {fetch} c{concurrency}" + (
            (f" ×{processes} processes" + (" (by hand)" if by_hand else " (--processes)")) if processes > 1 else "") + (
            " left free (CPU_AFFINITY none)" if free else f" pinned to CPU {affinity}" if affinity else "")
        one = f"`manage.py runcogworker -c {concurrency} --fetch {fetch}"
        if processes > 1 and not by_hand:
            self.worker_desc = f"{one} --processes {processes}`"
        else:
            self.worker_desc = (f"{processes} × " if processes > 1 else "") + f"{one}`"
        if affinity:
            self.worker_desc += ' with `CPU_AFFINITY = "none"`' if free else f' with `CPU_AFFINITY = [{affinity}]`'

    def argv(self) -> list[str]:
        supervised = ["--processes", str(self.processes)] if self.processes > 1 and not self.by_hand else []
        return [sys.executable, str(BENCH / "manage.py"), "runcogworker", "-c", str(self.concurrency),
                "--fetch", self.fetch, "-q", "default", *supervised]

    def start(self, ctx: Ctx, tag: str = "", extra_env: dict[str, str] | None = None,
              wrap: Sequence[str] = ()) -> list[Worker]:
        env = {**({"BENCH_CPU_AFFINITY": self.affinity} if self.affinity else {}), **(extra_env or {})}
        copies = self.processes if self.by_hand else 1
        return [spawn(f"{self.key}{tag}-{i}", [*wrap, *self.argv()], env=ctx.worker_env(**env),
                      cwd=BENCH, logdir=ctx.logdir) for i in range(copies)]

    def ready(self, ctx: Ctx) -> bool:
        return ctx.r.scard("cogworker:processes") >= self.processes

    def push_bulk(self, ctx: Ctx, n: int, kind: str = "NoopIncr") -> None:
        from benchproject import jobs

        job = getattr(jobs, kind)
        for start in range(0, n, CHUNK):
            now = time.time()
            job.perform_bulk([(now,)] * min(CHUNK, n - start))

    def push_one(self, ctx: Ctx, t: float) -> None:
        from benchproject.jobs import Stamp

        Stamp.perform_async(t)

    def push_at(self, ctx: Ctx, due: float) -> None:
        from benchproject.jobs import Stamp

        Stamp.perform_at(due, due)


# -- the floor: a bare redis-py loop -----------------------------------------------------------

def _floor_payload(cls: str, t: float) -> str:
    return json.dumps({"jid": secrets.token_hex(12), "class": cls, "args": [t], "kwargs": {}, "queue": "default",
                       "retry": True, "created_at": t, "enqueued_at": t})


class Floor(System):
    key = "floor"
    label = "bare redis-py loop (floor)"
    worker_desc = "`python -m peers.floor`: LMOVE ×10 pipelined, then INCR + LREM per job pipelined"

    def start(self, ctx: Ctx, tag: str = "") -> list[Worker]:
        return [spawn(f"floor{tag}", [sys.executable, "-m", "peers.floor"], env=ctx.worker_env(), cwd=BENCH,
                      logdir=ctx.logdir)]

    def push_bulk(self, ctx: Ctx, n: int) -> None:
        for start in range(0, n, CHUNK):
            now = time.time()
            ctx.r.lpush("floor:queue", *(_floor_payload("noop", now) for _ in range(min(CHUNK, n - start))))

    def push_one(self, ctx: Ctx, t: float) -> None:
        ctx.r.lpush("floor:queue", _floor_payload("stamp", t))


# -- rq ----------------------------------------------------------------------------------------

class Rq(System):
    def __init__(self, fork: bool, n_cap: int | None = None):
        self.fork = fork
        self.n_cap = n_cap
        cls = "Worker" if fork else "SimpleWorker"
        self.key = "rq-fork" if fork else "rq-simple"
        self.label = "rq Worker (fork per job)" if fork else "rq SimpleWorker (in-process)"
        self.worker_desc = f"`rq worker -w rq.worker.{cls}`"
        self.worker_class = f"rq.worker.{cls}"

    def available(self) -> str | None:
        return _need("rq", "rq")

    def _queue(self, ctx: Ctx) -> Any:
        from rq import Queue

        return Queue("default", connection=ctx.r)

    def start(self, ctx: Ctx, tag: str = "") -> list[Worker]:
        return [spawn(f"{self.key}{tag}", [_bin("rq"), "worker", "--url", ctx.url, "-w", self.worker_class,
                                           "--logging_level", "WARNING", "default"],
                      env=ctx.worker_env(), cwd=BENCH, logdir=ctx.logdir)]

    def push_bulk(self, ctx: Ctx, n: int) -> None:
        from peers import rq_jobs
        from rq import Queue

        q = self._queue(ctx)
        for start in range(0, n, CHUNK):
            now = time.time()
            pipe = ctx.r.pipeline()
            q.enqueue_many([Queue.prepare_data(rq_jobs.noop, args=(now,)) for _ in range(min(CHUNK, n - start))],
                           pipeline=pipe)
            pipe.execute()

    def push_one(self, ctx: Ctx, t: float) -> None:
        from peers import rq_jobs

        if not hasattr(self, "_q"):
            self._q = self._queue(ctx)
        self._q.enqueue(rq_jobs.stamp, t)


# -- dramatiq ----------------------------------------------------------------------------------

class Dramatiq(System):
    key = "dramatiq"
    label = "dramatiq 1 process × 8 threads"
    worker_desc = "`dramatiq peers.dramatiq_jobs -p 1 -t 8`"

    def available(self) -> str | None:
        return _need("dramatiq", "dramatiq")

    def start(self, ctx: Ctx, tag: str = "") -> list[Worker]:
        return [spawn(f"dramatiq{tag}", [_bin("dramatiq"), "peers.dramatiq_jobs", "-p", "1", "-t", "8"],
                      env=ctx.worker_env(), cwd=BENCH, logdir=ctx.logdir)]

    def push_bulk(self, ctx: Ctx, n: int) -> None:
        from peers import dramatiq_jobs

        # dramatiq has no bulk send: send() each, with its dispatch script queued on a pipeline.
        script = dramatiq_jobs.broker.scripts["dispatch"]
        client = script.registered_client
        for start in range(0, n, CHUNK):
            now = time.time()
            pipe = dramatiq_jobs.broker.client.pipeline(transaction=False)
            script.registered_client = pipe
            try:
                for _ in range(min(CHUNK, n - start)):
                    dramatiq_jobs.noop.send(now)
            finally:
                script.registered_client = client
            pipe.execute()

    def push_one(self, ctx: Ctx, t: float) -> None:
        from peers import dramatiq_jobs

        dramatiq_jobs.stamp.send(t)


# -- huey --------------------------------------------------------------------------------------

class Huey(System):
    key = "huey"
    label = "huey 8 threads"
    worker_desc = "`huey_consumer peers.huey_jobs.huey -k thread -w 8`"

    def available(self) -> str | None:
        return _need("huey", "huey_consumer")

    def start(self, ctx: Ctx, tag: str = "") -> list[Worker]:
        return [spawn(f"huey{tag}", [_bin("huey_consumer"), "peers.huey_jobs.huey", "-k", "thread", "-w", "8", "-q"],
                      env=ctx.worker_env(), cwd=BENCH, logdir=ctx.logdir)]

    def push_bulk(self, ctx: Ctx, n: int) -> None:
        from peers import huey_jobs

        # huey has no bulk enqueue: call the task each time, its LPUSH collected on a pipeline.
        storage = huey_jobs.huey.storage
        conn = storage.conn
        for start in range(0, n, CHUNK):
            now = time.time()
            pipe = conn.pipeline(transaction=False)
            storage.conn = pipe
            try:
                for _ in range(min(CHUNK, n - start)):
                    huey_jobs.noop(now)
            finally:
                storage.conn = conn
            pipe.execute()

    def push_one(self, ctx: Ctx, t: float) -> None:
        from peers import huey_jobs

        huey_jobs.stamp(t)


# -- celery ------------------------------------------------------------------------------------

class Celery(System):
    key = "celery"
    label = "celery 8 threads"
    worker_desc = "`celery -A peers.celery_jobs worker -P threads -c 8`"

    def available(self) -> str | None:
        return _need("celery", "celery")

    def start(self, ctx: Ctx, tag: str = "") -> list[Worker]:
        return [spawn(f"celery{tag}", [_bin("celery"), "-A", "peers.celery_jobs", "worker", "-P", "threads", "-c",
                                       "8", "-l", "WARNING"], env=ctx.worker_env(), cwd=BENCH, logdir=ctx.logdir)]

    def push_bulk(self, ctx: Ctx, n: int) -> None:
        from peers import celery_jobs

        with celery_jobs.app.producer_or_acquire() as producer:
            for start in range(0, n, CHUNK):
                now = time.time()
                batch = producer.batch(CHUNK) if hasattr(producer, "batch") else _nullcontext()
                with batch:
                    for _ in range(min(CHUNK, n - start)):
                        celery_jobs.noop.apply_async((now,), producer=producer)

    def push_one(self, ctx: Ctx, t: float) -> None:
        from peers import celery_jobs

        celery_jobs.stamp.delay(t)


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


# -- Sidekiq (Debian's ruby-sidekiq) -----------------------------------------------------------

def _sidekiq_payload(cls: str, t: float, enqueued: bool = True) -> str:
    item = {"class": cls, "args": [t], "retry": True, "queue": "default", "jid": secrets.token_hex(12),
            "created_at": t}
    if enqueued:
        item["enqueued_at"] = t
    return json.dumps(item)


class Sidekiq(System):
    def __init__(self, processes: int = 1, concurrency: int = 10):
        self.processes = processes
        self.concurrency = concurrency
        # (c10 keeps the key "sidekiq" it had before the concurrency could be chosen: older results compare.)
        self.key = "sidekiq" + (f"-c{concurrency}" if concurrency != 10 else "") + (
            f"-x{processes}" if processes > 1 else "")
        self.label = f"Sidekiq c{concurrency} (Ruby)" + (f" ×{processes} processes" if processes > 1 else "")
        self.worker_desc = (f"{processes} × " if processes > 1 else "") + (
            f"`sidekiq -r bench/sidekiq/bench_jobs.rb -c {concurrency}` (Debian ruby-sidekiq)")

    def available(self) -> str | None:
        return None if shutil.which("sidekiq") else "sidekiq is not installed (apt-get install ruby-sidekiq)"

    def start(self, ctx: Ctx, tag: str = "") -> list[Worker]:
        argv = ["sidekiq", "-r", str(BENCH / "sidekiq" / "bench_jobs.rb"), "-c", str(self.concurrency), "-q", "default"]
        return [spawn(f"{self.key}{tag}-{i}", argv, env=ctx.worker_env(REDIS_URL=ctx.url), cwd=BENCH,
                      logdir=ctx.logdir) for i in range(self.processes)]

    def ready(self, ctx: Ctx) -> bool:
        return ctx.r.scard("processes") >= self.processes

    def push_bulk(self, ctx: Ctx, n: int, kind: str = "NoopIncr") -> None:
        for start in range(0, n, CHUNK):
            now = time.time()
            pipe = ctx.r.pipeline(transaction=False)
            pipe.sadd("queues", "default")
            pipe.lpush("queue:default", *(_sidekiq_payload(kind, now) for _ in range(min(CHUNK, n - start))))
            pipe.execute()

    def push_one(self, ctx: Ctx, t: float) -> None:
        # What Sidekiq::Client#push sends (6.x): MULTI, SADD queues, LPUSH, EXEC.
        pipe = ctx.r.pipeline(transaction=True)
        pipe.sadd("queues", "default")
        pipe.lpush("queue:default", _sidekiq_payload("Stamp", t))
        pipe.execute()

    def push_at(self, ctx: Ctx, due: float) -> None:
        ctx.r.zadd("schedule", {_sidekiq_payload("Stamp", due, enqueued=False): due})


def _need(module: str, script: str) -> str | None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        return f"{module} is not installed here (the bench venv has it; --quick runs without peers)"
    if _bin(script) is None:
        return f"the {script} command is not on PATH"
    return None


def all_systems(n_caps: dict[str, int]) -> list[System]:
    return [
        Cogworker("reliable", 10), Cogworker("reliable", 25), Cogworker("basic", 10), Cogworker("basic", 25),
        Cogworker("reliable", 10, affinity="0"), Cogworker("reliable", 10, affinity="none"),
        Cogworker("reliable", 10, processes=2), Cogworker("reliable", 10, processes=2, by_hand=True),
        Floor(),
        Sidekiq(), Sidekiq(processes=2),
        Dramatiq(), Huey(), Celery(),
        Rq(fork=False, n_cap=n_caps.get("rq-simple")), Rq(fork=True, n_cap=n_caps.get("rq-fork")),
    ]


def quick_systems() -> list[System]:
    return [Cogworker("reliable", 10), Cogworker("basic", 10), Floor()]


# -- the async peers (the async-jobs section): arq, SAQ, taskiq ------------------------------------

class AsyncPeer(System):
    """An asyncio job system in its own venv (environment.ASYNC_PEERS), run by its own worker CLI at
    concurrency 100; its job (peers/<name>_jobs.py) awaits ``asyncio.sleep(seconds)`` and counts."""

    name = ""
    concurrency = 100

    def __init__(self) -> None:
        import environment

        self.python = environment.peer_venv(self.name) / "bin" / "python"

    def available(self) -> str | None:
        if not self.python.exists():
            return f"bench/.venv-{self.name} is not there (the bench makes it outside --quick)"
        return None

    def argv(self) -> list[str]:
        raise NotImplementedError

    def start(self, ctx: Ctx, tag: str = "") -> list[Worker]:
        return [spawn(f"{self.key}{tag}", self.argv(), env=ctx.worker_env(), cwd=BENCH, logdir=ctx.logdir)]

    def push_bulk(self, ctx: Ctx, n: int, kind: str = "AwaitShort") -> None:
        import subprocess

        from benchproject.jobs import AWAIT_S

        subprocess.run([str(self.python), "-m", "peers.async_push", self.name, str(n), repr(AWAIT_S[kind])], check=True,
                       cwd=BENCH, env=ctx.worker_env(), timeout=300)


class Arq(AsyncPeer):
    name = key = "arq"
    label = "arq max_jobs 100"
    worker_desc = "`arq peers.arq_jobs.WorkerSettings` (`max_jobs = 100`, arq's log config at WARNING)"

    def argv(self) -> list[str]:
        return [str(self.python.parent / "arq"), "peers.arq_jobs.WorkerSettings", "--custom-log-dict",
                "peers.arq_jobs.LOG_WARNING"]


class Saq(AsyncPeer):
    name = key = "saq"
    label = "SAQ concurrency 100"
    worker_desc = "`saq peers.saq_jobs.settings` (`concurrency: 100`, one process)"

    def argv(self) -> list[str]:
        return [str(self.python.parent / "saq"), "peers.saq_jobs.settings"]


class Taskiq(AsyncPeer):
    name = key = "taskiq"
    label = "taskiq max-async-tasks 100"
    worker_desc = ("`taskiq worker peers.taskiq_jobs:broker --workers 1 --max-async-tasks 100 --log-level WARNING` "
                   "(taskiq-redis RedisStreamBroker)")

    def argv(self) -> list[str]:
        return [str(self.python.parent / "taskiq"), "worker", "peers.taskiq_jobs:broker", "--workers", "1",
                "--max-async-tasks", "100", "--log-level", "WARNING"]


class CogworkerAsync(Cogworker):
    """``runcogworker --async-concurrency N`` (issue 47's event loop), when the worker has that option."""

    def __init__(self, async_concurrency: int = 100, concurrency: int = 10):
        super().__init__("reliable", concurrency)
        self.async_concurrency = async_concurrency
        self.key = f"cogworker-async{async_concurrency}"
        self.label = f"cogworker async, ASYNC_CONCURRENCY {async_concurrency}"
        self.worker_desc = (f"`manage.py runcogworker -c {concurrency} --fetch reliable "
                            f"--async-concurrency {async_concurrency}`")

    def available(self) -> str | None:
        import subprocess

        res = subprocess.run([sys.executable, str(BENCH / "manage.py"), "runcogworker", "--help"], cwd=BENCH,
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH), str(ROOT)]),
                                  "DJANGO_SETTINGS_MODULE": "benchproject.settings"})
        if "--async-concurrency" not in res.stdout:
            return "not available in this build (runcogworker --help has no --async-concurrency)"
        return None

    def argv(self) -> list[str]:
        return [*super().argv(), "--async-concurrency", str(self.async_concurrency)]
