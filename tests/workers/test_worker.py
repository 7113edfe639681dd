"""`manage.py runcogworker` end to end: real worker processes against real Redis servers.

What an operator relies on: the banner, the options, a bad setting refused at start with its
name, TERM / TSTP / TTIN and their remote equivalents, a long job handed back at shutdown, and
every job of a big weighted run done exactly once, in both fetch modes.
"""

from __future__ import annotations

import json
import re
import signal
import statistics
import time

import pytest
from helpers import FAST_ENV, RedisServer, Worker, free_port, wait_until, worker
from peek import left_no_trace, queued_jids

from django_cogworker import __version__
from django_cogworker.broker.keys import Keys
from testproject.demo.flow_jobs import ExpiringJob
from testproject.demo.jobs import ConnectionJob, FailJob, LogJob, RecordJob, SleepJob

K = Keys()
FETCH_MODES = ["reliable", "basic"]


def test_banner_options_and_a_password_never_shown(tmp_path):
    password = "s3cret-pa55word"
    with RedisServer(tmp_path / "redis", password=password) as srv:
        r = srv.client(decode_responses=True)
        health_port = free_port()
        args = ("-c", "3", "-q", "alpha,3", "-q", "beta", "--fetch", "basic", "--timeout", "2", "--tag", "blue",
                "--max-memory-mb", "4096", "--max-jobs-per-process", "100000", "--health-port", str(health_port))
        # (A REDIS_URL that differs too, as a deployment may leave one: the worker says which it uses.)
        ignored = "redis://:other-pa55@10.9.9.9:6390/0"
        with worker(tmp_path, *args, env={"COGWORKER_REDIS_URL": srv.url, "REDIS_URL": ignored}) as w:
            identity = w.wait_ready()
            info = json.loads(r.hget(K.process(identity), "info"))
            w.term()
            assert w.wait(30) == 0
        r.close()
    log = w.log()
    banner = log.splitlines()[0]
    assert banner.startswith(f"cogworker {__version__} ")
    assert f"pid {w.pid}" in banner
    assert f"redis redis://:***@127.0.0.1:{srv.port}/0" in banner
    assert "queues alpha(3), beta(1)" in banner
    assert "concurrency 3" in banner
    assert "fetch basic" in banner
    assert banner.endswith(f" | outbox off | max memory 4096 MB | max jobs 100000 per process | "
                           f"health 127.0.0.1:{health_port}")
    assert (f"Redis URL from COGWORKER_REDIS_URL: redis://:***@127.0.0.1:{srv.port}/0; also set, and ignored: "
            "REDIS_URL (redis://:***@10.9.9.9:6390/0)") in log
    assert password not in log and "other-pa55" not in log
    assert (info["concurrency"], info["queues"], info["weights"], info["fetch"], info["tag"], info["pid"]) == (
        3, ["alpha", "beta"], {"alpha": 3, "beta": 1}, "basic", "blue", w.pid)
    assert "waiting up to 2.0s" in log  # --timeout


@pytest.mark.parametrize("args,env,expected", [
    (("--fetch", "sometimes"), {}, "invalid choice: 'sometimes'"),
    (("-c", "0"), {}, 'COGWORKER["CONCURRENCY"] must be a positive integer, got 0'),
    (("--timeout", "-1"), {}, 'COGWORKER["SHUTDOWN_TIMEOUT"] must be a positive number of seconds, got -1.0'),
    (("-q", "mail,0"), {}, "weight of 'mail' must be a positive integer, got 0"),
    (("--processes", "many"), {}, 'COGWORKER["PROCESSES"] must be a positive integer or "auto", got \'many\''),
    ((), {"COGWORKER_CONCURRENCY": "-2"}, 'COGWORKER["CONCURRENCY"] must be a positive integer, got -2'),
    ((), {"COGWORKER_FETCH": "fast"}, 'COGWORKER["FETCH"] must be one of "reliable", "basic", got \'fast\''),
    ((), {"COGWORKER_ORPHAN_THRESHOLD": "0.5", "COGWORKER_HEARTBEAT_INTERVAL": "5"},
     'COGWORKER["ORPHAN_THRESHOLD"] must be more than twice HEARTBEAT_INTERVAL'),
], ids=["fetch-choice", "concurrency-option", "timeout-option", "queue-weight", "processes-option",
        "concurrency-setting", "fetch-setting", "orphan-threshold"])
