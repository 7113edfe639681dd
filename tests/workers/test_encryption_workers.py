"""Encrypted arguments through real workers: every Redis key, read at each step of a job's life
(queued, scheduled, running, retrying, dead, in a batch, a task's result), never holds the clear
argument; the job is handed it all the same; a key rotation runs what the old key sealed; a key no
worker has sends the job to dead at once, unrun, saying why.
"""

from __future__ import annotations

import json

from django.conf import settings
from django.test import override_settings
from helpers import Worker, every_value, wait_until, worker

from django_cogworker import Batch, chain
from django_cogworker.features.encryption.keys import new_key
from django_cogworker.push import runtime
from testproject.demo.secret_jobs import SecretCallback, SecretJob, seen

SECRET = "Quetzalcoatl-7731-secret"  # (distinctive: found nowhere in Redis but by a leak)
OLD, NEW = new_key(), new_key()


def assert_no_clear_secret(rb, step: str, secret: str = SECRET) -> int:
    """Fail naming the key if any key name or value holds ``secret`` (or a part of it); return the keys read."""
    values = every_value(rb)
    for needle in (secret.encode(), secret.split("-")[0].encode()):
        leaks = [key for key, value in values if needle in key or needle in value]
        assert not leaks, f"{step}: the clear argument is in {leaks}"
    return len(values)


def records(r, key: str) -> list[dict]:
    return [json.loads(item) for item in r.lrange(key, 0, -1)]


def keyed_worker(tmp_path, name: str, keys: list[str] | None = None, *args: str) -> Worker:
    """helpers.worker with its own ENCRYPTION_KEYS (None: the test settings' key)."""
    env = {"COGWORKER_ENCRYPTION_KEYS": json.dumps(keys)} if keys is not None else {}
    return worker(tmp_path, *args, name=name, env=env)


def pushing_with(keys: list[str]):
    """The test process's pushes sealed with ``keys`` (the worker has its own list)."""
    return override_settings(COGWORKER={**settings.COGWORKER, "ENCRYPTION_KEYS": keys})


def test_a_job_s_clear_argument_is_in_no_redis_key_queued_scheduled_running_retrying_dead(tmp_path, r, rb):
    SecretJob.perform_async("ran", SECRET, hold=True)                   # runs, held until ran:go
    SecretJob.perform_async("failed", SECRET, fails=-1)                 # fails: retry, retry, dead
    SecretJob.perform_in(3600, "later", SECRET)                         # waits in the schedule
    SecretJob.perform_bulk([["bulk", SECRET], ["bulk", SECRET]])
    assert r.llen("cogworker:queue:default") == 4 and r.zcard("cogworker:schedule") == 1
    assert_no_clear_secret(rb, "pushed and scheduled")
    with keyed_worker(tmp_path, "life") as w:
        w.wait_ready()
        wait_until(lambda: r.llen("ran") == 1, timeout=30, message="the held job to start")
        running = [k for k in r.keys("cogworker:in_progress:*") if r.llen(k)]
        assert running, "the running job is on its in-progress list"
        assert_no_clear_secret(rb, "running (in-progress list, workers hash)")
        wait_until(lambda: r.zcard("cogworker:retry") == 1, timeout=30, message="the failing job in retry")
        assert_no_clear_secret(rb, "retrying")
        wait_until(lambda: r.zcard("cogworker:dead") == 1, timeout=60, message="the failing job in dead")
        assert_no_clear_secret(rb, "dead")
        r.set("ran:go", 1)
        wait_until(lambda: r.llen("bulk") == 2 and not any(r.llen(k) for k in r.keys("cogworker:in_progress:*")),
                   timeout=30, message="every job settled")
    # Each run was handed the clear argument; its own payload had it sealed.
    for key, count in (("ran", 1), ("failed", 3), ("bulk", 2)):
        got = records(r, key)
        assert len(got) == count and all(g["seen"] == seen(SECRET) and g["payload_args"] == [] for g in got), key
    dead = json.loads(r.zrange("cogworker:dead", 0, -1)[0])
    assert dead["args"] == [] and dead["error_message"] == "failing on purpose (attempt 3)"
    assert dead["dead_reason"] == "retries exhausted" and dead["retry_count"] == 2
    assert_no_clear_secret(rb, "after the runs")


def test_a_batch_s_jobs_and_its_callback_options_stay_encrypted_and_the_callback_gets_them(tmp_path, r, rb):
    batch = Batch(description="secret batch").on("success", SecretCallback, key="cb", secret=SECRET)
    with batch.jobs():
        SecretJob.perform_async("member", SECRET, hold=True)
        SecretJob.perform_async("member", SECRET)
    assert_no_clear_secret(rb, "a batch pushed")
    with keyed_worker(tmp_path, "batch") as w:
        w.wait_ready()
        wait_until(lambda: r.llen("member") == 2, timeout=30)
        assert_no_clear_secret(rb, "a batch running")
        r.set("member:go", 1)
        wait_until(lambda: r.llen("cb") == 1, timeout=30, message="the success callback to run")
    assert records(r, "cb") == [{"event": "success", "bid": batch.bid, "seen": seen(SECRET)}]
    assert_no_clear_secret(rb, "a batch done")


