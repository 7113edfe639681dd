"""Processors (engine/run/processor.py) through a real in-process Launcher: run, settle, survive."""

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
    GATES,
    RUNS,
    Boom,
    Hold,
    Note,
    launcher_factory_fixture,  # noqa: F401 - the launcher_factory fixture
    new_token,
    runs,
)
from helpers import wait_until

from django_cogworker.broker.keys import Keys
from django_cogworker.engine.settle.stats import day_of
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


@pytest.fixture(params=["reliable", "basic"])
def fetch_mode(request):
    return request.param


def dead_entries(r):
    return [json.loads(raw) for raw in r.zrange(K.dead, 0, -1)]


def retry_entries(r):
    return [json.loads(raw) for raw in r.zrange(K.retry, 0, -1)]


def settled(running, r):
    """Nothing running, nothing pending, nothing left on the in-progress list."""
    return (not running.manager.busy and not running.manager.pending_settlements()
            and r.llen(running.in_progress) == 0)


def test_a_job_that_succeeds_is_acked_and_counted(launcher_factory, fetch_mode, r):
    token = new_token()
    running = launcher_factory(FETCH=fetch_mode)
    days = {day_of(time.time())}

    pushed = [running.push(Note, token, i) for i in range(3)]

    wait_until(lambda: len(runs(token)) == 3)
    assert sorted(runs(token)) == sorted((p["jid"], [i]) for i, p in enumerate(pushed))
    wait_until(lambda: r.get(K.stat_processed) == "3", message="processed count flushed")
    days.add(day_of(time.time()))  # (a run across midnight UTC counts on either day)
    assert sum(int(r.get(K.stat("processed", day)) or 0) for day in days) == 3
    assert r.get(K.stat_failed) is None
    wait_until(lambda: settled(running, r))
    assert r.llen(K.queue("default")) == 0 and r.zcard(K.retry) == 0 and r.zcard(K.dead) == 0


def test_a_job_that_raises_goes_to_retry_with_the_error(launcher_factory, fetch_mode, r, caplog):
    caplog.set_level(logging.WARNING, logger="django_cogworker")
    token = new_token()
    running = launcher_factory(FETCH=fetch_mode)
    before = time.time()

    pushed = running.push(Boom, token, "the printer is on fire")

    wait_until(lambda: r.zcard(K.retry) == 1)
    ((raw, score),) = r.zrange(K.retry, 0, -1, withscores=True)
    filed = json.loads(raw)
    assert filed["jid"] == pushed["jid"] and filed["args"] == pushed["args"]
    assert filed["retry_count"] == 0
    assert filed["error_class"] == "RuntimeError"
    assert filed["error_message"] == "the printer is on fire"
    assert filed["failed_at"] >= before
    assert score >= filed["failed_at"] + 15  # the first backoff is at least 15 s
    assert runs(token) == [pushed["jid"]]
    # The log line says where the job went.
    (line,) = [m for m in caplog.messages if m.startswith(f"fail jid={pushed['jid']}")]
    delay = re.fullmatch(r".*RuntimeError: the printer is on fire \(retry 1 in (\d+)s\)", line).group(1)
    assert 14 <= int(delay) <= 25  # 0**4 + 15 + rand(10), less the moments since
    wait_until(lambda: r.get(K.stat_failed) == "1")
    assert r.get(K.stat_processed) == "1"  # a failure is processed too, as in Sidekiq
    wait_until(lambda: settled(running, r))


def test_an_exception_whose_str_raises_is_filed_and_the_process_keeps_working(launcher_factory, r):
    token = new_token()
    running = launcher_factory(CONCURRENCY=1)

    running.client.push({"jid": "bad-str", "class": "testproject.demo.jobs.BadStrJob", "args": [], "kwargs": {},
                         "queue": "default", "retry": 2})
    wait_until(lambda: r.zcard(K.retry) == 1)
    running.push(Note, token, "after")

    wait_until(lambda: len(runs(token)) == 1)
    (filed,) = retry_entries(r)
    assert filed["jid"] == "bad-str"
    assert filed["error_class"] == "testproject.demo.jobs.BadStrError"
    assert filed["error_message"] == "#<BadStrError>"
    wait_until(lambda: settled(running, r))


