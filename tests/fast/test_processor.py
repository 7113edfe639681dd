"""Processors (engine/run/processor.py): run, settle, survive.

The job's path is tested on a processor called on the test's thread (``make_processor``): a test
pushes a job, the processor takes it with the real fetch, runs it and settles it before it
returns, and the test reads the settlement and Redis's state; no thread, nothing polled. A
processor thread dies only when ``process`` raises, so "the process survives" is ``process``
returning. What is about the threads (a processor that dies is replaced, a job renaming its
thread) and one walk of the whole path through a running Launcher stay at the end, polled.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import re
import sys
import threading
import time
import traceback

import pytest
from asgiref.sync import sync_to_async
from engine_fixtures import (
    RUNS,
    Boom,
    Note,
    fetch_mode_fixture,  # noqa: F401 - the fetch_mode fixture
    launcher_factory_fixture,  # noqa: F401 - the launcher_factory fixture
    make_processor_fixture,  # noqa: F401 - the make_processor fixture
    new_token,
    runs,
)
from helpers import wait_until

from django_cogworker.broker.keys import Keys
from django_cogworker.engine.settle.stats import day_of
from django_cogworker.features import Outcome
from django_cogworker.push import payload as payloads
from django_cogworker.push.job import Job
from testproject.demo.jobs import HugeErrorJob

K = Keys()


class Exits(Job):
    """Calls sys.exit: the job's failure, never the end of the thread running it."""

    retry = 5

    def perform(self, token):
        RUNS[token].append(threading.current_thread().name)
        sys.exit(3)


class NotesBomb(Exception):
    """An exception no traceback printer can format: its ``__notes__`` raises."""

    @property
    def __notes__(self):
        raise RuntimeError("notes can't be read")


class RaisesUnformattable(Job):
    retry = 5

    def perform(self, token):
        RUNS[token].append(self.jid)
        raise NotesBomb("unformattable")


class LeavesAnUnencodablePayload(Job):
    """Puts a datetime in its payload (as a middleware or the job may), then fails."""

    retry = 5

    def perform(self, token):
        RUNS[token].append(self.jid)
        self.payload["context"] = dt.datetime.now()
        raise RuntimeError("failed with a datetime in the payload")


class RetryIn(Job):
    """Fails; its retry_in returns or raises what RETRY_IN[token] says."""

    retry = 5

    def perform(self, token):
        RUNS[token].append(self.jid)
        raise RuntimeError("fails")

    def retry_in(self, count, exc):
        choice = RETRY_IN[self.payload["args"][0]]
        if isinstance(choice, BaseException):
            raise choice
        return choice


RETRY_IN: dict = {}


class AsyncNote(Job):
    """An ``async def perform`` (awaits, then records or raises)."""

    retry = 5

    async def perform(self, token, fail=False):
        await asyncio.sleep(0.01)
        if fail:
            raise RuntimeError("async failure")
        # Thread-sensitive sync code (the ORM) runs on the processor's thread, with its connections.
        RUNS[token].append((self.jid, await sync_to_async(lambda: threading.current_thread().name)()))


class RenamesItsThread(Job):
    def perform(self, token):
        threading.current_thread().name = "renamed-by-the-job"
        RUNS[token].append(self.jid)


# What a Peeks job records while it runs: PEEKS[token]() (what the worker's other threads would see).
PEEKS: dict = {}


class Peeks(Job):
    def perform(self, token):
        RUNS[token].append(PEEKS[token]())


def dead_entries(r):
    return [json.loads(raw) for raw in r.zrange(K.dead, 0, -1)]


def retry_entries(r):
    return [json.loads(raw) for raw in r.zrange(K.retry, 0, -1)]


def outcomes(done):
    """The outcome of each JobRun (None: a payload that couldn't be read, buried in dead)."""
    return [run.decision.outcome if run is not None else None for run in done]