def test_a_bad_option_or_setting_fails_at_start_naming_it(tmp_path, r, args, env, expected):
    w = Worker(*args, env={**FAST_ENV, **env}, log_path=tmp_path / "worker.log")
    code = w.wait(60)
    assert code != 0
    assert expected in w.log()
    assert "Traceback" not in w.log()
    assert r.scard(K.processes) == 0  # never started


@pytest.mark.parametrize("fetch", FETCH_MODES)
def test_term_exits_0_and_leaves_no_process_entry(tmp_path, r, fetch):
    with worker(tmp_path, "--fetch", fetch) as w:
        identity = w.wait_ready()
        jid = RecordJob.perform_async("ran")
        wait_until(lambda: r.lrange("ran", 0, -1) == [jid], timeout=15)
        w.term()
        assert w.wait(30) == 0
    assert left_no_trace(r, identity)
    assert "stopped" in w.log()


def test_tstp_quiets_the_process(tmp_path, r):
    with worker(tmp_path) as w:
        identity = w.wait_ready()
        w.signal(signal.SIGTSTP)
        wait_until(lambda: r.hget(K.process(identity), "quiet") == "true", timeout=10)
        jid = RecordJob.perform_async("ran")
        time.sleep(2.5)  # longer than a blocking fetch that was in flight at the quiet
        assert w.alive
        assert r.llen("ran") == 0
        assert queued_jids(r) == [jid]
        w.term()
        assert w.wait(30) == 0
    assert queued_jids(r) == [jid]  # still there, for another process


def test_ttin_dumps_every_thread(tmp_path):
    with worker(tmp_path) as w:
        w.wait_ready()
        w.signal(signal.SIGTTIN)
        wait_until(lambda: "thread dump" in w.log(), timeout=10)
        wait_until(lambda: "cogworker-processor-0" in w.log(), timeout=5)
        assert w.alive
        log = w.log()
        for thread in ("MainThread", "cogworker-heartbeat", "cogworker-poller", "cogworker-fetcher"):
            assert f"Thread {thread}" in log
        w.term()
        assert w.wait(30) == 0


def test_remote_signals_are_picked_up_on_the_next_beat(tmp_path, r):
    with worker(tmp_path) as w:
        identity = w.wait_ready()
        r.lpush(K.signals(identity), "dump")
        wait_until(lambda: "thread dump" in w.log(), timeout=10)
        r.lpush(K.signals(identity), "quiet")
        wait_until(lambda: r.hget(K.process(identity), "quiet") == "true", timeout=10)
        assert w.alive
        r.lpush(K.signals(identity), "stop")
        assert w.wait(30) == 0
    log = w.log()
    for sig in ("dump", "quiet", "stop"):
        assert f"remote signal: {sig}" in log
    assert left_no_trace(r, identity)


@pytest.mark.parametrize("fetch", FETCH_MODES)
def test_term_during_a_long_job_hands_it_back_to_the_head_and_it_runs_again(tmp_path, r, fetch):
    env = {"COGWORKER_FETCH": fetch, "COGWORKER_CONCURRENCY": "1", "COGWORKER_SHUTDOWN_TIMEOUT": "0.5"}
    with worker(tmp_path, env=env) as first:
        first.wait_ready()
        long_jid = SleepJob.perform_async(2.0, "marks")
        wait_until(lambda: r.lrange("marks", 0, -1) == [f"start:{long_jid}"], timeout=15)
        others = [RecordJob.perform_async("marks", f"other-{i}") for i in range(3)]
        started = time.monotonic()
        first.term()
        assert first.wait(30) == 0
        took = time.monotonic() - started
    assert queued_jids(r)[0] == long_jid  # at the end the fetch pops: it runs next
    assert sorted(queued_jids(r)[1:]) == sorted(others)
    with worker(tmp_path, name="second", env=env) as second:
        second.wait_ready()
        wait_until(lambda: r.llen("marks") == 6, timeout=30)
        second.term()
        assert second.wait(30) == 0
    marks = r.lrange("marks", 0, -1)
    # Nothing lost; the long job, cut short once, ran again first and to its end.
    assert marks == [f"start:{long_jid}", f"start:{long_jid}", f"end:{long_jid}", "other-0", "other-1", "other-2"]
    assert not r.exists(K.queue("default"))
    print(f"\nFIGURES TERM during a long job ({fetch}): exit 0 after {took:.2f}s "
          f"(SHUTDOWN_TIMEOUT 0.5s), handed back to the head, run again once, lost 0")


