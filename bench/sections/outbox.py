"""The transactional outbox on PostgreSQL: what OUTBOX costs a push inside a transaction, and how
fast a relay empties a backlog (issue 35).

From one Python thread of the bench process, against the bench's Redis and a PostgreSQL database
of its own (``BENCH_POSTGRES_URL``, default ``postgres://postgres@127.0.0.1:5432/postgres``: the
bench creates ``cogworker_bench_outbox_<pid>`` there, migrates it, drops it at the end):

* single: a transaction that saves an order (one INSERT) and pushes a job, ``NoopIncr.perform_async``,
  OUTBOX off (the push waits for the commit, then one PUSH) and on (an INSERT of the job's row in
  the transaction; at commit the PUSH with the job's mark, then a DELETE); and the transaction
  without the push, what saving the order alone costs;
* bulk: the same with ``perform_bulk`` of 1,000 jobs per transaction;
* relay: a backlog of ``backlog`` rows (written straight to the table), emptied by ``relay_once``
  rounds (the relay thread's work: 500 rows, one PUSH, one DELETE each) from one thread.

Each way is timed ``reps`` times, in turn (off, on, empty, off, ...), the median kept.

    python bench/run.py --sections outbox --no-venv
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

from environment import log as _log
from markdown import Page, fmt, measured_where, source_of, table

NAME = "outbox"
QUICK = True
# (quick, default): jobs pushed one per transaction, in bulk, the relay's backlog; rounds of each way.
PARAMS = {"outbox_single": (200, 5_000), "outbox_bulk": (2_000, 100_000), "outbox_backlog": (2_000, 100_000),
          "outbox_reps": (1, 3)}
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/postgres"


def run(bench: Any, p: dict[str, Any] | None = None, log: Any = _log) -> dict[str, Any]:
    """The section (``p``: the sizes, ``bench.p`` unless given)."""
    p = bench.p if p is None else p
    import psycopg
    from django.db import connections
    from django.test.utils import override_settings

    admin_url = os.environ.get("BENCH_POSTGRES_URL", DEFAULT_URL)
    database = connections["pg"].settings_dict["NAME"]  # (benchproject/settings.py: this process's own)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {database}")
        conn.execute(f"CREATE DATABASE {database}")
    try:
        from django.core.management import call_command

        call_command("migrate", "django_cogworker", database="pg", verbosity=0)
        with connections["pg"].cursor() as cursor:  # (what the transaction saves: an order)
            cursor.execute("CREATE TABLE bench_order (id bigserial PRIMARY KEY, note text NOT NULL)")
        server = connections["pg"].cursor().connection.info.server_version
        out: dict[str, Any] = {"postgres": f"{server // 10000}.{server % 10000}", "reps": p["outbox_reps"]}
        base = dict(_settings())
        ways = {"off": {**base, "OUTBOX": False}, "on": {**base, "OUTBOX": True}}
        for kind, jobs, per in (("single", p["outbox_single"], 1), ("bulk", p["outbox_bulk"], 1000)):
            times: dict[str, list[float]] = {"off": [], "on": [], "empty": []}
            for _rep in range(p["outbox_reps"]):
                for way in ("off", "on", "empty"):
                    bench.reset_redis()
                    with override_settings(COGWORKER=ways["on" if way == "on" else "off"]):
                        times[way].append(_timed(jobs, per, push=way != "empty"))
            row = {way: round(statistics.median(t) * 1e6 / jobs, 2) for way, t in times.items()}  # µs per job
            row["jobs"], row["per_transaction"] = jobs, per
            row["ratio"] = round(row["on"] / row["off"], 2)
            out[kind] = row
            log(f"outbox {kind}: off {row['off']} us/job, on {row['on']} us/job ({row['ratio']}x), "
                f"empty transaction {row['empty']} us/job")
        with override_settings(COGWORKER=ways["on"]):
            out["relay"] = _relay(bench, p["outbox_backlog"], p["outbox_reps"], log)
        return out
    finally:
        connections["pg"].close()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database}")


def _settings() -> dict[str, Any]:
    from django.conf import settings

    return getattr(settings, "COGWORKER", None) or {}


def _timed(jobs: int, per: int, *, push: bool) -> float:
    from benchproject.jobs import NoopIncr
    from django.db import connections, transaction

    t = time.perf_counter()
    for _ in range(jobs // per):
        with transaction.atomic(using="pg"), connections["pg"].cursor() as cursor:
            cursor.execute("INSERT INTO bench_order (note) VALUES (%s)", ["an order"])
            if push and per == 1:
                NoopIncr.perform_async(1.0)
            elif push:
                NoopIncr.perform_bulk([(1.0,)] * per)
    return time.perf_counter() - t


def _relay(bench: Any, backlog: int, reps: int, log: Any) -> dict[str, Any]:
    from benchproject.jobs import NoopIncr

    from django_cogworker.broker.keys import for_config
    from django_cogworker.outbox.models import OutboxJob
    from django_cogworker.outbox.relay import relay_once
    from django_cogworker.push import runtime
    from django_cogworker.push.job import JobSetter

    rates = []
    for _rep in range(reps):
        bench.reset_redis()
        rows = []
        for _ in range(backlog):
            payload = JobSetter(NoopIncr, {}).build([1.0], {})
            rows.append(OutboxJob(jid=payload["jid"], payload=json.dumps(payload), created=0.0))
        OutboxJob.objects.using("pg").bulk_create(rows, batch_size=5000)
        client, redis = runtime.get_client(), runtime.get_redis()
        keys = for_config(runtime.get_config())
        t, taken = time.perf_counter(), 0
        while True:
            done = relay_once("pg", client.hand_over, redis, keys, now=time.time())
            if not done:
                break
            taken += done
        seconds = time.perf_counter() - t
        assert taken == backlog and redis.llen(keys.queue("default")) == backlog, (taken, backlog)
        rates.append(backlog / seconds)
        log(f"outbox relay: {backlog:,} rows in {seconds:.1f} s, {backlog / seconds:,.0f} jobs/s")
    return {"backlog": backlog, "jobs_per_s": round(statistics.median(rates)), "min_jobs_per_s": round(min(rates)),
            "max_jobs_per_s": round(max(rates))}


def report(res: dict[str, Any]) -> str:
    """A push inside a PostgreSQL transaction, OUTBOX off and on; the relay's jobs/s."""
    if not res.get("outbox", {}).get("single"):
        return ""
    page = Page()
    add = page.add
    box = res["outbox"]
    add("## The transactional outbox")
    add("")
    measured_where(add, res, "outbox")
    meta = res["meta"]
    load = (source_of(res, "outbox") or {}).get("load") or [meta.get("loadavg_start"), meta.get("loadavg_end")]
    add(f"PostgreSQL {box['postgres']} on the same machine (its defaults: `synchronous_commit` on, so each commit "
        f"waits for its flush to disk). **The machine was shared**: other work ran tests on its 2 CPUs meanwhile "
        f"(load average {load[0]} at the start, {load[1]} at the end), so these figures are noisier than the "
        "rest of the page; compare the ways within the table.")
    add("")
    add("From one thread, each transaction saves an order (one INSERT) and pushes: *single*, one "
        "`perform_async` per transaction; *bulk*, one `perform_bulk` of 1,000 jobs per transaction. *Off*: the "
        "push waits for the commit, then one PUSH. *On* (`OUTBOX = True`): an INSERT of the push's row (one "
        "row per push, a bulk's payloads in it) in the transaction; at commit the PUSH (each job with its mark), "
        "then a DELETE of the row (its commit not waiting for its flush). Each costs two round trips to "
        "PostgreSQL more than *off*: on a loaded machine a round trip waits for a CPU. *Order only*: "
        "the transaction without the push. Time per job, the median of "
        f"{box['reps']} rounds taken in turn; *push's own*: the time over *order only*.")
    add("")
    rows = []
    for kind, label in (("single", "single, one job per transaction"), ("bulk", "bulk, 1,000 jobs per transaction")):
        d = box[kind]
        off_own, on_own = d["off"] - d["empty"], d["on"] - d["empty"]
        rows.append([f"{label} ({d['jobs']:,} jobs)", d["empty"], d["off"], d["on"], f"{d['ratio']:.2f}×",
                     off_own, on_own, f"{on_own / off_own:.2f}×" if off_own > 0 else "–"])
    add(table(["how", "order only µs/job", "off µs/job", "on µs/job", "on/off", "push's own off µs",
               "push's own on µs", "on/off (push's own)"], rows))
    add("")
    add("The goals were on/off ≤ 1.5× for a single push and ≤ 2× for a bulk. **Single**: not met, and not "
        "to be met without weakening the guarantee: the job's row must be written in the transaction (a "
        "round trip to PostgreSQL) and deleted once Redis has it (another, after the commit), and with "
        "`synchronous_commit` off for that delete both are bare round trips, each about a PUSH's cost; "
        "leaving the row for a relay to delete would keep a committed job's row (and its relay work) for "
        "every push. **Bulk**: the PUSH reads its marks with one ZMSCORE per 1,000 jobs and takes each "
        "job's jid bare (a five-element table and a ZSCORE a job cost 2-3 µs a job); what is left over "
        "*off* is the row's INSERT and DELETE of the bulk's payloads (about 150 KB) and its JSON encoding "
        "at the push and at commit.")
    add("")
    relay = box["relay"]
    add(f"**Relay**: a backlog of {relay['backlog']:,} rows of one job each (what commits that found Redis "
        "away leave) emptied by one relay (its rounds: 500 rows, "
        f"`SELECT ... FOR UPDATE SKIP LOCKED`, one PUSH, one DELETE, one commit) at **{fmt(relay['jobs_per_s'])} "
        f"jobs/s** (median; range {fmt(relay['min_jobs_per_s'])}–{fmt(relay['max_jobs_per_s'])}).")
    add("")
    return page.text()