def test_a_job_that_succeeds_is_acked_and_counted(make_processor, fetch_mode, r):
    token = new_token()
    called = make_processor(FETCH=fetch_mode)
    days = {day_of(time.time())}
    pushed = [called.push(Note, token, i) for i in range(3)]

    done = called.drain()

    assert outcomes(done) == [Outcome.SUCCESS] * 3
    assert called.ends() == ["ack"] * 3 and all(run.error is None for run in done)
    assert sorted(runs(token)) == sorted((p["jid"], [i]) for i, p in enumerate(pushed))
    assert called.clear()
    called.flush_stats()
    assert r.get(K.stat_processed) == "3"
    days.add(day_of(time.time()))  # (a run across midnight UTC counts on either day)
    assert sum(int(r.get(K.stat("processed", day)) or 0) for day in days) == 3
    assert r.get(K.stat_failed) is None
    assert r.llen(K.queue("default")) == 0 and r.zcard(K.retry) == 0 and r.zcard(K.dead) == 0


def test_a_job_that_raises_goes_to_retry_with_the_error(make_processor, fetch_mode, r, caplog):
    caplog.set_level(logging.WARNING, logger="django_cogworker")
    token = new_token()
    called = make_processor(FETCH=fetch_mode)
    before = time.time()

    run = called.run(Boom, token, "the printer is on fire")

    assert run.decision.outcome is Outcome.RETRY and str(run.error) == "the printer is on fire"
    assert called.ends() == ["retry"]
    ((raw, score),) = r.zrange(K.retry, 0, -1, withscores=True)
    filed = json.loads(raw)
    assert filed["jid"] == run.payload["jid"] and filed["args"] == run.payload["args"]
    assert filed["retry_count"] == 0
    assert filed["error_class"] == "RuntimeError"
    assert filed["error_message"] == "the printer is on fire"
    assert filed["failed_at"] >= before
    assert score >= filed["failed_at"] + 15  # the first backoff is at least 15 s
    assert runs(token) == [run.payload["jid"]]
    # The log line says where the job went.
    (line,) = [m for m in caplog.messages if m.startswith(f"fail jid={run.payload['jid']}")]
    delay = re.fullmatch(r".*RuntimeError: the printer is on fire \(retry 1 in (\d+)s\)", line).group(1)
    assert 14 <= int(delay) <= 25  # 0**4 + 15 + rand(10), less the moments since
    called.flush_stats()
    assert r.get(K.stat_failed) == "1"
    assert r.get(K.stat_processed) == "1"  # a failure is processed too, as in Sidekiq
    assert called.clear()


def test_an_exception_whose_str_raises_is_filed_and_the_process_keeps_working(make_processor, r):
    token = new_token()
    called = make_processor()
    called.client.push({"jid": "bad-str", "class": "testproject.demo.jobs.BadStrJob", "args": [], "kwargs": {},
                        "queue": "default", "retry": 2})

    assert outcomes([called.run_next(), called.run(Note, token, "after")]) == [Outcome.RETRY, Outcome.SUCCESS]

    assert len(runs(token)) == 1
    (filed,) = retry_entries(r)
    assert filed["jid"] == "bad-str"
    assert filed["error_class"] == "testproject.demo.jobs.BadStrError"
    assert filed["error_message"] == "#<BadStrError>"
    assert called.clear()


MALFORMED = [
    b"{this is not json",
    b"\xff\xfe not utf-8",
    b"[1, 2]",
    b'{"args": []}',
    b'{"class": "x", "args": 1}',
    # Not JSON, though Python reads it: it couldn't be written back to retry when the job failed.
    b'{"jid": "inf", "class": "engine_fixtures.Boom", "args": ["t", Infinity], "kwargs": {}, "queue": "default"}',
]


