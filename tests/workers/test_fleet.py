"""A fleet that runs for months: memory and job caps, rolling restarts (SIGHUP), health probes.

Fast tests first (the settings, the caps' rule, the health verdict and server); then real
supervisors and workers: a leaking job under MAX_MEMORY_MB, MAX_JOBS_PER_PROCESS, a 12 s job
across a HUP, a second HUP during a roll, and the probes through a Redis outage.
"""

from __future__ import annotations

import io
import json
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from helpers import FAST_ENV, RedisServer, Worker, free_port, pid_alive, supervisor, wait_until

from django_cogworker.broker.keys import Keys
from django_cogworker.conf import build_config
from django_cogworker.engine.process.caps import REPLACE_EXIT, Caps
from django_cogworker.engine.process.health import Health, HealthServer, beat_verdict, bind
from django_cogworker.errors import ConfigError
from django_cogworker.metrics.collect import collect
from testproject.demo.fleet_jobs import LeakJob
from testproject.demo.jobs import FileMarkJob, RecordJob

K = Keys()


# -- the settings --------------------------------------------------------------------------------


@pytest.mark.parametrize(("setting", "value", "message"), [
    ("MAX_MEMORY_MB", 0, 'COGWORKER["MAX_MEMORY_MB"] must be a positive integer or None (no cap), got 0'),
    ("MAX_MEMORY_MB", "512", "got '512'"),
    ("MAX_JOBS_PER_PROCESS", -1, 'COGWORKER["MAX_JOBS_PER_PROCESS"] must be a positive integer or None'),
    ("MAX_JOBS_PER_PROCESS", True, "got True"),
    ("ROLLING_TIMEOUT", 0, 'COGWORKER["ROLLING_TIMEOUT"] must be a positive number of seconds'),
    ("ROLLING_TIMEOUT", float("inf"), "or None (no limit), got inf"),
    ("HEALTH_PORT", 70000, 'COGWORKER["HEALTH_PORT"] must be a TCP port (1-65535) or None'),
    ("HEALTH_PORT", "8000", "got '8000'"),
    ("HEALTH_HOST", "", 'COGWORKER["HEALTH_HOST"] must be an address to listen on'),
])
def test_bad_cap_roll_and_health_settings_are_named(setting, value, message):
    with pytest.raises(ConfigError) as info:
        build_config({setting: value})
    assert message in "\n".join(info.value.errors)


def test_caps_and_health_default_to_none_and_take_their_values():
    assert build_config({}).max_memory_mb is None and build_config({}).health_port is None
    cfg = build_config({"MAX_MEMORY_MB": 512, "MAX_JOBS_PER_PROCESS": 1000, "ROLLING_TIMEOUT": 3600,
                        "HEALTH_PORT": 8000, "HEALTH_HOST": "0.0.0.0"})
    assert (cfg.max_memory_mb, cfg.max_jobs_per_process, cfg.rolling_timeout, cfg.health_port, cfg.health_host) == \
        (512, 1000, 3600, 8000, "0.0.0.0")


@pytest.mark.timeout(20)
def test_runcogworker_flags_are_validated_before_anything_starts(r):
    with pytest.raises(CommandError, match=r'COGWORKER\["MAX_MEMORY_MB"\] must be a positive integer'):
        call_command("runcogworker", max_memory_mb=0)
    with pytest.raises(CommandError, match=r'COGWORKER\["MAX_JOBS_PER_PROCESS"\] must be a positive integer'):
        call_command("runcogworker", max_jobs_per_process=-5)
    with pytest.raises(CommandError, match=r'COGWORKER\["HEALTH_PORT"\] must be a TCP port'):
        call_command("runcogworker", health_port=0)
    assert r.dbsize() == 0


@pytest.mark.timeout(20)
def test_a_health_port_in_use_fails_at_startup_naming_the_setting(r):
    taken = bind("127.0.0.1", 0)
    port = taken.server_address[1]
    try:
        with pytest.raises(CommandError, match=rf'COGWORKER\["HEALTH_PORT"\] {port} on COGWORKER\["HEALTH_HOST"\] '
                                               r"'127.0.0.1': .*in use"):
            call_command("runcogworker", health_port=port)
    finally:
        taken.close()
    assert r.dbsize() == 0


# -- the caps' rule and the health verdict ---------------------------------------------------------


