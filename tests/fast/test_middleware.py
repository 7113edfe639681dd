"""The server middleware chain (middleware.py, db.py) and how a running process uses it."""

from __future__ import annotations

import json

import pytest
from engine_fixtures import (
    RUNS,
    Boom,
    Note,
    make_processor_fixture,  # noqa: F401 - the make_processor fixture
    new_token,
    runs,
)
from helpers import in_thread

from django_cogworker.broker.keys import Keys
from django_cogworker.engine.run import db
from django_cogworker.push.middleware import build_chain, import_string, load

K = Keys()


class _Recording:
    """Server middleware: records entering and leaving in RUNS[token] (token = the job's first argument)."""

    label = ""

    def __init__(self, run):
        self.run = run

    def __call__(self, job, payload):
        token = payload["args"][0]
        RUNS[token].append((f"{self.label}-in", type(job).__name__, job.jid == payload["jid"]))
        try:
            return self.run(job, payload)
        finally:
            RUNS[token].append(f"{self.label}-out")


class Outer(_Recording):
    label = "outer"


class Inner(_Recording):
    label = "inner"

    def __call__(self, job, payload):
        if payload["args"][1:] == ["alter me"]:
            payload["args"][1] = "altered by Inner"
        return super().__call__(job, payload)


class Behaves:
    """Server middleware doing what the job's second argument says: raise, skip, swallow or see."""

    def __init__(self, run):
        self.run = run

    def __call__(self, job, payload):
        token, action = payload["args"][0], payload["args"][1] if len(payload["args"]) > 1 else None
        if action == "raise":
            raise ValueError("refused by middleware")
        if action == "skip":
            return None  # never calls on: the job does not run
        try:
            return self.run(job, payload)
        except Exception as exc:
            RUNS[token].append(("saw", type(exc).__name__, str(exc)))
            if action != "swallow":
                raise
            return None


def test_the_first_listed_is_outermost():
    trail = []

    def factory(label):
        def make(step):
            def run(job, payload):
                trail.append(f"{label}-in")
                result = step(job, payload)
                trail.append(f"{label}-out")
                return result

            return run

        return make

    chain = build_chain([factory("a"), factory("b"), factory("c")], lambda job, payload: trail.append("job") or 42)

    assert chain(None, {}) == 42
    assert trail == ["a-in", "b-in", "c-in", "job", "c-out", "b-out", "a-out"]


def test_an_empty_chain_is_the_job_itself():
    def terminal(job, payload):
        return (job, payload)

    assert build_chain([], terminal) is terminal


def test_middleware_is_loaded_by_dotted_path_only_from_the_config():
    assert load(["test_middleware.Outer", "test_middleware.Inner"]) == [Outer, Inner]
    with pytest.raises(ImportError, match="not a dotted path"):
        import_string("Outer")
    with pytest.raises(ImportError, match="has no attribute 'Nope'"):
        import_string("test_middleware.Nope")
    with pytest.raises(ImportError):
        import_string("no_such_module_anywhere.Thing")


def test_a_running_process_wraps_every_job_first_listed_outermost(make_processor):
    token = new_token()
    called = make_processor(server_middleware=[Outer, Inner])

    run = called.run(Note, token, "alter me")

    assert runs(token) == [("outer-in", "Note", True), ("inner-in", "Note", True),
                           (run.payload["jid"], ["altered by Inner"]), "inner-out", "outer-out"]


def test_what_a_middleware_does_decides_the_outcome(make_processor, r):
    token = new_token()
    called = make_processor(server_middleware=[Behaves])

    raised = called.push(Note, token, "raise")
    skipped = called.push(Note, token, "skip")
    swallowed = called.push(Boom, token, "swallow")
    seen = called.push(Boom, token, "see")

    called.drain()
    called.flush_stats()

    assert r.zcard(K.retry) == 2
    assert r.get(K.stat_processed) == "4"
    retried = {json.loads(raw)["jid"]: json.loads(raw) for raw in r.zrange(K.retry, 0, -1)}
    # A middleware's own error is the job's failure.
    assert retried[raised["jid"]]["error_class"] == "ValueError"
    assert retried[raised["jid"]]["error_message"] == "refused by middleware"
    # One that sees the error and re-raises (an error reporter) leaves it to the retry policy.
    assert retried[seen["jid"]]["error_message"] == "see"
    assert ("saw", "RuntimeError", "see") in runs(token)
    # One that swallows the error or skips the job makes it a success.
    assert ("saw", "RuntimeError", "swallow") in runs(token)
    assert swallowed["jid"] not in retried and skipped["jid"] not in retried
    assert [entry for entry in runs(token) if isinstance(entry, tuple) and entry[0] == skipped["jid"]] == []
    assert r.get(K.stat_failed) == "2"
    assert r.zcard(K.dead) == 0


def test_close_old_connections_runs_before_and_after_every_job_even_a_failing_one(monkeypatch):
    calls = []
    monkeypatch.setattr(db, "close_old_connections", lambda: calls.append("close"))

    def job_run(job, payload):
        calls.append("job")
        if payload.get("fail"):
            raise RuntimeError("job failed")
        return "ok"

    chain = build_chain([db.CloseOldConnections], job_run)

    def two_jobs():
        db._thread_state.connected = True  # this thread has opened a DB connection before
        assert chain(None, {}) == "ok"
        with pytest.raises(RuntimeError):
            chain(None, {"fail": True})

    in_thread(two_jobs)
    assert calls == ["close", "job", "close", "close", "job", "close"]


def test_a_thread_that_never_connected_to_the_database_skips_the_connection_sweep(monkeypatch):
    calls = []
    monkeypatch.setattr(db, "close_old_connections", lambda: calls.append("close"))
    chain = build_chain([db.CloseOldConnections], lambda job, payload: calls.append("job"))

    in_thread(lambda: chain(None, {}))
    assert calls == ["job"]


@pytest.mark.django_db(transaction=True)
def test_once_a_thread_has_connected_to_the_database_every_job_after_is_swept(monkeypatch):
    from django.db import connection

    calls = []
    real = db.close_old_connections
    monkeypatch.setattr(db, "close_old_connections", lambda: (calls.append("close"), real()))

    def job_run(job, payload):
        calls.append("job")
        if payload.get("query"):
            with connection.cursor() as cursor:  # the thread's first connection: connection_created
                cursor.execute("SELECT 1")

    chain = build_chain([db.CloseOldConnections], job_run)

    def three_jobs():
        chain(None, {})
        chain(None, {"query": True})
        chain(None, {})
        connection.close()

    in_thread(three_jobs)
    assert calls == ["job", "job", "close", "close", "job", "close"]