def test_malformed_payloads_go_to_dead_with_their_text_and_the_process_survives(make_processor, fetch_mode, r):
    token = new_token()
    called = make_processor(FETCH=fetch_mode)
    called.redis.lpush(K.queue("default"), *MALFORMED)
    called.push(Note, token, "after")

    done = called.drain()

    assert outcomes(done) == [None] * len(MALFORMED) + [Outcome.SUCCESS]  # (buried, then the next job ran)
    assert len(runs(token)) == 1
    assert sorted(raw for raw, _how in called.settled[:-1]) == sorted(MALFORMED)
    assert called.ends() == ["dead"] * len(MALFORMED) + ["ack"]
    dead = dead_entries(r)
    assert sorted(d["raw"] for d in dead) == sorted(raw.decode("utf-8", "replace") for raw in MALFORMED)
    assert {d["class"] for d in dead} == {"(unparseable)"}
    assert all(d["error_message"] for d in dead)
    assert called.clear()


UNREGISTERED = ["os.system", "tabnanny.check", "django_cogworker_never_heard_of_it.Job"]


def test_an_unregistered_class_is_retried_then_dead_and_nothing_is_imported(make_processor, fetch_mode, r):
    # Web code deployed before the workers restarted pushes a class they don't know yet: Sidekiq
    # retries it (it runs once they have); it went straight to dead here.
    modules = {name: name.rpartition(".")[0] for name in UNREGISTERED}
    assert "tabnanny" not in sys.modules, "pick a module nothing has imported"
    token = new_token()
    called = make_processor(FETCH=fetch_mode)
    for i, name in enumerate(UNREGISTERED):
        called.client.push({"jid": f"evil-{i}", "class": name, "args": ["touch /tmp/pwned"], "kwargs": {},
                            "queue": "default", "retry": 5})
    called.client.push({"jid": "out-of-retries", "class": UNREGISTERED[0], "args": [], "kwargs": {},
                        "queue": "default", "retry": 0})
    called.push(Note, token, "after")

    done = called.drain()

    assert outcomes(done) == [Outcome.RETRY] * len(UNREGISTERED) + [Outcome.DEAD, Outcome.SUCCESS]
    assert len(runs(token)) == 1
    retried = {d["class"]: d for d in retry_entries(r)}
    assert set(retried) == set(UNREGISTERED)
    for i, name in enumerate(UNREGISTERED):
        assert retried[name]["jid"] == f"evil-{i}" and retried[name]["args"] == ["touch /tmp/pwned"]
        assert retried[name]["error_class"] == "django_cogworker.errors.UnknownJobError"
        assert f"no job is registered as {name!r}" in retried[name]["error_message"]
        assert retried[name]["retry_count"] == 0
    (dead,) = dead_entries(r)
    assert (dead["jid"], dead["error_class"], dead["dead_reason"]) == (
        "out-of-retries", "django_cogworker.errors.UnknownJobError", "retries exhausted")
    assert "tabnanny" not in sys.modules
    assert modules["django_cogworker_never_heard_of_it.Job"] not in sys.modules
    assert called.clear()
    # Counted in the totals, never per class: a name anyone can push would be a series of its own.
    called.flush_stats()
    assert int(r.get(K.stat_processed)) == len(UNREGISTERED) + 2
    assert set(r.hkeys(K.stat_class_processed)) == {Note.name}


def test_an_unknown_job_out_of_retries_frees_its_unique_and_periodic_locks(make_processor, fetch_mode, r):
    called = make_processor(FETCH=fetch_mode)
    # As a periodic until_executed claim would have left them; the unique lock is taken by the push.
    r.set(K.periodic_running("nightly"), "doa-1", ex=600)
    r.set(K.periodic_running("weekly"), "another-run", ex=600)  # not this job's: left alone
    assert called.client.push({"jid": "doa-1", "class": "no.such.Job", "args": [], "kwargs": {},
                               "queue": "default", "retry": 0, "unique_digest": "d1", "unique_for": 600,
                               "periodic_pjid": "nightly"})
    assert called.client.push({"jid": "doa-2", "class": "no.such.Job", "args": [], "kwargs": {},
                               "queue": "default", "retry": 0, "periodic_pjid": "weekly"})
    assert r.exists(K.unique("d1"))

    assert outcomes(called.drain()) == [Outcome.DEAD, Outcome.DEAD]

    assert r.zcard(K.dead) == 2
    assert not r.exists(K.unique("d1")) and not r.exists(K.periodic_running("nightly"))
    assert r.get(K.periodic_running("weekly")) == "another-run"
    assert called.clear()