def test_caps_say_once_which_cap_was_passed_with_the_figures():
    now, rss = [100.0], [50 * 1024]
    seen = []
    caps = Caps(None, 3, seen.append, rss=lambda: rss[0], clock=lambda: now[0])
    caps.job_started()
    caps.job_started()
    assert seen == []
    now[0] += 7
    caps.job_started()
    caps.job_started()  # (a processor racing past: said once)
    assert [(o.reason, o.jobs, o.rss_mb, o.lived) for o in seen] == [("jobs", 3, 50.0, 7.0)]
    assert "over MAX_JOBS_PER_PROCESS 3: RSS 50.0 MB, 3 job(s) started in 7.0s" in seen[0].describe(None, 3)

    seen.clear()
    caps = Caps(100, None, seen.append, rss=lambda: rss[0], clock=lambda: now[0])
    caps.job_started()
    rss[0] = 101 * 1024
    caps.job_started()  # within MEMORY_EVERY of the last read: not read again
    assert seen == []
    caps.check()  # (each heartbeat)
    assert [(o.reason, o.rss_mb) for o in seen] == [("memory", 101.0)]


def test_alive_while_the_last_beat_or_the_start_is_at_most_two_intervals_old():
    assert beat_verdict(None, started=10.0, now=11.0, interval=1.0) == (True, 1.0)
    assert beat_verdict(None, started=10.0, now=12.5, interval=1.0) == (False, 2.5)
    assert beat_verdict(20.0, started=10.0, now=21.9, interval=1.0)[0] is True
    assert beat_verdict(20.0, started=10.0, now=22.1, interval=1.0)[0] is False


_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # (never an http_proxy of the machine)


