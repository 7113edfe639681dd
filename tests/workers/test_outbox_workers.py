"""The outbox with real workers, on SQLite and PostgreSQL: every committed job runs exactly once and
no rolled-back one ever does, through Redis outages, relays killed -9 and relays racing.

Jobs are RecordJob: each run RPUSHes its jid to a list, so runs are counted per jid. A "relay"
worker fetches from a queue nothing is pushed to (``-q idle``): it only relays, and killing it -9
can't run a job twice through the in-progress recovery of reliable fetch (not the outbox's doing).

Here, the tests that run a real worker process; the in-process ones are in tests/fast/test_outbox.py.
"""

from __future__ import annotations

import collections
import contextlib
import json

import pytest
from django.db import connections, transaction
from helpers import RedisServer, free_port, wait_until, worker
from outbox_fixtures import Boom, alias_fixture, silent_port  # noqa: F401 - a fixture

from django_cogworker import Batch, chain, group
from django_cogworker.broker.keys import Keys
from django_cogworker.outbox import relay
from django_cogworker.outbox.models import OutboxJob
from django_cogworker.outbox.store import CLAIM
from django_cogworker.push import runtime
from testproject.demo.jobs import BatchCallbackJob, FileMarkJob, RecordJob

K = Keys()
RUNS = "runs"
pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg", "mysql"])