def test_a_job_calling_sys_exit_is_a_failure_and_its_thread_lives_on(make_processor, fetch_mode, r):
    token = new_token()
    called = make_processor(FETCH=fetch_mode)

    exited = called.run(Exits, token)  # (a SystemExit out of process would end this test, as a thread)
    after = called.run(Note, token, "after")

    assert isinstance(exited.error, SystemExit) and outcomes([exited, after]) == [Outcome.RETRY, Outcome.SUCCESS]
    assert len(runs(token)) == 2
    (filed,) = retry_entries(r)
    assert filed["error_class"] == "SystemExit"
    assert filed["error_message"] == "3"
    assert runs(token)[0] == threading.current_thread().name  # (it ran on the caller's thread)
    assert called.clear()


def test_a_held_job_is_visible_while_it_runs(make_processor, r):
    token = new_token()
    called = make_processor()
    ledger = called.processor.ledger
    PEEKS[token] = lambda: (ledger.busy, [payloads.decode(raw)["jid"] for raw in r.lrange(called.in_progress, 0, -1)])

    run = called.run(Peeks, token)

    # While it ran: counted busy (the heartbeat's figure) and on the in-progress list.
    assert runs(token) == [(1, [run.payload["jid"]])]
    assert called.clear() and ledger.workers_snapshot() == {}


# -- a failure path that fails in turn ---------------------------------------------------------------


def test_an_exception_whose_traceback_cannot_be_formatted_is_filed(make_processor, fetch_mode, r, caplog):
    caplog.set_level(logging.WARNING, logger="django_cogworker")  # a handler that formats tracebacks
    token = new_token()
    called = make_processor(FETCH=fetch_mode)

    run = called.run(RaisesUnformattable, token)
    after = called.run(Note, token, "after")

    assert outcomes([run, after]) == [Outcome.RETRY, Outcome.SUCCESS]
    assert len(runs(token)) == 2
    (filed,) = retry_entries(r)
    assert (filed["jid"], filed["error_class"]) == (run.payload["jid"], "test_processor.NotesBomb")
    assert runs(token)[0] == run.payload["jid"]  # once
    assert called.clear()


@pytest.mark.parametrize("retry_count, retry, expected", [(-2, True, 0), (True, True, 0), ("7", True, 0),
                                                          (10**80, 10**81, 10**80 + 1)],
                         ids=["negative", "bool", "string", "huge"])
def test_an_unreadable_retry_count_is_filed_not_fatal(make_processor, fetch_mode, r, retry_count, retry, expected):
    token = new_token()
    called = make_processor(FETCH=fetch_mode)
    called.client.push({"jid": "odd-count", "class": "engine_fixtures.Boom", "args": [token], "kwargs": {},
                        "queue": "default", "retry": retry, "retry_count": retry_count})

    assert outcomes([called.run_next()]) == [Outcome.RETRY]

    (filed,) = retry_entries(r)
    assert filed["retry_count"] == expected
    (score,) = [s for _raw, s in r.zrange(K.retry, 0, -1, withscores=True)]
    assert time.time() < score < time.time() + 11 * 365 * 86400  # a finite, bounded delay
    assert runs(token) == ["odd-count"]
    assert called.clear()


def test_a_death_handler_raising_system_exit_does_not_cost_the_job_its_filing(make_processor, fetch_mode, r):
    token = new_token()

    def handler(payload, exc):
        raise SystemExit("a death handler that exits")

    called = make_processor(FETCH=fetch_mode, death_handlers=[handler])

    run = called.run(Boom, token, retry=False)
    after = called.run(Note, token, "after")

    assert outcomes([run, after]) == [Outcome.DEAD, Outcome.SUCCESS]
    assert dead_entries(r)[0]["jid"] == run.payload["jid"]
    assert len(runs(token)) == 2
    assert called.clear()