MALFORMED = [
    b"{this is not json",
    b"\xff\xfe not utf-8",
    b"[1, 2]",
    b'{"args": []}',
    b'{"class": "x", "args": 1}',
    # Not JSON, though Python reads it: it couldn't be written back to retry when the job failed.
    b'{"jid": "inf", "class": "engine_fixtures.Boom", "args": ["t", Infinity], "kwargs": {}, "queue": "default"}',
]


def test_malformed_payloads_go_to_dead_with_their_text_and_the_process_survives(launcher_factory, fetch_mode, r):
    token = new_token()
    running = launcher_factory(FETCH=fetch_mode, CONCURRENCY=1)

    running.redis.lpush(K.queue("default"), *MALFORMED)
    running.push(Note, token, "after")

    wait_until(lambda: len(runs(token)) == 1, message="the next job ran")
    wait_until(lambda: r.zcard(K.dead) == len(MALFORMED))
    dead = dead_entries(r)
    assert sorted(d["raw"] for d in dead) == sorted(raw.decode("utf-8", "replace") for raw in MALFORMED)
    assert {d["class"] for d in dead} == {"(unparseable)"}
    assert all(d["error_message"] for d in dead)
    assert all(p.thread.is_alive() for p in running.manager.processors)
    wait_until(lambda: settled(running, r))


UNREGISTERED = ["os.system", "tabnanny.check", "django_cogworker_never_heard_of_it.Job"]


def test_an_unregistered_class_is_retried_then_dead_and_nothing_is_imported(launcher_factory, fetch_mode, r):
    # Web code deployed before the workers restarted pushes a class they don't know yet: Sidekiq
    # retries it (it runs once they have); it went straight to dead here.
    modules = {name: name.rpartition(".")[0] for name in UNREGISTERED}
    assert "tabnanny" not in sys.modules, "pick a module nothing has imported"
    token = new_token()
    running = launcher_factory(FETCH=fetch_mode, CONCURRENCY=1)

    for i, name in enumerate(UNREGISTERED):
        running.client.push({"jid": f"evil-{i}", "class": name, "args": ["touch /tmp/pwned"], "kwargs": {},
                             "queue": "default", "retry": 5})
    running.client.push({"jid": "out-of-retries", "class": UNREGISTERED[0], "args": [], "kwargs": {},
                         "queue": "default", "retry": 0})
    running.push(Note, token, "after")

    wait_until(lambda: len(runs(token)) == 1)
    wait_until(lambda: r.zcard(K.retry) == len(UNREGISTERED) and r.zcard(K.dead) == 1)
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
    wait_until(lambda: settled(running, r))
    # Counted in the totals, never per class: a name anyone can push would be a series of its own.
    running.launcher.stats.flush(running.redis)
    assert int(r.get(K.stat_processed)) == len(UNREGISTERED) + 2
    assert set(r.hkeys(K.stat_class_processed)) == {Note.name}


def test_an_unknown_job_out_of_retries_frees_its_unique_and_periodic_locks(launcher_factory, fetch_mode, r):
    running = launcher_factory(FETCH=fetch_mode, CONCURRENCY=1)
    # As a periodic until_executed claim would have left them; the unique lock is taken by the push.
    r.set(K.periodic_running("nightly"), "doa-1", ex=600)
    r.set(K.periodic_running("weekly"), "another-run", ex=600)  # not this job's: left alone
    assert running.client.push({"jid": "doa-1", "class": "no.such.Job", "args": [], "kwargs": {},
                                "queue": "default", "retry": 0, "unique_digest": "d1", "unique_for": 600,
                                "periodic_pjid": "nightly"})
    assert running.client.push({"jid": "doa-2", "class": "no.such.Job", "args": [], "kwargs": {},
                                "queue": "default", "retry": 0, "periodic_pjid": "weekly"})

    wait_until(lambda: r.zcard(K.dead) == 2)
    wait_until(lambda: not r.exists(K.unique("d1")) and not r.exists(K.periodic_running("nightly")))
    assert r.get(K.periodic_running("weekly")) == "another-run"
    wait_until(lambda: settled(running, r))


def test_a_job_calling_sys_exit_is_a_failure_and_its_thread_lives_on(launcher_factory, fetch_mode, r):
    token = new_token()
    running = launcher_factory(FETCH=fetch_mode, CONCURRENCY=1)
    (processor,) = running.manager.processors

    running.push(Exits, token)
    wait_until(lambda: r.zcard(K.retry) == 1)
    running.push(Note, token, "after")

    wait_until(lambda: len(runs(token)) == 2)
    (filed,) = retry_entries(r)
    assert filed["error_class"] == "SystemExit"
    assert filed["error_message"] == "3"
    assert running.manager.processors == [processor] and processor.thread.is_alive()
    assert runs(token)[0] == processor.thread.name
    assert running.thread.is_alive()


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