def test_a_chain_s_steps_stored_in_its_batch_data_stay_encrypted_and_each_step_gets_its_arguments(tmp_path, r, rb):
    flow = chain(SecretJob.s("step", SECRET + "-1", hold=True), SecretJob.s("step", SECRET + "-2"))
    flow.on("success", SecretCallback, key="cb", secret=SECRET).perform_async()
    assert_no_clear_secret(rb, "a chain pushed (its steps in its batch's data)")
    with keyed_worker(tmp_path, "chain") as w:
        w.wait_ready()
        wait_until(lambda: r.llen("step") == 1, timeout=30)
        assert_no_clear_secret(rb, "a chain's first step running")
        r.set("step:go", 1)
        wait_until(lambda: r.llen("cb") == 1, timeout=30, message="the chain's success")
    assert [g["seen"] for g in records(r, "step")] == [seen(SECRET + "-1"), seen(SECRET + "-2")]
    assert_no_clear_secret(rb, "a chain done")


def test_a_job_pushed_with_the_old_key_runs_on_a_worker_whose_list_has_a_new_key_first(tmp_path, r, rb):
    with pushing_with([OLD]):
        SecretJob.perform_async("rotated", SECRET)
    with pushing_with([NEW]):
        SecretJob.perform_async("rotated", SECRET + "-new")
    assert_no_clear_secret(rb, "pushed under two keys")
    with keyed_worker(tmp_path, "rotation", [NEW, OLD]) as w:
        w.wait_ready()
        wait_until(lambda: r.llen("rotated") == 2, timeout=30)
    assert sorted(g["seen"] for g in records(r, "rotated")) == sorted([seen(SECRET), seen(SECRET + "-new")])
    assert r.zcard("cogworker:dead") == 0 and r.zcard("cogworker:retry") == 0
    runtime.reset()


def test_a_job_sealed_with_a_key_no_worker_has_goes_to_dead_at_once_unrun_saying_so(tmp_path, r, rb):
    with pushing_with([OLD]):
        jid = SecretJob.perform_async("lost", SECRET)  # (retry = 2: never used)
    with keyed_worker(tmp_path, "missing", [NEW]) as w:
        w.wait_ready()
        wait_until(lambda: r.zcard("cogworker:dead") == 1, timeout=30, message="the job in dead")
        assert "Quetzalcoatl" not in w.log() and OLD not in w.log() and NEW not in w.log()
    dead = json.loads(r.zrange("cogworker:dead", 0, -1)[0])
    assert dead["jid"] == jid and dead["retry_count"] == 0 and r.zcard("cogworker:retry") == 0
    assert dead["error_class"] == "django_cogworker.features.encryption.errors.KeyUnavailable"
    assert "which is not among this worker's" in dead["dead_reason"] and "ENCRYPTION_KEYS" in dead["dead_reason"]
    assert r.llen("lost") == 0  # (it never ran)
    assert_no_clear_secret(rb, "dead for want of its key")
    runtime.reset()


def test_a_task_that_encrypts_keeps_its_arguments_out_of_its_result_record_and_its_queue(tmp_path, r, rb):
    from testproject.demo.tasks import secret_task

    result = secret_task.enqueue("tasked", SECRET)
    assert result.args == ["tasked", SECRET]  # (the caller's own object: in its memory only)
    assert r.hget(f"cogworker:result:{result.id}", "encrypted") == "1"
    assert_no_clear_secret(rb, "a task pushed (its READY record)")
    with keyed_worker(tmp_path, "task") as w:
        w.wait_ready()
        wait_until(lambda: r.llen("tasked") == 1, timeout=30)
        wait_until(lambda: r.hget(f"cogworker:result:{result.id}", "status") == "SUCCESSFUL", timeout=30)
    assert r.lrange("tasked", 0, -1) == [seen(SECRET)]
    assert_no_clear_secret(rb, "a task done")


def test_arguments_written_beside_a_sealed_payload_send_it_to_dead_unrun_saying_so(tmp_path, r, rb):
    # Someone who can write to Redis, not the key: a keyword set on a queued payload (it ran the job with
    # it: here, failing each attempt), an argument put before the sealed ones (it shifted them).
    keyword = SecretJob.perform_async("injected", SECRET)
    argument = SecretJob.perform_async("injected", SECRET)
    queue = "cogworker:queue:default"
    for index, raw in enumerate(r.lrange(queue, 0, -1)):
        payload = json.loads(raw)
        payload.update({keyword: {"kwargs": {"fails": -1}}, argument: {"args": ["elsewhere"]}}[payload["jid"]])
        r.lset(queue, index, json.dumps(payload))
    with keyed_worker(tmp_path, "injected") as w:
        w.wait_ready()
        wait_until(lambda: r.zcard("cogworker:dead") == 2, timeout=30, message="both jobs in dead")
        assert "Quetzalcoatl" not in w.log()
    dead = {entry["jid"]: entry for entry in map(json.loads, r.zrange("cogworker:dead", 0, -1))}
    for jid, said in ((keyword, "clear kwargs beside its sealed arguments ('fails')"),
                      (argument, "1 clear argument(s) beside its sealed ones, where its seal allows none")):
        assert dead[jid]["error_class"] == "django_cogworker.features.encryption.errors.UnsealedArguments"
        assert said in dead[jid]["dead_reason"] and "refused, never run" in dead[jid]["dead_reason"]
        assert dead[jid]["retry_count"] == 0 and "elsewhere" not in dead[jid]["dead_reason"]
    assert r.llen("injected") == 0 and r.llen("elsewhere") == 0  # (perform never called)
    assert r.zcard("cogworker:retry") == 0
    assert_no_clear_secret(rb, "refused for what was written beside its seal")