def test_a_failed_job_whose_payload_cannot_be_encoded_goes_to_dead_as_pushed(make_processor, fetch_mode, r):
    token = new_token()
    called = make_processor(FETCH=fetch_mode)
    pushed = called.push(LeavesAnUnencodablePayload, token)

    assert outcomes([called.run_next()]) == [Outcome.DEAD]

    (dead,) = dead_entries(r)
    assert (dead["jid"], dead["args"]) == (pushed["jid"], [token])
    assert "context" not in dead  # as pushed, not as the job left it
    assert dead["error_message"] == "failed with a datetime in the payload"
    assert "could not be filed" in dead["dead_reason"] and "datetime" in dead["dead_reason"]
    assert called.clear()
    assert runs(token) == [pushed["jid"]] and not called.settler.pending_settlements()


@pytest.mark.parametrize("choice", [float("nan"), float("inf"), SystemExit(2), "soon"],
                         ids=["nan", "inf", "system-exit", "word"])
def test_a_retry_in_that_answers_nonsense_gets_the_default_backoff(make_processor, r, choice):
    token = new_token()
    RETRY_IN[token] = choice
    called = make_processor()

    assert outcomes([called.run(RetryIn, token)]) == [Outcome.RETRY]

    (score,) = [s for _raw, s in r.zrange(K.retry, 0, -1, withscores=True)]
    assert time.time() + 5 < score < time.time() + 26  # the default: 0**4 + 15 + rand(10)
    assert called.clear()


def test_an_async_perform_is_awaited_on_its_processor_thread(make_processor, r):
    token = new_token()
    called = make_processor()

    ran = called.run(AsyncNote, token)
    failed = called.run(AsyncNote, token, True)

    assert outcomes([ran, failed]) == [Outcome.SUCCESS, Outcome.RETRY]
    assert runs(token) == [(ran.payload["jid"], threading.current_thread().name)]  # (the caller's: it processed)
    (filed,) = retry_entries(r)
    assert (filed["jid"], filed["error_message"]) == (failed.payload["jid"], "async failure")
    assert called.clear()


def test_a_death_handler_that_spoils_the_payload_of_an_unknown_job_does_not_keep_it_unfiled(make_processor, r):
    def handler(payload, exc):
        payload["seen"] = dt.datetime.now()  # can't be encoded

    called = make_processor(death_handlers=[handler])
    called.client.push({"jid": "unknown-class", "class": "nowhere.Job", "args": [], "kwargs": {},
                        "queue": "default", "retry": 0})

    assert outcomes([called.run_next()]) == [Outcome.DEAD]

    (dead,) = dead_entries(r)
    assert dead["jid"] == "unknown-class" and "seen" not in dead
    assert called.clear()


# -- text a job's failure can't be written with as it is --------------------------------------------


def test_a_jid_or_class_holding_a_line_break_can_not_forge_log_lines(make_processor, r, caplog):
    caplog.set_level(logging.INFO, logger="django_cogworker")
    token = new_token()
    called = make_processor()
    forged = "x\n2026-12-03 20:03:24,803 ERROR pid=1 forged"
    called.client.push({"jid": forged, "class": Boom.name, "args": [token], "kwargs": {}, "queue": "default",
                        "retry": 1})
    called.client.push({"jid": "y", "class": f"no.Such{forged}", "args": [], "kwargs": {}, "queue": "default",
                        "retry": 0})

    assert outcomes(called.drain()) == [Outcome.RETRY, Outcome.DEAD]

    assert r.zcard(K.retry) == 1 and r.zcard(K.dead) == 1
    lines = [m for m in caplog.messages if "forged" in m]
    assert len(lines) >= 4  # start and fail, of each
    assert all("\n" not in m and "x\\n2026-12-03 20:03:24,803 ERROR pid=1 forged" in m for m in lines)
    assert called.clear()