def test_a_held_job_is_visible_while_it_runs(launcher_factory, r):
    token = new_token()
    running = launcher_factory(CONCURRENCY=1)

    pushed = running.push(Hold, token)

    wait_until(lambda: runs(token) == [("start", pushed["jid"])])
    assert running.manager.busy == 1
    (raw,) = r.lrange(running.in_progress, 0, -1)
    assert payloads.decode(raw)["jid"] == pushed["jid"]
    GATES[token].set()
    wait_until(lambda: settled(running, r))
    assert runs(token)[-1] == ("end", pushed["jid"])


# -- a failure path that fails in turn ---------------------------------------------------------------


def only_processors_alive(running):
    return all(p.thread.is_alive() for p in running.manager.processors)


def test_an_exception_whose_traceback_cannot_be_formatted_is_filed(launcher_factory, fetch_mode, r, caplog):
    caplog.set_level(logging.WARNING, logger="django_cogworker")  # a handler that formats tracebacks
    token = new_token()
    running = launcher_factory(FETCH=fetch_mode, CONCURRENCY=1)
    (processor,) = running.manager.processors

    pushed = running.push(RaisesUnformattable, token)
    wait_until(lambda: r.zcard(K.retry) == 1, message="filed in retry")
    running.push(Note, token, "after")

    wait_until(lambda: len(runs(token)) == 2)
    (filed,) = retry_entries(r)
    assert (filed["jid"], filed["error_class"]) == (pushed["jid"], "test_processor.NotesBomb")
    assert running.manager.processors == [processor] and processor.thread.is_alive()
    assert runs(token)[0] == pushed["jid"]  # once
    wait_until(lambda: settled(running, r))


@pytest.mark.parametrize("retry_count, retry, expected", [(-2, True, 0), (True, True, 0), ("7", True, 0),
                                                          (10**80, 10**81, 10**80 + 1)],
                         ids=["negative", "bool", "string", "huge"])
def test_an_unreadable_retry_count_is_filed_not_fatal(launcher_factory, fetch_mode, r, retry_count, retry, expected):
    token = new_token()
    running = launcher_factory(FETCH=fetch_mode, CONCURRENCY=1)
    payload = {"jid": "odd-count", "class": "engine_fixtures.Boom", "args": [token], "kwargs": {},
               "queue": "default", "retry": retry, "retry_count": retry_count}
    running.client.push(payload)

    wait_until(lambda: r.zcard(K.retry) == 1, message="filed in retry")
    (filed,) = retry_entries(r)
    assert filed["retry_count"] == expected
    (score,) = [s for _raw, s in r.zrange(K.retry, 0, -1, withscores=True)]
    assert time.time() < score < time.time() + 11 * 365 * 86400  # a finite, bounded delay
    assert runs(token) == ["odd-count"] and only_processors_alive(running)
    wait_until(lambda: settled(running, r))


def test_a_death_handler_raising_system_exit_does_not_cost_the_job_its_filing(launcher_factory, fetch_mode, r):
    token = new_token()

    def handler(payload, exc):
        raise SystemExit("a death handler that exits")

    running = launcher_factory(FETCH=fetch_mode, CONCURRENCY=1, death_handlers=[handler])
    pushed = running.push(Boom, token, retry=False)

    wait_until(lambda: r.zcard(K.dead) == 1, message="filed in dead")
    assert dead_entries(r)[0]["jid"] == pushed["jid"]
    running.push(Note, token, "after")
    wait_until(lambda: len(runs(token)) == 2)
    assert only_processors_alive(running)
    wait_until(lambda: settled(running, r))


def test_a_failed_job_whose_payload_cannot_be_encoded_goes_to_dead_as_pushed(launcher_factory, fetch_mode, r):
    token = new_token()
    running = launcher_factory(FETCH=fetch_mode, CONCURRENCY=1)
    pushed = running.push(LeavesAnUnencodablePayload, token)

    wait_until(lambda: r.zcard(K.dead) == 1, message="filed in dead")
    (dead,) = dead_entries(r)
    assert (dead["jid"], dead["args"]) == (pushed["jid"], [token])
    assert "context" not in dead  # as pushed, not as the job left it
    assert dead["error_message"] == "failed with a datetime in the payload"
    assert "could not be filed" in dead["dead_reason"] and "datetime" in dead["dead_reason"]
    wait_until(lambda: settled(running, r))
    assert runs(token) == [pushed["jid"]] and not running.manager.pending_settlements()