@pytest.mark.parametrize("fetch", FETCH_MODES)
def test_ten_thousand_jobs_on_four_weighted_queues_each_run_exactly_once(tmp_path, r, fetch):
    queues = {"q1": 4, "q2": 3, "q3": 2, "q4": 1}
    per_queue = 2500
    jids: dict[str, str] = {}
    for q in queues:
        for jid in RecordJob.set(queue=q).perform_bulk([["done"]] * per_queue):
            jids[jid] = q
    args = ["-c", "10", "--fetch", fetch]
    for q, weight in queues.items():
        args += ["-q", f"{q},{weight}"]
    started = time.monotonic()
    workers = [worker(tmp_path, *args, name=f"w{i}") for i in range(2)]
    try:
        for w in workers:
            w.wait_ready()
        wait_until(lambda: r.llen("done") >= len(jids), timeout=180, interval=0.2)
        elapsed = time.monotonic() - started
        for w in workers:
            w.term()
        for w in workers:
            assert w.wait(30) == 0
    finally:
        for w in workers:
            w.__exit__(None, None, None)
    done = r.lrange("done", 0, -1)
    assert len(done) == len(set(done)) == len(jids)  # each once: no loss, no duplicate
    assert set(done) == set(jids)
    for q in queues:
        assert not r.exists(K.queue(q))
    assert not r.keys(K.in_progress("*"))
    # The weights are honoured: with as many jobs on each, the heavier queue drains sooner.
    mean_rank = {q: statistics.fmean(i for i, jid in enumerate(done) if jids[jid] == q) for q in queues}
    assert mean_rank["q1"] < mean_rank["q4"], mean_rank
    assert int(r.get(K.stat_processed)) == len(jids)
    print(f"\nFIGURES 10k weighted ({fetch}): {len(jids)} jobs, 2 workers x 10 threads, {elapsed:.1f}s; "
          f"lost 0, duplicates 0; mean completion rank q1..q4: "
          + ", ".join(f"{mean_rank[q]:.0f}" for q in queues))


def test_log_lines_carry_the_jid(tmp_path, r):
    with worker(tmp_path) as w:
        w.wait_ready()
        jid = RecordJob.perform_async("ran")
        wait_until(lambda: r.llen("ran") == 1, timeout=15)
        w.term()
        assert w.wait(30) == 0
    # (testproject's LOGGING shows the job's context: the processor's lines name the job there, once.)
    job = rf"class=testproject\.demo\.jobs\.RecordJob jid={jid} django_cogworker\.engine\.run\.processor"
    assert re.search(rf"{job}: start$", w.log(), re.M)
    assert re.search(rf"{job}: done elapsed=\d+\.\d{{3}}s$", w.log(), re.M)


def test_a_job_s_redis_client_in_the_worker_holds_its_thread_s_own_connection(tmp_path, r):
    # (Checking a connection out of the shared pool and back, per command, cost about a fifth of a
    # small job's command; runtime.own_connection.)
    with worker(tmp_path, "-c", "2") as w:
        w.wait_ready()
        ConnectionJob.perform_bulk([("seen",)] * 6)
        wait_until(lambda: r.llen("seen") == 6, timeout=15)
        w.term()
        assert w.wait(30) == 0
    assert r.lrange("seen", 0, -1) == ["own"] * 6


