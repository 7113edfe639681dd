"""The benchmark harness keeps working: `bench/run.py --quick` runs end to end (its own redis-server,
cogworker workers, the bare loop) and writes a JSON with every section and sane numbers.

No speed is asserted: only that each figure was measured (positive, finite) and is consistent.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# A measurement: run alone, after the parallel pass (pyproject's markers), not beside three other
# test processes (a drain of a few hundred jobs finished while its window was being opened).
pytestmark = pytest.mark.serial

SECTIONS = ("meta", "machine", "versions", "enqueue", "drain", "latency", "idle", "scheduled", "memory", "scale",
            "batches", "limits", "fairness", "outbox", "iteration", "async_jobs")


def _numbers(obj, where=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _numbers(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _numbers(v, f"{where}[{i}]")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield where, obj


def _positive(value, where):
    assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, f"{where} = {value!r}"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "quick.json"
    # Not the suite's Redis nor its settings: the bench starts and configures its own.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COGWORKER_", "DJANGO_SETTINGS_MODULE"))}
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), "--quick", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"bench/run.py --quick failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return json.loads(out.read_text())


def test_every_section_is_there_and_nothing_failed(results):
    for section in SECTIONS:
        assert results.get(section), f"section {section!r} missing or empty"
    assert results["errors"] == {}, results["errors"]
    assert results["meta"]["mode"] == "quick"
    assert results["machine"]["nproc"] >= 1


def test_every_number_is_finite_and_not_negative(results):
    # Allowed below zero: the scheduled minimum (a job run early would show there), the machine's
    # other load (a difference of two CPU accountings, a little negative on a quiet machine) and the
    # batches' and the limits' overheads, and how many fewer jobs/s tracing and the metrics history
    # cost (a few hundred jobs: within the noise of zero, either side).
    for where, value in _numbers(results):
        assert math.isfinite(value), f"{where} = {value!r}"
        if not where.endswith(("min_ms", "other_cpu_cores")) and ".overhead_pct." not in where \
                and ".added_per_job." not in where and ".fewer_" not in where:
            assert value >= 0, f"{where} = {value!r}"


def test_drain_measured_cogworker_and_the_floor(results):
    drains = results["drain"]
    assert {"cogworker-reliable-c10", "floor"} <= set(drains)
    for key, d in drains.items():
        for field in ("jobs_per_s", "seconds", "worker_cpu_us_per_job", "redis_commands_per_job",
                      "redis_round_trips_per_job", "redis_cpu_us_per_job", "rss_mb_after", "bulk_push_jobs_per_s"):
            _positive(d[field], f"drain.{key}.{field}")
        assert 0 < d["jobs_measured"] <= d["n"]
        # Every job INCRs the counter: at least one command (and less than one round trip only if batched).
        assert d["commands_per_job"].get("incrby", 0) + d["commands_per_job"].get("incr", 0) >= 0.9, d
    # The floor pipelines its per-job work: fewer round trips than jobs.
    assert drains["floor"]["redis_round_trips_per_job"] < 1


def test_latency_enqueue_idle_scheduled(results):
    for key, d in results["latency"].items():
        for phase in ("idle", "loaded"):
            for field in ("p50_ms", "p99_ms", "rate_per_s"):
                _positive(d[phase][field], f"latency.{key}.{phase}.{field}")
            assert d[phase]["p50_ms"] <= d[phase]["p99_ms"] <= d[phase]["max_ms"]
    for key in ("cogworker_perform_async", "cogworker_perform_async_short", "cogworker_perform_bulk", "bare_lpush",
                "bare_lpush_bulk"):
        _positive(results["enqueue"][key]["jobs_per_s"], f"enqueue.{key}")
    for key in ("cogworker_1_process", "cogworker_3_processes"):
        _positive(results["idle"][key]["commands_per_s"], f"idle.{key}")
    sched = results["scheduled"]["cogworker"]
    assert sched["jobs"] == results["meta"]["params"]["scheduled_jobs"]
    _positive(sched["p99_ms"], "scheduled.cogworker.p99_ms")
    # Never early: a scheduled job starts at or after its due time (a little clock noise allowed).
    assert sched["min_ms"] > -50, sched


def test_memory_and_scale(results):
    mem = results["memory"]
    _positive(mem["cogworker_idle_mb"], "memory.cogworker_idle_mb")
    after = [k for k in mem if k.startswith("cogworker_after_")]
    assert after and all(mem[k] > 0 for k in after), mem
    scale = results["scale"]
    assert len(scale) == 2
    for key, d in scale.items():
        assert d["due"] > 0 and d["scheduled_entries"] >= d["due"]
        for field in ("us_per_due_job", "redis_commands_per_due_job", "redis_round_trips_per_due_job"):
            _positive(d[field], f"scale.{key}.{field}")


def test_batches_plain_batch_and_chord(results):
    bat = results["batches"]
    assert set(bat["variants"]) == {"plain", "batch", "chord"}
    for how, d in bat["variants"].items():
        for field in ("jobs_per_s", "worker_cpu_us_per_job", "redis_commands_per_job", "redis_round_trips_per_job",
                      "push_jobs_per_s", "push_redis_commands_per_job"):
            _positive(d[field], f"batches.{how}.{field}")
        assert len(d["runs"]) == bat["reps"] >= 1
        # Every member INCRs the counter once, in a batch or not.
        assert d["commands_per_job"].get("incrby", 0) + d["commands_per_job"].get("incr", 0) >= 0.9, d
    for how in ("batch", "chord"):
        # The callback ran (once: more is an error of the section) after the last member ended.
        _positive(bat["variants"][how]["callback_delay_ms"], f"batches.{how}.callback_delay_ms")
        assert set(bat["overhead_pct"][how]) == {"jobs_per_s", "worker_cpu_us_per_job", "redis_commands_per_job",
                                                 "redis_round_trips_per_job"}
    # A job of a batch settles its batch step in a script of its own: more commands than a plain job.
    assert bat["variants"]["batch"]["redis_commands_per_job"] > bat["variants"]["plain"]["redis_commands_per_job"]


def test_limits_plain_bucket_and_concurrent(results):
    lim = results["limits"]
    assert set(lim["variants"]) == {"plain", "bucket", "concurrent"}
    for how, d in lim["variants"].items():
        for field in ("jobs_per_s", "worker_cpu_us_per_job", "redis_commands_per_job", "redis_round_trips_per_job",
                      "redis_cpu_us_per_job"):
            _positive(d[field], f"limits.{how}.{field}")
        assert len(d["runs"]) == lim["reps"] >= 1
        assert d["commands_per_job"].get("incrby", 0) + d["commands_per_job"].get("incr", 0) >= 0.9, d
    # (No job was refused and no place left held: the section checks it, an error otherwise.)
    added = lim["added_per_job"]
    # The takes of the jobs one fetch brings are one script call (LIMIT_TAKE_MANY), reading and writing
    # each limiter key once for all of them, and the releases of a round trip another: both ride round
    # trips the worker makes anyway (the takes right after the fetch, the releases with the acks on the
    # next fetch's pipeline: features/limits/held.py). So a bucket's state is read (HMGET) and written
    # (HSET, PEXPIRE) about once per fetch, not per job, and a concurrency limit adds and removes each
    # job's own place (ZADD, ZREM: one a job). Far less than a round trip of its own was added per job
    # (each was one: a bucket added 1, a concurrency limit 2). (Not the commands added over the plain
    # drain: in a drain this short, the plain run's idle and background commands per job moved that
    # difference by more than one.)
    bucket, concurrent = (lim["variants"][how]["commands_per_job"] for how in ("bucket", "concurrent"))
    assert 0 < min(bucket.get(c, 0) for c in ("hincrby", "hmget", "pexpire", "hset")) < 0.5, bucket
    assert min(concurrent.get(c, 0) for c in ("zadd", "zrem")) >= 0.8, concurrent
    assert added["bucket"]["redis_round_trips_per_job"] < 0.75, added
    assert added["concurrent"]["redis_round_trips_per_job"] < 0.75, added
    assert 0 < lim["variants"]["bucket"]["commands_per_job"].get("evalsha", 0) < 1, lim["variants"]["bucket"]


def test_fairness_plain_and_grouped_drains_a_prioritized_fetch_and_push(results):
    fair = results["fairness"]
    ways = fair["drains"]["ways"]
    assert set(ways) == {"plain", "grouped"}  # (no --baseline in the quick run)
    for way, d in ways.items():
        for field in ("jobs_per_s", "worker_cpu_us_per_job", "redis_commands_per_job", "redis_cpu_us_per_job"):
            _positive(d[field], f"fairness.{way}.{field}")
    # A grouped job is taken in its group's turn (the ring's LLEN and LMOVE, then the group list's
    # LMOVE): the lanes were used, not the plain path (one LMOVE a job). (The section checks that no
    # lane is left after the drain, an error otherwise.)
    grouped, plain = ways["grouped"]["commands_per_job"], ways["plain"]["commands_per_job"]
    assert grouped.get("lmove", 0) >= 1.6 and grouped.get("llen", 0) >= 0.8, grouped
    assert plain.get("lmove", 0) < 1.5 and plain.get("llen", 0) < 0.2, plain
    backlogs = {d["backlog"] for d in fair["fetches"].values()}
    assert len(backlogs) == 2 and {d["kind"] for d in fair["fetches"].values()} == {"plain", "priority"}
    for key, d in fair["fetches"].items():
        for field in ("client_us_p50", "fetches_per_s", "redis_us_per_call"):
            _positive(d[field], f"fairness.fetches.{key}.{field}")
    assert set(fair["pushes"]) == {"plain_one", "priority_one", "plain_bulk", "priority_bulk"}
    for way, d in fair["pushes"].items():
        _positive(d["jobs_per_s"], f"fairness.pushes.{way}.jobs_per_s")


def test_outbox_off_and_on_and_the_relay(results):
    box = results["outbox"]
    for kind in ("single", "bulk"):
        for way in ("off", "on", "empty"):
            _positive(box[kind][way], f"outbox.{kind}.{way}")
        _positive(box[kind]["ratio"], f"outbox.{kind}.ratio")
    # (Every row of the backlog relayed and found in its queue: the section checks it, an error otherwise.)
    _positive(box["relay"]["jobs_per_s"], "outbox.relay.jobs_per_s")
    assert box["relay"]["backlog"] > 0


def test_iteration_floor_enumerator_and_checkpoints(results):
    it = results["iteration"]
    assert it["rows"] == results["meta"]["params"]["iteration_rows"] and it["batch"] > 0
    for way in ("floor", "enumerator", "checkpoint_default", "checkpoint_every_item"):
        _positive(it[way]["us_per_item"], f"iteration.{way}.us_per_item")
        assert len(it[way]["us_per_item_all"]) == it["reps"] >= 1
    # (Every row walked once by each way, and each job run to its end, its saved state gone: the
    # section checks it, an error otherwise.) A checkpoint after every item is one round trip each;
    # the floor makes none, and the default (at most one a second) a handful per run.
    assert it["floor"]["redis_round_trips_per_item"] == 0
    assert it["checkpoint_every_item"]["redis_round_trips_per_item"] >= 1
    assert it["checkpoint_default"]["redis_round_trips_per_item"] < 0.1


def test_per_stage_costs_count_the_job_s_own_redis_calls_as_the_job_and_leave_start_up_out():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import stages
    finally:
        sys.path.remove(str(REPO / "bench"))
    thread = "thread (0x7f00)"
    raw = "\n".join([
        # (py-spy raw: frames root first, ";"-separated, then the sample count)
        f"{thread};_bootstrap (threading.py:1);Processor.run (/x/processor.py:80);Processor.process "
        "(/x/processor.py:96);CloseOldConnections.__call__ (/x/db.py:37);call_perform (/x/job.py:43);"
        "Redis.execute_command (/v/redis/client.py:956) 60",
        f"{thread};_bootstrap (threading.py:1);Processor.run (/x/processor.py:80);Fetcher.next_unit "
        "(/x/fetcher.py:83) 10",
        f"{thread};_bootstrap (threading.py:1);Processor.run (/x/processor.py:80);Processor.process "
        "(/x/processor.py:96);decode (/x/payload.py:179);JSONDecoder.decode (/p/json/decoder.py:332) 30",
        "<module> (manage.py:1);setup (/d/django/__init__.py:8) 500",
    ])
    res = stages.per_job(raw, jobs=1000, rate=100)
    by = {row["stage"]: row for row in res["stages"]}
    assert res["startup_samples"] == 500 and res["gil_us_per_job"] == 1000.0  # 100 samples / 100 Hz / 1000 jobs
    assert by["the job's own code (one INCR through redis-py)"]["pct"] == 60.0
    assert by["payload decode (JSON)"]["us_per_job"] == 300.0
    assert by["hand-over between threads (wait for a job, give back a slot)"]["pct"] == 10.0


def test_async_jobs_drained_on_threads_and_counted_their_threads(results):
    # Issue 47's rows: an async def perform on processor threads at -c 10 and -c 100, both awaits;
    # the event loop's row measured when runcogworker has --async-concurrency, else said unavailable.
    sec = results["async_jobs"]
    for kind in ("AwaitShort", "AwaitLong"):
        for c in (10, 100):
            d = sec["drain"][f"cogworker-threads-c{c}/{kind}"]
            _positive(d["jobs_per_s"], f"async_jobs {c} {kind} jobs/s")
            _positive(d["worker_cpu_us_per_job"], f"async_jobs {c} {kind} CPU")
            assert 0 < d["jobs_measured"] <= d["n"] == sec["n"][kind]
            # Each processor is a thread: a peak under the concurrency was not sampled from the worker.
            assert d["threads_peak"] >= c, d
    loop = "cogworker-async100"
    if loop in sec["unavailable"]:
        assert sec["unavailable"][loop]["why"].startswith("not available in this build")
    else:
        assert sec["drain"][f"{loop}/AwaitShort"]["jobs_per_s"] > 0
    assert {"arq", "saq", "taskiq"} <= set(sec["unavailable"])  # (the peers: not in --quick)