@pytest.mark.parametrize("choice", [float("nan"), float("inf"), SystemExit(2), "soon"],
                         ids=["nan", "inf", "system-exit", "word"])
def test_a_retry_in_that_answers_nonsense_gets_the_default_backoff(launcher_factory, r, choice):
    token = new_token()
    RETRY_IN[token] = choice
    running = launcher_factory(CONCURRENCY=1)
    running.push(RetryIn, token)

    wait_until(lambda: r.zcard(K.retry) == 1, message="filed in retry")
    (score,) = [s for _raw, s in r.zrange(K.retry, 0, -1, withscores=True)]
    assert time.time() + 5 < score < time.time() + 26  # the default: 0**4 + 15 + rand(10)
    assert only_processors_alive(running)
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


def test_an_async_perform_is_awaited_on_its_processor_thread(launcher_factory, r):
    token = new_token()
    running = launcher_factory(CONCURRENCY=1)
    (processor,) = running.manager.processors
    ran = running.push(AsyncNote, token)
    failed = running.push(AsyncNote, token, True)

    wait_until(lambda: r.zcard(K.retry) == 1, message="the failing one filed in retry")
    assert runs(token) == [(ran["jid"], processor.thread.name)]
    (filed,) = retry_entries(r)
    assert (filed["jid"], filed["error_message"]) == (failed["jid"], "async failure")
    wait_until(lambda: settled(running, r))


def test_a_death_handler_that_spoils_the_payload_of_an_unknown_job_does_not_keep_it_unfiled(
        launcher_factory, r):
    def handler(payload, exc):
        payload["seen"] = dt.datetime.now()  # can't be encoded

    running = launcher_factory(CONCURRENCY=1, death_handlers=[handler])
    running.client.push({"jid": "unknown-class", "class": "nowhere.Job", "args": [], "kwargs": {},
                         "queue": "default", "retry": 0})

    wait_until(lambda: r.zcard(K.dead) == 1, message="filed in dead")
    (dead,) = dead_entries(r)
    assert dead["jid"] == "unknown-class" and "seen" not in dead
    wait_until(lambda: settled(running, r))


# -- text a job's failure can't be written with as it is --------------------------------------------


def test_a_jid_or_class_holding_a_line_break_can_not_forge_log_lines(launcher_factory, r, caplog):
    caplog.set_level(logging.INFO, logger="django_cogworker")
    token = new_token()
    running = launcher_factory(CONCURRENCY=1)
    forged = "x\n2026-12-03 20:03:24,803 ERROR pid=1 forged"
    running.client.push({"jid": forged, "class": Boom.name, "args": [token], "kwargs": {}, "queue": "default",
                         "retry": 1})
    running.client.push({"jid": "y", "class": f"no.Such{forged}", "args": [], "kwargs": {}, "queue": "default",
                         "retry": 0})

    wait_until(lambda: r.zcard(K.retry) == 1 and r.zcard(K.dead) == 1, message="filed")

    lines = [m for m in caplog.messages if "forged" in m]
    assert len(lines) >= 4  # start and fail, of each
    assert all("\n" not in m and "x\\n2026-12-03 20:03:24,803 ERROR pid=1 forged" in m for m in lines)
    wait_until(lambda: settled(running, r))


def test_a_10_mb_error_message_is_logged_cut_like_in_its_payload(launcher_factory, r, caplog):
    caplog.set_level(logging.WARNING, logger="django_cogworker")
    running = launcher_factory(CONCURRENCY=1)
    running.client.push({"jid": "huge", "class": HugeErrorJob.name, "args": [10_000_000], "kwargs": {},
                         "queue": "default", "retry": 1})

    wait_until(lambda: r.zcard(K.retry) == 1, message="filed")

    (filed,) = retry_entries(r)
    assert filed["error_message"] == "x" * payloads.ERROR_MESSAGE_LIMIT
    # It was written whole with its traceback: 10 MB of log per attempt.
    assert len(caplog.text) < 3 * payloads.ERROR_MESSAGE_LIMIT
    (line,) = [m for m in caplog.messages if m.startswith("fail jid=huge")]
    assert "perform" in line and "raise RuntimeError" in line  # its stack is still shown
    wait_until(lambda: settled(running, r))