def test_a_job_the_worker_does_not_know_yet_is_retried_and_runs_once_the_new_code_is_deployed(tmp_path, r):
    # The web code goes out before the workers restart: the job it pushes names a class the running
    # worker lacks. It went straight to dead; it waits in retry with its error instead.
    name = "testproject.demo.jobs.NewlyDeployedJob"
    raw = json.dumps({"jid": "new-1", "class": name, "args": ["ran"], "kwargs": {}, "queue": "default",
                      "retry": 3, "created_at": time.time()})
    with worker(tmp_path, name="old") as old:
        old.wait_ready()
        r.lpush(K.queue("default"), raw)
        wait_until(lambda: r.zcard(K.retry) == 1, timeout=15)
        old.term()
        assert old.wait(30) == 0
    ((entry, score),) = r.zrange(K.retry, 0, -1, withscores=True)
    filed = json.loads(entry)
    assert filed["error_class"] == "django_cogworker.errors.UnknownJobError"
    assert f"no job is registered as {name!r}" in filed["error_message"]
    assert filed["retry_count"] == 0 and score > time.time()
    assert r.zcard(K.dead) == 0 and not r.exists("ran")
    assert re.search(rf"class={re.escape(name)} jid=new-1 \S+processor: fail .*retry 1 in \d+s", old.log())

    r.zadd(K.retry, {entry: time.time()})  # (its backoff has passed)
    with worker(tmp_path, name="new", env={"TESTPROJECT_NEW_CODE": "1"}) as new:
        new.wait_ready()
        wait_until(lambda: r.lrange("ran", 0, -1) == ["new-1"], timeout=15)
        new.term()
        assert new.wait(30) == 0
    assert r.zcard(K.retry) == 0 and r.zcard(K.dead) == 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_second_stop_signal_hands_running_jobs_back_at_once(tmp_path, r, sig):
    # A second Ctrl-C was ignored: the worker waited the whole SHUTDOWN_TIMEOUT.
    env = {"COGWORKER_CONCURRENCY": "2", "COGWORKER_SHUTDOWN_TIMEOUT": "600"}
    with worker(tmp_path, env=env) as w:
        w.wait_ready()
        jids = [SleepJob.perform_async(600, "marks") for _ in range(2)]
        wait_until(lambda: r.llen("marks") == 2, timeout=15)
        w.signal(sig)
        wait_until(lambda: "a second TERM or INT hands them back now" in w.log(), timeout=15)
        assert w.alive  # the first one waits for the jobs
        w.signal(sig)
        assert w.wait(60) == 0  # (well before the 600 s SHUTDOWN_TIMEOUT)
    assert sorted(queued_jids(r)) == sorted(jids)  # handed back, nothing lost
    log = w.log()
    assert "stop signal repeated: handing running jobs back now" in log
    (line,) = [x for x in log.splitlines() if "requeued 2 job(s) unfinished at shutdown" in x]
    assert all(f"jid={jid}" in line for jid in jids)


def test_with_no_logging_configured_a_job_s_own_records_show_with_time_level_class_and_jid(tmp_path, r):
    # runcogworker gave only the django_cogworker logger a handler: the docs' own example (log.info
    # inside perform) printed nothing, and a warning came out bare, through Python's last resort.
    with worker(tmp_path, env={"TESTPROJECT_NO_LOGGING": "1"}) as w:
        w.wait_ready()
        jid = LogJob.perform_async("hello from the job")
        wait_until(lambda: "warning: hello from the job" in w.log(), timeout=15)
        w.term()
        assert w.wait(30) == 0
    context = rf"class=testproject\.demo\.jobs\.LogJob jid={jid}"
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \d+ cogworker-processor-\d+"
    log = w.log()
    assert re.search(rf"^{stamp} INFO {context} testproject\.demo\.jobs: info: hello from the job$", log, re.M)
    assert re.search(rf"^{stamp} WARNING {context} testproject\.demo\.jobs: warning: hello from the job$", log, re.M)
    # The worker's own lines show as before; outside a job, no context.
    assert re.search(r"^\S+ \S+ \d+ MainThread INFO django_cogworker\.engine\.process\.launcher: cogworker .* ready",
                     log, re.M)


def test_the_ready_line_comes_before_the_first_job_s_start_line(tmp_path, r):
    # Jobs waiting at startup had their "start" lines logged before the worker said it was ready.
    for i in range(5):
        RecordJob.perform_async("seen", i)
    with worker(tmp_path) as w:
        w.wait_ready()
        wait_until(lambda: r.llen("seen") == 5, timeout=15, message="the jobs queued before the start")
        w.term()
        assert w.wait(30) == 0
    lines = w.log().splitlines()
    [ready] = [i for i, line in enumerate(lines) if "launcher: cogworker" in line and " ready: " in line]
    starts = [i for i, line in enumerate(lines) if line.endswith("processor: start")]
    assert len(starts) == 5 and ready < min(starts), "\n".join(lines)


