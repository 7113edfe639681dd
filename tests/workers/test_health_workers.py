"""The health probes of real workers and supervisors, under a hostile client, a Redis outage and a
slow feature chore (issue 43 points 1 and 6).

* A client that sends its request one header line at a time holds up nothing: other probes
  answer, a child killed -9 is reaped and replaced, a TERM is acted on, all while it dribbles.
* /readyz follows the worker's reach to Redis: non-200 while its own redis-server is killed or
  frozen (SIGSTOP), 200 again once it is back.
* A feature chore slower than ORPHAN_THRESHOLD delays neither the beats (no other worker takes
  the process for dead and runs its jobs again) nor readiness.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from helpers import DEFAULT_PREFIX, FAST_ENV, RedisServer, Worker, free_port, pid_alive, wait_until, worker
from test_fleet import marks
from test_health import Dribbler, probe

from testproject.demo.jobs import FileMarkJob


def reaped(pid: int) -> bool:
    """Gone for good: not even a zombie waiting for its parent's waitpid."""
    return not os.path.exists(f"/proc/{pid}")


def live_indexes(w: Worker, r) -> dict[int, int]:
    """Index -> pid of the supervisor's children that run now."""
    return {info["index"]: info["pid"] for info in w.children(r).values() if pid_alive(info["pid"])}


def test_a_dribbling_client_holds_up_no_probe_no_reap_and_no_term_of_the_supervisor(tmp_path, r):
    # It used to: the supervisor served probes on its loop, 2 s per read. A child killed -9
    # stayed a zombie 28 s, a TERM was acted on 25 s late, every other probe timed out.
    port = free_port()
    with worker(tmp_path, "-c", "3", "--processes", "2", "--health-port", str(port), name="supervisor") as w:
        wait_until(lambda: probe(port, "/readyz").status == 200, timeout=60, interval=0.2, message="ready")
        with Dribbler(port) as slow:
            wait_until(slow.mid_request, timeout=10, message="the slow client in the middle of its request")
            request = slow.connections
            answers = [probe(port).status for _ in range(5)]
            assert slow.connections == request  # (premise: it was still sending that request meanwhile)
            assert answers == [200] * 5

            children = wait_until(lambda: len(live_indexes(w, r)) == 2 and live_indexes(w, r), timeout=30)
            victim = children[0]
            os.kill(victim, signal.SIGKILL)
            wait_until(lambda: reaped(victim), timeout=10, interval=0.1, message="the killed child reaped")
            wait_until(lambda: live_indexes(w, r).get(0) not in (None, victim), timeout=60, interval=0.2,
                       message="a fresh process in its slot")
            assert slow.mid_request() or slow.connections > request  # (premise: still dribbling)

            w.term()
            wait_until(lambda: "stopping: TERM to" in w.log(), timeout=10, interval=0.1, message="the TERM acted on")
            assert slow.mid_request() or slow.connections > request
            assert w.wait(30) == 0
    assert "Traceback" not in w.log()


@pytest.mark.parametrize("how", ["lone-kill", "supervised-stop"])
def test_readyz_follows_the_reach_to_redis(tmp_path, how):
    # /readyz answered 200 through a whole Redis outage: ready meant started and not quiet.
    port = free_port()
    args = ["--health-port", str(port), *(["--processes", "2"] if how.startswith("supervised") else [])]
    with RedisServer(tmp_path / "redis") as srv:
        with Worker(*args, env={**FAST_ENV, "COGWORKER_REDIS_URL": srv.url}, log_path=tmp_path / "worker.log") as w:
            wait_until(lambda: probe(port, "/readyz").status == 200, timeout=60, interval=0.2, message="ready")
            frozen = srv.pid
            try:
                if how.endswith("kill"):
                    srv.kill()
                else:
                    os.kill(frozen, signal.SIGSTOP)
                away = time.monotonic()
                wait_until(lambda: probe(port, "/readyz").status == 503, timeout=30, interval=0.1,
                           message="not ready with Redis away")
                unready_after = time.monotonic() - away
                assert probe(port, "/readyz").status == 503  # (stays so)
            finally:
                if how.endswith("kill"):
                    srv.restart()
                else:
                    os.kill(frozen, signal.SIGCONT)
                back = time.monotonic()
            answer = wait_until(lambda: (a := probe(port, "/readyz")).status == 200 and a, timeout=60, interval=0.1,
                                message="ready again with Redis back")
            ready_after = time.monotonic() - back
            assert answer.body["state"] == "running"
            w.term()
            assert w.wait(30) == 0
    print(f"\nFIGURES readyz ({how}, HEARTBEAT_INTERVAL 0.5): 503 {unready_after:.2f}s after Redis went away, "
          f"200 again {ready_after:.2f}s after it was back")


def test_a_feature_chore_slower_than_the_orphan_threshold_delays_neither_beats_nor_readiness(tmp_path, r):
    # A chore that slept 40 s: the process missed its beats, another worker recovered its 5 running
    # jobs and all ran twice; slow on the first beat, it delayed readiness 40 s.
    threshold = float(FAST_ENV["COGWORKER_ORPHAN_THRESHOLD"])
    started, done = DEFAULT_PREFIX + "slow-chore:started", DEFAULT_PREFIX + "slow-chore:done"
    path, port = tmp_path / "marks", free_port()
    env = {"COGWORKER_FEATURES": "testproject.demo.slow_chore.slow_chore", "COGWORKER_SLOW_CHORE_SECONDS": "20"}
    with worker(tmp_path, "-c", "5", "--health-port", str(port), name="slow", env=env) as slow:
        wait_until(lambda: probe(port, "/readyz").status == 200, timeout=60, interval=0.1, message="ready")
        assert r.get(done) is None  # ready before the first round of the chore ended
        wait_until(lambda: r.get(started), timeout=20, message="the chore under way")  # (premise)
        jids = [FileMarkJob.perform_async(str(path), threshold * 8) for _ in range(5)]
        wait_until(lambda: len(marks(path)) == 5, timeout=30, message="the 5 jobs running")
        with worker(tmp_path, name="other") as other:
            other.wait_ready(timeout=60)
            assert not any(kind == "end" for kind, _, _ in marks(path))  # (premise: up while they run)
            wait_until(lambda: sum(kind == "end" for kind, _, _ in marks(path)) >= 5, timeout=60,
                       message="the 5 jobs done")
            # (premise: the chore's rounds, each longer than the threshold, ran back to back all along)
            assert int(r.get(started)) > int(r.get(done) or 0) and 20 > threshold
            slow.term()
            assert slow.wait(30) == 0
            other.term()
            assert other.wait(30) == 0
    got = marks(path)
    assert sorted(jid for kind, jid, _ in got if kind == "start") == sorted(jids)  # each once
    assert {pid for _, _, pid in got} == {slow.pid}
    assert "without a beat" not in slow.log()
