"""Scale: the poller with many scheduled entries. ``Poller.enqueue_due()`` called once, in this
process, moving the due entries of ``schedule`` to their queue, with the set holding many entries not
yet due (a million; 5,000 in --quick) versus few.

Writes ``scale``: per case, µs, poller CPU, Redis commands, round trips and CPU per due job.
"""

from __future__ import annotations

import json
import time
from typing import Any

import harness
from environment import log
from markdown import Page, table
from session import Bench

NAME = "scale"
QUICK = True
# (quick, default): entries in the set, in the small case, of which due.
PARAMS = {"scale_total": (5_000, 1_000_000), "scale_small_total": (100, 1_000), "scale_due": (100, 1_000)}


def run(bench: Bench) -> dict[str, Any]:
    from benchproject.jobs import Stamp

    from django_cogworker.broker.keys import Keys
    from django_cogworker.engine.schedule.poller import Poller
    from django_cogworker.engine.settle.retry import RetryPolicy
    from django_cogworker.push import payload as payloads
    from django_cogworker.push import runtime

    config = runtime.get_config()
    redis = runtime.get_redis()
    keys = Keys(config.key_prefix)
    due_n = bench.p["scale_due"]
    out: dict[str, Any] = {}
    for total in (bench.p["scale_total"], bench.p["scale_small_total"]):
        bench.reset_redis()
        now = time.time()
        setter = Stamp.set(queue="scale")
        pipe = redis.pipeline(transaction=False)
        for i in range(due_n):
            pipe.zadd(keys.schedule, {payloads.encode(setter.build([now], {}, now=now)): now - 60 + i * 0.001})
        pipe.execute()
        template = payloads.encode(setter.build([now], {}, now=now))
        jid = json.loads(template)["jid"]
        future = total - due_n
        for start in range(0, future, 10_000):
            batch = {template.replace(jid, f"{i:024x}"): now + 86_400 + i
                     for i in range(start, min(start + 10_000, future))}
            redis.zadd(keys.schedule, batch)
        assert redis.zcard(keys.schedule) == total
        poller = Poller(config=config, redis=redis, keys=keys, retry=RetryPolicy(config, ()), key_guard=None,
                        orphans=None, process_count=lambda: 1)
        a = harness.snap(bench.r)
        cpu = time.process_time()
        t = time.perf_counter()
        moved = poller.enqueue_due()
        seconds = time.perf_counter() - t
        cpu = time.process_time() - cpu
        b = harness.snap(bench.r)
        d = harness.delta(a, b)
        if moved != due_n or redis.llen(keys.queue("scale")) != due_n:
            raise RuntimeError(f"the poller moved {moved} of {due_n} due entries")
        rnd = harness.rnd
        out[f"among_{total}"] = {
            "scheduled_entries": total, "due": due_n, "seconds": rnd(seconds),
            "us_per_due_job": rnd(seconds / due_n * 1e6), "poller_cpu_us_per_due_job": rnd(cpu / due_n * 1e6),
            "redis_commands_per_due_job": rnd(d.commands / due_n),
            "redis_round_trips_per_due_job": rnd(d.round_trips / due_n),
            "redis_cpu_us_per_due_job": rnd(d.cpu / due_n * 1e6),
            "redis_used_memory_mb": rnd(int(b.info.get("used_memory", 0)) / 2**20),
        }
        log(f"scale: {due_n} due among {total:,}: {out[f'among_{total}']['us_per_due_job']} µs per due job")
    bench.reset_redis()
    return out


def report(res: dict[str, Any]) -> str:
    scale = res.get("scale", {})
    if not scale:
        return ""
    page = Page()
    add = page.add
    add("## Scale: the poller with many scheduled entries")
    add("")
    add("`Poller.enqueue_due()` called once, in-process, moving the due entries of `schedule` to their "
        "queue, with the set holding many entries not yet due versus only the due ones. Each due entry is "
        "a share of one read (up to 100 due entries, plus the first not yet due) and one script (ZSCORE, LPUSH, "
        "ZREM, SADD).")
    add("")
    rows = [[f"{d['due']:,} due among {d['scheduled_entries']:,}", d["us_per_due_job"],
             d["poller_cpu_us_per_due_job"], d["redis_commands_per_due_job"], d["redis_round_trips_per_due_job"],
             d["redis_cpu_us_per_due_job"], d["redis_used_memory_mb"]] for d in scale.values()]
    add(table(["case", "µs per due job", "poller CPU µs", "Redis cmds", "round trips", "Redis CPU µs",
               "Redis memory MB"], rows))
    add("")
    return page.text()