def test_a_project_s_logging_shows_the_job_context_through_the_filter(tmp_path, r):
    # testproject's LOGGING: the docs' example, JobContextFilter on the handler.
    with worker(tmp_path) as w:
        w.wait_ready()
        jid = LogJob.perform_async("configured")
        wait_until(lambda: "warning: configured" in w.log(), timeout=15)
        w.term()
        assert w.wait(30) == 0
    assert re.search(rf"INFO pid=\d+ cogworker-processor-\d+ class=testproject\.demo\.jobs\.LogJob jid={jid} "
                     rf"testproject\.demo\.jobs: info: configured$", w.log(), re.M)


# -- expires_in: a job still waiting when it expires never runs (features/expiry/hook.py) -----------------


def test_a_job_that_expired_while_no_worker_ran_is_dropped_unrun_counted_and_logged(tmp_path, r):
    expired = ExpiringJob.set(expires_in=0.5).perform_async("x")
    fresh = ExpiringJob.perform_async("x")  # (30 s: runs, and tells the test the worker fetched)
    time.sleep(1)
    with worker(tmp_path) as w:
        w.wait_ready()
        wait_until(lambda: r.lrange("x:ran", 0, -1) == [fresh] and r.get(K.stat_expired) == "1", timeout=15)
        wait_until(lambda: not any(r.llen(key) for key in r.keys(K.in_progress("*"))), timeout=5,
                   message="the expired one acknowledged")
        w.term()
        assert w.wait(30) == 0
    assert r.lrange("x:ran", 0, -1) == [fresh]
    assert r.zcard(K.retry) == 0 and r.zcard(K.dead) == 0 and r.llen(K.queue("default")) == 0
    assert r.get(K.stat_cancelled) is None
    assert re.search(rf"expired jid={expired} class=testproject\.demo\.flow_jobs\.ExpiringJob: dropped, never run "
                     rf"\(expired [0-9.]+s before it could run\)", w.log())
    assert not re.search(rf"jid={expired} \S+processor: start", w.log()) and "processor: start" in w.log()


def test_a_scheduled_job_expires_counting_from_when_it_is_due(tmp_path, r):
    # Counted from the push it would expire a second before it is due; it runs.
    with worker(tmp_path) as w:
        w.wait_ready()
        jid = ExpiringJob.set(expires_in=1).perform_in(2, "s")
        wait_until(lambda: r.lrange("s:ran", 0, -1) == [jid], timeout=15)
        w.term()
        assert w.wait(30) == 0
    assert r.get(K.stat_expired) is None


def test_a_retrying_job_past_its_expiry_is_dropped_at_its_next_fetch(tmp_path, r):
    with worker(tmp_path) as w:
        w.wait_ready()
        jid = FailJob.set(expires_in=1.5).perform_async("fails once")
        wait_until(lambda: r.zcard(K.retry) == 1, timeout=15, message="its first failure filed for retry")
        [filed] = [json.loads(raw) for raw in r.zrange(K.retry, 0, -1)]
        assert filed["jid"] == jid and filed["retry_count"] == 0
        time.sleep(max(0.0, filed["expires_at"] - time.time()) + 0.2)
        for member in r.zrange(K.retry, 0, -1):
            r.zadd(K.retry, {member: 0}, xx=True)  # (due now, past its expiry: skip the backoff)
        wait_until(lambda: r.get(K.stat_expired) == "1", timeout=15)
        wait_until(lambda: r.zcard(K.retry) == 0 and not any(r.llen(key) for key in r.keys(K.in_progress("*"))),
                   timeout=5)
        w.term()
        assert w.wait(30) == 0
    assert r.zcard(K.dead) == 0 and r.llen(K.queue("default")) == 0
    assert r.get(K.stat_failed) == "1"  # (ran once: the retry never ran)
    assert len(re.findall(rf"jid={jid} \S+processor: fail ", w.log())) == 1
    assert f"expired jid={jid} class=testproject.demo.jobs.FailJob: dropped, never run" in w.log()