def test_a_10_mb_error_message_is_logged_cut_like_in_its_payload(make_processor, r, caplog):
    caplog.set_level(logging.WARNING, logger="django_cogworker")
    called = make_processor()
    called.client.push({"jid": "huge", "class": HugeErrorJob.name, "args": [10_000_000], "kwargs": {},
                        "queue": "default", "retry": 1})

    assert outcomes([called.run_next()]) == [Outcome.RETRY]

    (filed,) = retry_entries(r)
    assert filed["error_message"] == "x" * payloads.ERROR_MESSAGE_LIMIT
    # It was written whole with its traceback: 10 MB of log per attempt.
    assert len(caplog.text) < 3 * payloads.ERROR_MESSAGE_LIMIT
    (line,) = [m for m in caplog.messages if m.startswith("fail jid=huge")]
    assert "perform" in line and "raise RuntimeError" in line  # its stack is still shown
    assert called.clear()


def test_10_mb_that_are_not_utf8_go_to_dead_without_growing(make_processor, rb):
    called = make_processor()
    raw = b"\xff" * 10_000_000
    rb.lpush(K.queue("default"), raw)

    assert called.run_next() is None  # (buried)

    (dead,) = rb.zrange(K.dead, 0, -1)
    assert len(dead) <= len(raw) + 1000  # each byte shown as U+FFFD made it 31 MB
    entry = json.loads(dead)
    assert (entry["class"], entry["raw_size"]) == ("(unparseable)", len(raw))
    assert "unparseable payload" in entry["dead_reason"]
    assert called.clear()


class CallsThePackage(Job):
    """Fails inside the package, in a call its perform makes (a payload that isn't JSON decoded)."""

    retry = 0

    def perform(self):
        payloads.decode(b"{not json")


def frames(backtrace: list[str]) -> list[str]:
    """The frame lines of a stored backtrace ("File ..., line N, in name"), in order."""
    return [line.strip() for line in backtrace if line.lstrip().startswith("File ")]


def test_a_failure_s_backtrace_and_log_start_at_the_user_s_code_and_its_exception_keeps_every_frame(
        make_processor, r, caplog):
    # The worker's own way to perform (the processor, the hooks, the cancellation feature's around,
    # run_job, call_perform) came first: with backtrace = 5, four of the five frames kept were the
    # package's, and the log's traceback showed eight of them before the user's.
    caplog.set_level(logging.WARNING, logger="django_cogworker")
    handed: list[BaseException] = []
    called = make_processor(death_handlers=[lambda payload, exc: handed.append(exc)])
    boom = called.run(Boom, new_token(), "from perform", backtrace=5)
    inner = called.run(CallsThePackage, backtrace=5)

    assert outcomes([boom, inner]) == [Outcome.RETRY, Outcome.DEAD]
    (retried,), (dead,) = retry_entries(r), dead_entries(r)
    assert retried["jid"] == boom.payload["jid"] and dead["jid"] == inner.payload["jid"]
    (only,) = frames(retried["error_backtrace"])  # (backtrace = 5: the user's frame, none of the package's)
    assert only.startswith('File "') and "engine_fixtures.py" in only and only.endswith("in perform")
    assert retried["error_backtrace"][-1] == "RuntimeError: from perform"
    # A frame of the package inside the user's call stays: where perform called it, then the package's.
    called_at = frames(dead["error_backtrace"][dead["error_backtrace"].index("Traceback (most recent call last):",
                                                                            1):])
    assert "test_processor.py" in called_at[0] and called_at[0].endswith("in perform")
    assert "django_cogworker/push/payload.py" in called_at[1] and called_at[1].endswith("in decode")

    (record,) = [rec for rec in caplog.records if rec.getMessage().startswith("fail") and boom.payload["jid"] in
                 rec.getMessage()]
    shown = logging.Formatter().formatException(record.exc_info)
    assert "django_cogworker" not in shown and "engine_fixtures.py" in shown and "RuntimeError: from perform" in shown
    # The exception itself is untouched: a death handler (or a debugger) sees the worker's frames too.
    (exc,) = handed
    assert exc is inner.error
    assert [(f.name, "processor.py" in f.filename) for f in traceback.extract_tb(exc.__traceback__)][:1] == [
        ("process", True)]
    assert called.clear()