@pytest.fixture
def srv(settings, tmp_path):
    """A Redis of the test's own (appendonly: what it acknowledged survives kill -9), and OUTBOX on
    in this process, pushing to it."""
    server = RedisServer(tmp_path / "redis", appendonly=True).start()
    settings.COGWORKER = {**settings.COGWORKER, "OUTBOX": True, "REDIS_URL": server.url,
                          "REDIS_OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 2}}
    yield server
    runtime.reset()
    server.cleanup()


def database_url(alias: str) -> str:
    """The URL of ``alias``'s test database, for a worker's settings."""
    s = connections[alias].settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    if s["ENGINE"].endswith("mysql"):
        return f"mysql://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 3306}/{s['NAME']}"
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def outbox_worker(tmp_path, srv, name, *args, outbox=True, pg=None):
    """A worker on ``srv`` and the test databases, with OUTBOX on (its relay relays both) or off
    (it only runs jobs). ``pg``: the URL its "pg" database is at, instead of the test's."""
    env = {"COGWORKER_REDIS_URL": srv.url, "COGWORKER_OUTBOX": str(outbox).lower(),
           "DATABASE_URL": database_url("default"), "COGWORKER_TEST_POSTGRES_URL": pg or database_url("pg"),
           "COGWORKER_TEST_MYSQL_URL": database_url("mysql")}
    return worker(tmp_path, *args, name=name, env=env)


@contextlib.contextmanager
def deletes_held(alias: str):
    """Within: a relay's delete of outbox rows doesn't go through, after its push did.

    PostgreSQL: this test holds the table in SHARE mode, which a relay's SELECT ... FOR UPDATE
    (ROW SHARE) passes and its DELETE (ROW EXCLUSIVE) waits for: the relay stops between its push
    and its delete, for as long as the block lasts. SQLite, whose writers wait on one lock (the
    claim's too): a trigger makes the delete fail, and the relay's claim keeps the rows it pushed.
    MariaDB/MySQL (whose table locks would stop the relay's SELECT ... FOR UPDATE too): a trigger
    makes the delete fail, which rolls the relay's round back; its next round takes the same rows,
    and finds them pushed (their marks).
    """
    with connections[alias].cursor() as cursor:
        if alias == "pg":
            with transaction.atomic(using=alias):
                cursor.execute("LOCK TABLE cogworker_outbox IN SHARE MODE")
                yield
            return
        if alias == "mysql":
            cursor.execute("CREATE TRIGGER test_no_delete BEFORE DELETE ON cogworker_outbox FOR EACH ROW "
                           "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'held by the test'")
            try:
                yield
            finally:
                cursor.execute("DROP TRIGGER test_no_delete")
            return
        cursor.execute("CREATE TRIGGER test_no_delete BEFORE DELETE ON cogworker_outbox "
                       "BEGIN SELECT RAISE(ABORT, 'held by the test'); END")
        try:
            yield
        finally:
            cursor.execute("DROP TRIGGER test_no_delete")


def waiting(alias: str) -> int:
    """Jobs waiting in ``alias``'s outbox (a row holds the jobs of one push)."""
    return relay.waiting(alias)[0]


def runs(srv) -> collections.Counter:
    client = srv.client(decode_responses=True)
    try:
        return collections.Counter(client.lrange(RUNS, 0, -1))
    finally:
        client.close()


def assert_exactly_once(srv, committed, rolled_back=(), timeout=90):
    """Every ``committed`` jid runs, each once; none of ``rolled_back`` ever does."""
    wait_until(lambda: set(runs(srv)) >= set(committed), timeout=timeout,
               message=f"the {len(committed)} committed jobs run")
    counted = runs(srv)
    assert {jid: n for jid, n in counted.items() if n != 1} == {}
    assert set(counted) == set(committed)
    assert not set(rolled_back) & set(counted)


def backlog(alias: str, srv, count: int) -> list[str]:
    """``count`` committed jobs waiting in ``alias``'s outbox: pushed while Redis is away, in rows
    of 100 (a push's row; a relay's round takes 500 jobs: five rows)."""
    srv.kill()
    jids: list[str] = []
    with transaction.atomic(using=alias):
        for start in range(0, count, 100):
            jids += RecordJob.perform_bulk([(RUNS,)] * min(100, count - start))
    srv.restart()
    assert waiting(alias) == count
    return jids


def started(path) -> collections.Counter:
    """How many times each jid started, from a FileMarkJob file (only whole lines: the last may be
    a write under way)."""
    lines = path.read_text().split("\n")[:-1] if path.exists() else []
    return collections.Counter(line.split()[1] for line in lines if line.startswith("start "))


def test_redis_stopped_while_transactions_commit_then_restarted(tmp_path, srv, alias):
    """Jobs are FileMarkJob, which record in a file and touch no Redis. RecordJob's RPUSH to the
    Redis this test kills -9 could land with its reply lost (Redis writes the AOF, then fsyncs,
    then replies: a kill during a slow fsync keeps the write): the job raised ConnectionError and
    its retry recorded it again: a job that raised, run twice as at-least-once says, not the outbox
    pushing it twice (the AOFs of loaded runs show each job pushed once, and jobs whose RPUSH the
    kill cut off filed for retry)."""
    committed, rolled_back = [], []
    path = tmp_path / "marks"

    def commit_some(n):
        for _ in range(n):
            with transaction.atomic(using=alias):
                committed.append(FileMarkJob.perform_async(str(path)))
            with pytest.raises(Boom), transaction.atomic(using=alias):
                rolled_back.append(FileMarkJob.perform_async(str(path)))
                raise Boom

    with outbox_worker(tmp_path, srv, "w") as w:
        w.wait_ready()
        commit_some(10)
        srv.kill()
        commit_some(10)  # (each commit goes through; its job waits in the outbox)
        assert waiting(alias) == 10
        srv.restart()
        commit_some(10)
        wait_until(lambda: set(started(path)) >= set(committed), timeout=90, message="the 30 committed jobs run")
        wait_until(lambda: waiting(alias) == 0, timeout=30, message="the outbox emptied")
        counted = started(path)
        assert {jid: n for jid, n in counted.items() if n != 1} == {}
        assert set(counted) == set(committed) and not set(rolled_back) & set(counted)
        assert "wait in the outbox" not in w.log()  # (that is the pushing process's line, not the worker's)


def test_pushes_outside_transactions_while_redis_is_down_run_once_it_is_back(tmp_path, srv):
    with outbox_worker(tmp_path, srv, "w") as w:
        w.wait_ready()
        srv.kill()
        jids = [RecordJob.perform_async(RUNS) for _ in range(10)] + RecordJob.perform_bulk([(RUNS,)] * 10)
        assert waiting("default") == 20
        srv.restart()
        assert_exactly_once(srv, jids)
        wait_until(lambda: waiting("default") == 0, timeout=30, message="the outbox emptied")


def test_a_relay_killed_9_between_its_push_and_its_delete_runs_each_job_once(tmp_path, srv, alias):
    jids = backlog(alias, srv, 1200)
    with outbox_worker(tmp_path, srv, "runner", outbox=False) as runner:
        runner.wait_ready()
        with deletes_held(alias), outbox_worker(tmp_path, srv, "relay", "-q", "idle") as relay:
            relay.wait_ready()
            # Its first round's 500 jobs pushed (and run), their rows not deleted: kill it there.
            wait_until(lambda: len(runs(srv)) >= 500, timeout=60, message="the relay's first push")
            relay.kill9()
            assert relay.wait(10) == -9
        # (At least its first round; on SQLite, whose failed delete doesn't stop the relay, maybe
        # part of the next one too, before the kill landed.) Each once, and no row deleted.
        ran = runs(srv)
        assert len(ran) >= 500 and set(ran.values()) == {1}
        assert waiting(alias) == 1200
        # (SQLite: the dead relay's claim runs out, as it does CLAIM seconds on.)
        OutboxJob.objects.using(alias).update(claimed_until=0)
        with outbox_worker(tmp_path, srv, "next", "-q", "idle") as following:
            following.wait_ready()
            assert_exactly_once(srv, jids)
            wait_until(lambda: waiting(alias) == 0, timeout=30, message="the outbox emptied")
            # (Every job the killed relay pushed: its first round's 500, on SQLite maybe more; each is
            # found by its mark and not pushed again, which assert_exactly_once saw.)
            wait_until(lambda: following.log().count("handed to Redis before") >= 500, timeout=30,
                       message="the 500 jobs pushed before found by their marks")


def test_relays_killed_9_while_relaying_a_large_backlog_run_each_job_once(tmp_path, srv, alias):
    jids = backlog(alias, srv, 6000)
    with outbox_worker(tmp_path, srv, "runner", outbox=False) as runner:
        runner.wait_ready()
        for i in range(3):  # (each killed at another point of its work: between a push and its delete, some)
            with outbox_worker(tmp_path, srv, f"relay{i}", "-q", "idle") as relay:
                relay.wait_ready()
                left = waiting(alias)
                wait_until(lambda left=left, i=i: waiting(alias) < left - 500 * (i + 1) or waiting(alias) == 0,
                           timeout=60, message="the relay under way")
                relay.kill9()
                assert relay.wait(10) == -9
        with outbox_worker(tmp_path, srv, "last", "-q", "idle") as last:
            last.wait_ready()
            assert_exactly_once(srv, jids, timeout=180)
            # (On SQLite, rows a killed relay had claimed wait out its claim, CLAIM seconds, before
            # the last relay deletes them: their jobs ran already, found by their marks.)
            wait_until(lambda: waiting(alias) == 0, timeout=CLAIM + 30, message="the outbox emptied")


def test_two_relays_racing_over_one_backlog_run_each_job_once(tmp_path, srv, alias):
    jids = backlog(alias, srv, 5000)
    with outbox_worker(tmp_path, srv, "a") as a, outbox_worker(tmp_path, srv, "b") as b:
        a.wait_ready()
        b.wait_ready()
        assert_exactly_once(srv, jids, timeout=180)
        wait_until(lambda: waiting(alias) == 0, timeout=30, message="the outbox emptied")


def test_a_garbage_row_goes_to_dead_and_the_rows_behind_it_run(tmp_path, srv, alias):
    srv.kill()
    with transaction.atomic(using=alias):
        before = RecordJob.perform_async(RUNS)
        OutboxJob.objects.using(alias).create(jid="garbage", payload="[1, 2", created=0)
        after = RecordJob.perform_bulk([(RUNS,)] * 5)
    srv.restart()
    with outbox_worker(tmp_path, srv, "w") as w:
        w.wait_ready()
        assert_exactly_once(srv, [before, *after])
        wait_until(lambda: waiting(alias) == 0, timeout=30, message="the outbox emptied")
    client = srv.client()
    (dead,) = [json.loads(raw) for raw in client.zrange(K.dead, 0, -1)]
    client.close()
    assert "jid garbage" in dead["dead_reason"] and dead["raw"] == "[1, 2"


def test_batches_and_workflows_committed_while_redis_is_away_run_once_with_their_callbacks_once(
        tmp_path, srv, alias):
    def callbacks() -> collections.Counter:
        client = srv.client(decode_responses=True)
        try:
            return collections.Counter((json.loads(raw)["event"], json.loads(raw)["bid"])
                                       for raw in client.lrange("cb", 0, -1))
        finally:
            client.close()

    with outbox_worker(tmp_path, srv, "a") as a, outbox_worker(tmp_path, srv, "b") as b:  # (two relays racing)
        a.wait_ready()
        b.wait_ready()
        srv.kill()
        committed, rolled_back, batches = [], [], []
        for i in range(3):
            batch = Batch(f"batch {i}")
            batch.on("complete", BatchCallbackJob, key="cb").on("success", BatchCallbackJob, key="cb")
            with transaction.atomic(using=alias):
                with batch.jobs():
                    committed += [RecordJob.perform_async(RUNS), *RecordJob.perform_bulk([(RUNS,)] * 20)]
                flow = chain(RecordJob.s(RUNS, f"c1-{i}"), group(RecordJob.s(RUNS, f"g1-{i}"),
                                                                   RecordJob.s(RUNS, f"g2-{i}")),
                             RecordJob.s(RUNS, f"c3-{i}")).on("success", BatchCallbackJob, key="cb").perform_async()
                committed += [f"c1-{i}", f"g1-{i}", f"g2-{i}", f"c3-{i}"]
            batches += [("complete", batch.bid), ("success", batch.bid), ("success", flow.bid)]
            with pytest.raises(Boom), transaction.atomic(using=alias):
                with Batch("rolled back").jobs():
                    rolled_back.append(RecordJob.perform_async(RUNS))
                chain(RecordJob.s(RUNS, f"x-{i}")).perform_async()
                rolled_back.append(f"x-{i}")
                raise Boom
        assert waiting(alias) == 6  # (one row per top-level block: each batch's, each workflow's)
        srv.restart()
        assert_exactly_once(srv, committed, rolled_back)
        wait_until(lambda: sum(callbacks().values()) >= len(batches), timeout=60, message="the callbacks")
        wait_until(lambda: waiting(alias) == 0, timeout=30, message="the outbox emptied")
        assert callbacks() == collections.Counter(batches)


def waiting_row(alias: str) -> str:
    """A committed job's row in ``alias``'s outbox, as its pusher died before pushing it; its jid."""
    payload = RecordJob.set(queue="default").build([RUNS], {})
    OutboxJob.objects.using(alias).create(jid=payload["jid"], payload=json.dumps(payload), created=0)
    return payload["jid"]


def test_an_outbox_database_refusing_connections_is_a_warning_and_the_others_rows_are_relayed(tmp_path, srv):
    """Its port closed: the system check was an error (cogworker.E010) and runcogworker refused to start."""
    jid = waiting_row("default")
    with outbox_worker(tmp_path, srv, "w", pg=f"postgres://postgres@127.0.0.1:{free_port()}/cogworker") as w:
        w.wait_ready()
        assert_exactly_once(srv, [jid])
        wait_until(lambda: "outbox relay (pg): the database is unreachable" in w.log(), timeout=30,
                   message="the relay's line about pg")
        # (Its row deleted once pushed, while the worker runs: the job can run before the relay's
        # delete, and the worker's exit is a kill -9, which would leave the row for the next relay.)
        wait_until(lambda: waiting("default") == 0, timeout=30, message="the relayed row deleted")
    assert "(cogworker.W011) " in w.log() and "database 'pg' is unreachable" in w.log()


def test_an_outbox_database_that_never_answers_holds_back_no_other_databases_rows_nor_the_stop(tmp_path, srv):
    """Its host accepts and never answers. With the checks skipped (the check's own wait:
    test_outbox_ops.py), the one relay thread hung on it: rows of "default" waited for ever, and a
    TERM reached the fetch 30 s late (the relay's stop waited for it first)."""
    first = waiting_row("default")
    with silent_port() as port, outbox_worker(tmp_path, srv, "w", "--skip-checks",
                                              pg=f"postgres://postgres@127.0.0.1:{port}/cogworker") as w:
        w.wait_ready()
        assert_exactly_once(srv, [first])
        # (pg's relay gives up connecting, says so, and tries again: its rows wait, no one else's do.)
        wait_until(lambda: "outbox relay (pg): the database is unreachable" in w.log(), timeout=60,
                   message="pg's connect given up")
        second = waiting_row("default")
        assert_exactly_once(srv, [first, second])
        w.term()
        # (SHUTDOWN_TIMEOUT is 5 s, the relay's wait for its threads 5 s: the old 30 s wait is past both.)
        assert w.wait(25) == 0
    log = w.log()
    quiet = log.index("quiet: no new jobs will be fetched")  # (the fetch stopped first, then the relay)
    assert log.index("shutting down") < quiet
    assert "still in a round" not in log or quiet < log.index("still in a round")