def test_10_mb_that_are_not_utf8_go_to_dead_without_growing(launcher_factory, rb):
    running = launcher_factory(CONCURRENCY=1)
    raw = b"\xff" * 10_000_000
    rb.lpush(K.queue("default"), raw)

    wait_until(lambda: rb.zcard(K.dead) == 1, timeout=20, message="dead on arrival")

    (dead,) = rb.zrange(K.dead, 0, -1)
    assert len(dead) <= len(raw) + 1000  # each byte shown as U+FFFD made it 31 MB
    entry = json.loads(dead)
    assert (entry["class"], entry["raw_size"]) == ("(unparseable)", len(raw))
    assert "unparseable payload" in entry["dead_reason"]
    wait_until(lambda: not running.manager.busy and not running.manager.pending_settlements())


class CallsThePackage(Job):
    """Fails inside the package, in a call its perform makes (a payload that isn't JSON decoded)."""

    retry = 0

    def perform(self):
        payloads.decode(b"{not json")


def frames(backtrace: list[str]) -> list[str]:
    """The frame lines of a stored backtrace ("File ..., line N, in name"), in order."""
    return [line.strip() for line in backtrace if line.lstrip().startswith("File ")]


def test_a_failure_s_backtrace_and_log_start_at_the_user_s_code_and_its_exception_keeps_every_frame(
        launcher_factory, r, caplog):
    # The worker's own way to perform (the processor, the hooks, the cancellation feature's around,
    # run_job, call_perform) came first: with backtrace = 5, four of the five frames kept were the
    # package's, and the log's traceback showed eight of them before the user's.
    caplog.set_level(logging.WARNING, logger="django_cogworker")
    handed: list[BaseException] = []
    running = launcher_factory(death_handlers=[lambda payload, exc: handed.append(exc)])
    boom = running.push(Boom, new_token(), "from perform", backtrace=5)
    inner = running.push(CallsThePackage, backtrace=5)

    wait_until(lambda: r.zcard(K.retry) == 1 and r.zcard(K.dead) == 1, message="both filed")
    (retried,), (dead,) = retry_entries(r), dead_entries(r)
    assert retried["jid"] == boom["jid"] and dead["jid"] == inner["jid"]
    (only,) = frames(retried["error_backtrace"])  # (backtrace = 5: the user's frame, none of the package's)
    assert only.startswith('File "') and "engine_fixtures.py" in only and only.endswith("in perform")
    assert retried["error_backtrace"][-1] == "RuntimeError: from perform"
    # A frame of the package inside the user's call stays: where perform called it, then the package's.
    called = frames(dead["error_backtrace"][dead["error_backtrace"].index("Traceback (most recent call last):", 1):])
    assert "test_processor.py" in called[0] and called[0].endswith("in perform")
    assert "django_cogworker/push/payload.py" in called[1] and called[1].endswith("in decode")

    (record,) = [rec for rec in caplog.records if rec.getMessage().startswith("fail") and boom["jid"] in
                 rec.getMessage()]
    shown = logging.Formatter().formatException(record.exc_info)
    assert "django_cogworker" not in shown and "engine_fixtures.py" in shown and "RuntimeError: from perform" in shown
    # The exception itself is untouched: a death handler (or a debugger) sees the worker's frames too.
    (exc,) = handed
    assert [(f.name, "processor.py" in f.filename) for f in traceback.extract_tb(exc.__traceback__)][:1] == [
        ("process", True)]
    wait_until(lambda: settled(running, r))


def test_a_failure_with_no_frame_of_the_user_s_keeps_its_whole_backtrace(launcher_factory, r):
    running = launcher_factory()
    running.client.push({"jid": "unknown", "class": "testproject.nowhere.Job", "args": [], "kwargs": {},
                         "queue": "default", "retry": 0, "backtrace": True})

    wait_until(lambda: r.zcard(K.dead) == 1, message="filed")
    (dead,) = dead_entries(r)
    shown = frames(dead["error_backtrace"])
    assert shown[0].endswith("in process") and shown[-1].endswith("in _unknown_job")  # (nothing left out)
    wait_until(lambda: settled(running, r))