def test_a_failure_with_no_frame_of_the_user_s_keeps_its_whole_backtrace(make_processor, r):
    called = make_processor()
    called.client.push({"jid": "unknown", "class": "testproject.nowhere.Job", "args": [], "kwargs": {},
                        "queue": "default", "retry": 0, "backtrace": True})

    assert outcomes([called.run_next()]) == [Outcome.DEAD]

    (dead,) = dead_entries(r)
    shown = frames(dead["error_backtrace"])
    assert shown[0].endswith("in process") and shown[-1].endswith("in _unknown_job")  # (nothing left out)
    assert called.clear()


# -- the threads: a running Launcher ------------------------------------------------------------------


def settled(running, r):
    """Nothing running, nothing pending, nothing left on the in-progress list."""
    return (not running.manager.busy and not running.manager.pending_settlements()
            and r.llen(running.in_progress) == 0)


def test_a_running_launcher_settles_what_its_processors_run(launcher_factory, fetch_mode, r):
    # The whole path once, its settlements held for the fetch's round trip (the SettlementQueue), which a
    # called processor settles at once: a success acked and counted, a failure in retry, a payload
    # that can't be read in dead, every processor alive.
    token = new_token()
    running = launcher_factory(FETCH=fetch_mode, CONCURRENCY=2)
    processors = list(running.manager.processors)
    pushed = [running.push(Note, token, i) for i in range(3)]
    failed = running.push(Boom, token, "on fire")
    running.redis.lpush(K.queue("default"), MALFORMED[0])

    wait_until(lambda: r.zcard(K.retry) == 1 and r.zcard(K.dead) == 1 and settled(running, r), message="settled")
    assert sorted(map(str, runs(token))) == sorted([*(str((p["jid"], [i])) for i, p in enumerate(pushed)),
                                                   failed["jid"]])
    assert retry_entries(r)[0]["jid"] == failed["jid"] and dead_entries(r)[0]["raw"] == MALFORMED[0].decode()
    running.launcher.stats.flush(running.redis)
    assert (r.get(K.stat_processed), r.get(K.stat_failed)) == ("4", "1")
    assert running.manager.processors == processors and all(p.thread.is_alive() for p in processors)
    assert r.llen(K.queue("default")) == 0


def test_a_processor_that_dies_is_replaced(launcher_factory, fetch_mode, r, monkeypatch):
    token = new_token()
    running = launcher_factory(FETCH=fetch_mode, CONCURRENCY=1)
    (first,) = running.manager.processors
    stats = running.manager.stats
    real_job_done = stats.job_done
    calls = []

    def job_done_with_a_bug(failed, *args):
        calls.append(failed)
        if len(calls) == 1:
            raise RuntimeError("a bug in the processor itself")
        real_job_done(failed, *args)

    monkeypatch.setattr(stats, "job_done", job_done_with_a_bug)
    first_job = running.push(Note, token, 1)
    wait_until(lambda: not first.thread.is_alive(), message="the processor died")
    (replacement,) = wait_until(lambda: [p for p in running.manager.processors if p is not first])

    running.push(Note, token, 2)

    wait_until(lambda: len(runs(token)) == 2)
    assert replacement.thread.is_alive() and replacement.index == first.index
    assert [jid for jid, _ in runs(token)][0] == first_job["jid"]  # it ran once, not again
    wait_until(lambda: settled(running, r))


def test_a_job_that_renames_its_thread_leaves_no_phantom_run(launcher_factory, r):
    token = new_token()
    running = launcher_factory(CONCURRENCY=1)
    (processor,) = running.manager.processors
    running.push(RenamesItsThread, token)

    wait_until(lambda: len(runs(token)) == 1)
    wait_until(lambda: settled(running, r), message="not busy once it finished")
    assert running.manager.workers_snapshot() == {}
    assert processor.thread.name == "cogworker-processor-0"