def get(port: int, path: str) -> tuple[int, dict]:
    """The status and JSON body of a probe; (0, {}) while nothing listens (a worker still starting)."""
    try:
        with _direct.open(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except urllib.error.URLError:
        return 0, {}


def test_the_health_server_answers_each_probe_from_its_state():
    server = HealthServer("127.0.0.1", 0)
    port = server.server_address[1]
    server.start()
    try:
        assert get(port, "/healthz")[0] == 503 and get(port, "/readyz")[0] == 503  # (no state yet: starting)
        server.state = lambda: Health(True, False, {"state": "quiet"})
        assert get(port, "/healthz") == (200, {"status": "ok", "state": "quiet"})
        assert get(port, "/readyz") == (503, {"status": "failing", "state": "quiet"})
        assert get(port, "/nope")[0] == 404
    finally:
        server.stop()


# -- real processes ---------------------------------------------------------------------------------


def live_children(w, r) -> dict[str, dict]:
    return {i: info for i, info in w.children(r).items() if pid_alive(info["pid"])}


def test_a_leaking_job_under_max_memory_mb_gets_its_processes_replaced_and_runs_each_job_once(tmp_path, r, rb):
    # A fresh worker here takes 50-60 MB; each LeakJob keeps 4 MB more: a process runs a dozen or so.
    with supervisor(tmp_path, "--max-memory-mb", "120", env={"COGWORKER_CONCURRENCY": "2"}) as w:
        wait_until(lambda: len(live_children(w, r)) == 2, timeout=40, message="2 children")
        jids = LeakJob.perform_bulk([["leaks", 4, 0.05]] * 80)
        wait_until(lambda: r.hlen("leaks") == 80, timeout=180, interval=0.2, message="80 leaking jobs run")
        wait_until(lambda: len(live_children(w, r)) == 2, timeout=40, message="the host keeps its 2 processes")
        w.term()
        assert w.wait(30) == 0
    counts = r.hgetall("leaks")
    assert sorted(counts) == sorted(jids) and set(counts.values()) == {"1"}  # every job, each once
    replaced = int(r.hget(K.stat_replaced, "memory") or 0)
    pids = r.smembers("leaks:pids")
    assert replaced >= 2 and len(pids) >= 3
    assert not r.exists(K.queue("default")) and r.zcard(K.dead) == 0 and r.zcard(K.retry) == 0
    log = w.log()
    assert "over MAX_MEMORY_MB 120: RSS" in log
    assert "exited to be replaced (code 75" in log and "starting a fresh one now" in log
    assert "restarting it in" not in log  # (replaced at once, not after a crash's backoff)
    families = {f.name: f for f in collect(redis=rb, keys=K)}
    assert (("", {"reason": "memory"}, replaced) in families["cogworker_replaced_total"].samples)
    print(f"\nFIGURES MAX_MEMORY_MB 120, 4 MB leaked a job, 2 processes -c 2: 80 jobs each run once, "
          f"{replaced} replacements, {len(pids)} processes in all")


def test_max_jobs_per_process_a_lone_worker_exits_75_after_its_jobs_and_the_next_runs_the_rest(tmp_path, r):
    jids = RecordJob.perform_bulk([["ran"]] * 25)
    env = {**FAST_ENV, "COGWORKER_CONCURRENCY": "1", "COGWORKER_PREFETCH": "0"}
    first = Worker("--max-jobs-per-process", "10", env=env, log_path=tmp_path / "first.log")
    try:
        assert first.wait(60) == REPLACE_EXIT
    finally:
        first.kill9()
    assert len(r.lrange("ran", 0, -1)) == 10  # (-c 1, nothing taken ahead: the cap exactly)
    assert r.llen(K.queue("default")) == 15
    assert "over MAX_JOBS_PER_PROCESS 10: RSS" in first.log()
    assert "exiting with code 75 to be replaced (jobs; 10 job(s) started" in first.log()
    # What a process manager does with the exit code: start it again.
    with Worker("--max-jobs-per-process", "10", env=env, log_path=tmp_path / "second.log") as second:
        wait_until(lambda: r.llen("ran") == 20, timeout=40)
        assert second.wait(60) == REPLACE_EXIT
    with Worker(env=env, log_path=tmp_path / "third.log") as third:
        wait_until(lambda: r.llen("ran") == 25, timeout=40)
        third.term()
        assert third.wait(30) == 0
    assert sorted(r.lrange("ran", 0, -1)) == sorted(jids)
    assert r.hget(K.stat_replaced, "jobs") == "2"


def marks(path: Path) -> list[tuple[str, str, int]]:
    """(start|end, jid, pid) lines FileMarkJob wrote."""
    if not path.exists():
        return []
    return [(kind, jid, int(pid)) for kind, jid, pid in (line.split() for line in path.read_text().splitlines())]


def test_a_hup_rolls_the_fleet_a_long_job_finishes_where_it_runs_and_new_jobs_start_at_once(tmp_path, r):
    # -c 1, nothing taken ahead: with both old processes busy, the job pushed after the HUP can only
    # start in a fresh one.
    path = tmp_path / "marks"
    env = {"COGWORKER_CONCURRENCY": "1", "COGWORKER_PREFETCH": "0"}
    with supervisor(tmp_path, env=env) as w:
        old = wait_until(lambda: live_children(w, r) if len(live_children(w, r)) == 2 else None, timeout=40)
        old_pids = {info["pid"] for info in old.values()}
        long_jobs = [FileMarkJob.perform_async(str(path), 12) for _ in range(2)]
        wait_until(lambda: len(marks(path)) == 2, timeout=20, message="both long jobs running")
        w.signal(signal.SIGHUP)
        hup_at = time.monotonic()
        quick = FileMarkJob.perform_async(str(path))
        started = wait_until(lambda: next((m for m in marks(path) if m[:2] == ("start", quick)), None),
                             timeout=30, interval=0.05, message="the job pushed after the HUP started")
        quick_after = time.monotonic() - hup_at
        assert started[2] not in old_pids
        assert not any(kind == "end" for kind, jid, _ in marks(path) if jid in long_jobs)  # (still running)
        new = wait_until(lambda: {i: c for i, c in live_children(w, r).items() if c.get("generation") == 1}
                         if len([c for c in live_children(w, r).values() if c.get("generation") == 1]) == 2
                         else None, timeout=30, message="2 processes of generation 1")
        assert sorted(c["index"] for c in new.values()) == [0, 1]
        wait_until(lambda: not any(pid_alive(pid) for pid in old_pids), timeout=40, message="the old ones exit")
        finished_after = time.monotonic() - hup_at
        table, listed = _cli_processes()
        w.term()
        assert w.wait(30) == 0
    got = marks(path)
    for jid in long_jobs:  # each ran once, start to end in the same (old) process
        runs = [(kind, pid) for kind, j, pid in got if j == jid]
        assert [kind for kind, _ in runs] == ["start", "end"] and runs[0][1] == runs[1][1] in old_pids
    assert not r.exists(K.queue("default")) and r.zcard(K.dead) == 0
    assert r.hget(K.stat_replaced, "rolling") == "2"
    assert "GEN" in table.splitlines()[0].split()
    assert sorted((i["index"], i["generation"]) for i in listed["items"]) == [(0, 1), (1, 1)]
    log = w.log()
    assert "rolling restart: generation 1, 2 fresh process(es)" in log
    assert log.count("a fresh import") == 2 and log.count("retired: exited with code 75") == 2
    print(f"\nFIGURES HUP with a 12 s job running in each of 2 processes: a job pushed after it started "
          f"{quick_after:.2f}s after, in a fresh process; the old ones exited {finished_after:.1f}s after")


def _cli_processes() -> tuple[str, dict]:
    """``manage.py cogworker processes``: its table, and its --json document."""
    table, document = io.StringIO(), io.StringIO()
    call_command("cogworker", "processes", stdout=table)
    call_command("cogworker", "processes", "--json", stdout=document)
    return table.getvalue(), json.loads(document.getvalue())


def test_a_second_hup_during_a_roll_rolls_to_the_newest_and_loses_nothing(tmp_path, r):
    path = tmp_path / "marks"
    env = {"COGWORKER_CONCURRENCY": "1", "COGWORKER_PREFETCH": "0"}
    with supervisor(tmp_path, env=env) as w:
        wait_until(lambda: len(live_children(w, r)) == 2, timeout=40)
        running = FileMarkJob.perform_async(str(path), 6)
        wait_until(lambda: len(marks(path)) == 1, timeout=20)
        w.signal(signal.SIGHUP)
        time.sleep(0.3)  # (the first generation's fresh processes are still importing)
        w.signal(signal.SIGHUP)
        jids = [FileMarkJob.perform_async(str(path)) for _ in range(10)]

        def settled():
            live = live_children(w, r)
            return live if sorted(c.get("generation") for c in live.values()) == [2, 2] else None

        wait_until(settled, timeout=60, message="2 processes of generation 2, and only those")
        wait_until(lambda: sum(kind == "end" for kind, _, _ in marks(path)) == 11, timeout=40)
        w.term()
        assert w.wait(30) == 0
    got = marks(path)
    assert sorted(jid for kind, jid, _ in got if kind == "end") == sorted([running, *jids])
    assert sorted(jid for kind, jid, _ in got if kind == "start") == sorted([running, *jids])  # none twice
    assert "rolling restart: generation 2" in w.log()


@pytest.mark.parametrize("how", ["lone", "supervised"])
def test_health_probes_before_during_and_after_a_redis_outage(tmp_path, how):
    port = free_port()
    args = ["--health-port", str(port), *(["--processes", "2"] if how == "supervised" else [])]
    with RedisServer(tmp_path / "redis") as srv:  # (started by its __enter__)
        with Worker(*args, env={**FAST_ENV, "COGWORKER_REDIS_URL": srv.url}, log_path=tmp_path / "worker.log") as w:
            wait_until(lambda: get(port, "/readyz")[0] == 200, timeout=40, interval=0.1, message="ready")
            code, body = get(port, "/healthz")
            assert code == 200, body
            if how == "supervised":
                assert [p["index"] for p in body["processes"]] == [0, 1]
            srv.stop()
            down_at = time.monotonic()
            wait_until(lambda: get(port, "/healthz")[0] == 503, timeout=20, interval=0.1,
                       message="unhealthy with Redis down")
            unhealthy_after = time.monotonic() - down_at
            srv.restart()
            up_at = time.monotonic()
            wait_until(lambda: get(port, "/healthz")[0] == 200, timeout=30, interval=0.1, message="healthy again")
            healthy_after = time.monotonic() - up_at
            w.signal(signal.SIGTSTP)
            wait_until(lambda: get(port, "/readyz")[0] == 503, timeout=20, interval=0.1,
                       message="not ready once quiet")
            assert get(port, "/healthz")[0] == 200  # (quiet is alive)
            w.term()
            assert w.wait(30) == 0
    print(f"\nFIGURES health ({how}, HEARTBEAT_INTERVAL 0.5): /healthz 503 {unhealthy_after:.2f}s after Redis "
          f"stopped, 200 again {healthy_after:.2f}s after it restarted")
