"""`manage.py cogworker` (django_cogworker/cli/ and its command): listings with headers and
--json, bounded paging, actions with their confirmations, and exit codes, on the suite's Redis;
quiet/stop on a real `runcogworker` process."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError
from helpers import free_port, wait_until

from django_cogworker import api
from django_cogworker.broker.keys import Keys
from testproject.demo.jobs import RecordJob

K = Keys()
ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("cogworker", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def cli_json(*args: str):
    return json.loads(cli(*args, "--json")[0])


def entry(jid: str, **fields) -> bytes:
    payload = {"jid": jid, "class": "testproject.demo.jobs.RecordJob", "queue": "default", "args": ["seen", jid],
               "kwargs": {}, "enqueued_at": time.time(), **fields}
    return json.dumps(payload, separators=(",", ":")).encode()


def failed(jid: str, **fields) -> bytes:
    return entry(jid, **{"error_class": "ValueError", "error_message": f"{jid} broke", "retry_count": 3,
                         "failed_at": time.time(), **fields})


def test_stats_show_counters_sizes_and_processes(rb):
    rb.set(K.stat_processed, 1234)
    rb.set(K.stat_failed, 56)
    RecordJob.perform_async("seen", 1)
    RecordJob.perform_in(3600, "seen", 2)
    rb.zadd(K.retry, {failed("r1"): time.time() + 60})
    rb.zadd(K.dead, {failed("d1"): time.time(), failed("d2"): time.time()})
    out, _ = cli("stats")
    lines = out.splitlines()
    assert lines[0].split() == ["STAT", "VALUE"]
    table = dict(line.split(None, 1) for line in lines[1:])
    assert table["processed"] == "1234" and table["failed"] == "56" and table["enqueued"] == "1"
    assert (table["scheduled"], table["retries"], table["dead"], table["processes"]) == ("1", "1", "2", "0")
    document = cli_json("stats")
    assert document["processed"] == 1234 and document["dead"] == 2 and document["busy"] == 0


def test_stats_prints_the_keys_cli_md_lists():
    doc = (ROOT / "docs" / "cli.md").read_text()
    table = doc[doc.index("$ python manage.py cogworker stats\n"):].split("\n\n")[0].splitlines()[2:]
    assert [line.split()[0] for line in table] == list(cli_json("stats"))


@pytest.mark.parametrize("action", ["queues", "processes", "scheduled", "retries", "dead", "periodic", "batches",
                                    "limits"])
def test_per_page_of_every_json_listing_is_the_page_size_used(action):
    # (processes --json said 1 with one process, and periodic --json 0 with no entry)
    assert cli_json(action)["per_page"] == 25
    assert cli_json(action, "--limit", "7")["per_page"] == 7


def test_processes_and_periodic_and_named_queues_are_paged_as_the_other_listings(rb):
    for name in ("a", "b", "c"):
        rb.hset(K.periodic_schedule, name, json.dumps({"cron": "0 3 * * *", "tz": "UTC", "job": "shop.jobs.Report",
                                                        "queue": "default", "published_at": time.time()}))
    document = cli_json("periodic", "--limit", "2", "--page", "2")
    assert (document["total"], document["page"], document["per_page"]) == (3, 2, 2)
    assert [i["name"] for i in document["items"]] == ["c"]
    assert cli("periodic", "--limit", "2")[1] == "(1-2 of 3, page 1 of 2; --page 2 for more)\n"
    document = cli_json("queues", "default", "mail", "--limit", "1", "--page", "2")
    assert (document["total"], document["per_page"], [i["name"] for i in document["items"]]) == (2, 1, ["mail"])


def test_queues_lists_sizes_latency_and_paused_and_only_the_queues_named(rb):
    RecordJob.perform_async("seen", 1)
    RecordJob.set(queue="mail").perform_async("seen", 2)
    RecordJob.set(queue="mail").perform_async("seen", 3)
    api.Queue("mail").pause()
    out, _ = cli("queues")
    assert out.splitlines()[0].split() == ["QUEUE", "SIZE", "LATENCY", "PAUSED"]
    assert [line.split()[0::3] for line in out.splitlines()[1:]] == [["default", "no"], ["mail", "yes"]]
    # The queue argument the old cogworker_queues ignored:
    document = cli_json("queues", "mail")
    assert [(q["name"], q["size"], q["paused"]) for q in document["items"]] == [("mail", 2, True)]
    assert document["total"] == 1
    with pytest.raises(CommandError, match="no such queue: 'mial'") as caught:
        cli("queues", "mial")
    assert caught.value.returncode == 1


def test_listings_are_paged_and_say_how_to_see_the_rest(rb):
    rb.sadd(K.queues, *[f"tenant-{n:04d}" for n in range(250)])
    out, err = cli("queues", "--limit", "10", "--page", "3")
    assert [line.split()[0] for line in out.splitlines()[1:]] == [f"tenant-{n:04d}" for n in range(20, 30)]
    assert err == "(21-30 of 250, page 3 of 25; --page 4 for more)\n"
    assert len(cli("queues")[0].splitlines()) == 26  # 25 rows by default, and the header
    document = cli_json("queues", "--limit", "100", "--page", "3")
    assert (document["total"], document["page"], len(document["items"])) == (250, 3, 50)
    with pytest.raises(CommandError, match="--limit: must be from 1 to 100"):
        cli("queues", "--limit", "1000")

    now = time.time()
    rb.zadd(K.dead, {failed(f"d{n:03d}"): now - n for n in range(300)})
    out, err = cli("dead", "--limit", "5")
    assert out.splitlines()[0].split()[:2] == ["DIED", "JID"]
    assert [line.split()[2] for line in out.splitlines()[1:]] == ["d000", "d001", "d002", "d003", "d004"]
    assert "of 300" in err


def test_sets_list_their_entries_filtered_and_as_json(rb):
    now = time.time()
    rb.zadd(K.schedule, {entry("s1"): now + 3600})
    rb.zadd(K.retry, {failed("r1"): now + 60, failed("r2"): now + 120})
    rb.zadd(K.dead, {failed("d1"): now, entry("other", **{"class": "shop.jobs.Other"}): now - 1})
    out, _ = cli("scheduled")
    assert out.splitlines()[0].split() == ["DUE", "JID", "CLASS", "QUEUE", "ARGS"]
    assert out.splitlines()[1].split()[2:] == ["s1", "testproject.demo.jobs.RecordJob", "default", '["seen","s1"]']
    out, _ = cli("retries")
    assert out.splitlines()[0].split()[-2:] == ["RETRIES", "ERROR"] and "ValueError: r1 broke" in out
    document = cli_json("dead", "--class", "shop.jobs.Other")
    assert [e["jid"] for e in document["items"]] == ["other"] and document["complete"] is True
    assert [e["jid"] for e in cli_json("retries", "--grep", "r2 broke")["items"]] == ["r2"]
    item = cli_json("retries")["items"][0]
    assert item["error_class"] == "ValueError" and item["retry_count"] == 3 and item["at"] == pytest.approx(now + 60)


def test_a_table_escapes_control_characters_in_what_anyone_could_push(rb):
    rb.zadd(K.dead, {failed("d1", error_message="\x1b[2J\nfake row"): time.time()})
    rb.sadd(K.queues, "evil\nqueue")
    out, _ = cli("dead")
    assert "\x1b" not in out and len(out.splitlines()) == 2 and "\\x1b[2J\\nfake row" in out
    assert "evil\\nqueue" in cli("queues")[0]


def test_pause_refuses_an_unknown_queue_unless_forced_and_unpause_undoes_it(rb):
    with pytest.raises(CommandError, match="no such queue 'reprots'") as caught:
        cli("pause", "mail", "reprots")  # mail is in the test project's QUEUES
    assert caught.value.returncode == 1
    assert rb.smembers(K.paused_queues) == {b"mail"}  # the known one was paused all the same
    # Said when it takes effect, as quiet does: "default: paused", and a job pushed right after ran.
    assert cli("pause", "reports", "--force")[0] == (
        "reports: paused (each process stops fetching from it at its next heartbeat, within 7s; the jobs it took by "
        "then still run)\n")
    assert rb.smembers(K.paused_queues) == {b"mail", b"reports"}
    assert cli("unpause", "mail", "reports")[0] == "".join(
        f"{name}: unpaused (each process fetches from it again at its next heartbeat, within 7s)\n"
        for name in ("mail", "reports"))
    assert rb.smembers(K.paused_queues) == set()


def test_clear_needs_yes_and_names_an_existing_queue(rb):
    for n in range(3):
        RecordJob.set(queue="mail").perform_async("seen", n)
    with pytest.raises(CommandError, match="add --yes") as caught:
        cli("clear", "mail")
    assert caught.value.returncode == 2 and api.Queue("mail").size() == 3
    assert cli("clear", "mail", "--yes")[0] == "mail: cleared, 3 job(s) deleted\n"
    assert api.Queue("mail").size() == 0
    with pytest.raises(CommandError, match="no such queue 'nope'"):
        cli("clear", "nope", "--yes")


def test_retry_and_delete_by_jid_or_all(rb):
    now = time.time()
    rb.zadd(K.dead, {failed("d1"): now, failed("d2"): now - 1, failed("d3"): now - 2})
    with pytest.raises(CommandError, match="gone: not in dead") as caught:
        cli("retry", "dead", "d1", "gone")
    assert caught.value.returncode == 1
    assert api.Queue("default").size() == 1 and api.DeadSet().size() == 2  # d1 retried all the same
    with pytest.raises(CommandError, match="add --yes"):
        cli("delete", "dead", "d2")
    assert cli("delete", "dead", "d2", "--yes")[0] == "d2: deleted\n"
    with pytest.raises(CommandError, match="--all") as caught:
        cli("retry", "dead")
    assert caught.value.returncode == 2
    with pytest.raises(CommandError, match="add --yes"):
        cli("retry", "dead", "--all")
    rb.zadd(K.retry, {failed("r1"): now, failed("r2"): now})
    assert cli("retry", "retries", "--all", "--yes")[0] == "retries: 2 enqueued\n"
    assert api.Queue("default").size() == 3 and api.RetrySet().size() == 0
    assert cli("delete", "dead", "--all", "--yes")[0] == "dead: 1 deleted\n"
    assert api.DeadSet().size() == 0


def test_an_entry_without_a_jid_is_named_by_its_token(rb):
    rb.zadd(K.dead, {b"not json at all": 1_700_000_000.5, failed("d1"): 1_700_000_001})
    with pytest.raises(CommandError, match="left in place") as caught:
        cli("retry", "dead", "--all", "--yes")  # the readable one moves; the other can't
    assert caught.value.returncode == 1 and api.Queue("default").size() == 1
    (item,) = cli_json("dead")["items"]
    assert item["unparseable"] is True and item["jid"] is None
    assert cli("delete", "dead", item["token"], "--yes")[0] == f"{item['token']}: deleted\n"
    assert api.DeadSet().size() == 0
    with pytest.raises(CommandError, match="not in dead"):
        cli("delete", "dead", item["token"], "--yes")


def test_periodic_lists_entries_with_last_and_next_run(rb):
    rb.hset(K.periodic_schedule, "nightly", json.dumps({"cron": "0 3 * * *", "tz": "UTC", "job": "shop.jobs.Report",
                                                        "queue": "default", "published_at": time.time()}))
    rb.set(K.periodic_last_slot("nightly"), 1_700_000_000)
    out, _ = cli("periodic")
    assert out.splitlines()[0].split()[:4] == ["NAME", "CRON", "TZ", "JOB"]
    assert "2023-11-14 22:13:20" in out
    item = cli_json("periodic")["items"][0]
    assert item["name"] == "nightly" and item["last_run"] == 1_700_000_000 and item["next_run"] > time.time()


def test_periodic_shows_the_queue_an_entry_s_runs_go_to(rb):
    # An entry with no queue of its own runs on its job's: the listing printed "-" there, where
    # docs/cli.md shows "default".
    spec = {"cron": "0 3 * * *", "tz": "UTC", "published_at": time.time()}
    for name, own in (("a_receipts", {"job": "testproject.demo.jobs.SendReceipt"}),
                      ("b_records", {"job": "testproject.demo.jobs.RecordJob"}),
                      ("c_moved", {"job": "testproject.demo.jobs.RecordJob", "queue": "low"}),
                      ("d_unknown", {"job": "gone.jobs.Report"})):
        rb.hset(K.periodic_schedule, name, json.dumps({**spec, **own}))
    out, _ = cli("periodic")
    assert [columns(line)[4] for line in out.splitlines()[1:]] == ["mail", "default", "low", "-"]
    assert [item["queue"] for item in cli_json("periodic")["items"]] == ["mail", "default", "low", None]


def columns(line: str) -> list[str]:
    """A table row's cells (two spaces or more apart)."""
    return re.split(r"\s{2,}", line.strip())


def _batches():
    """A batch with a dead, a failing, a waiting and a succeeded job, a child batch and two callbacks
    (its jobs' steps run here, as a worker's settlement runs them: batch_step), and an older one."""
    from admin_fixtures import batch_step

    from django_cogworker import Batch
    from testproject.demo.jobs import BatchCallbackJob

    older = Batch("older")
    with older.jobs():
        (jid,) = [RecordJob.perform_async("seen", 0)]
    batch_step(older.bid, jid, "success")
    batch = Batch("import\x1b[2J 42").on("death", BatchCallbackJob, key="cb").on("success", BatchCallbackJob, key="cb")
    with batch.jobs():
        jids = [RecordJob.perform_async("seen", n) for n in range(4)]
        child = Batch("child")
        with child.jobs():
            RecordJob.perform_async("seen", 9)
    batch_step(batch.bid, jids[0], "dead", "no such customer")
    batch_step(batch.bid, jids[1], "failure", "timeout")
    batch_step(batch.bid, jids[2], "success")
    return older, batch, child, jids


def test_batches_lists_the_newest_first_with_progress_and_state(rb):
    older, batch, child, _ = _batches()
    out, err = cli("batches")
    lines = out.splitlines()
    assert lines[0].split() == ["BID", "DESCRIPTION", "CREATED", "DONE", "PENDING", "FAILURES", "DEAD", "STATE"]
    assert [line.split()[0] for line in lines[1:]] == [child.bid, batch.bid, older.bid] and err == ""
    assert "\x1b" not in out and "import\\x1b[2J 42" in lines[2]  # (escaped: it can't clear the terminal)
    assert columns(lines[2])[3:] == ["1/5", "4", "2", "1", "in progress, a job died"]
    assert columns(lines[3])[3:] == ["1/1", "0", "0", "0", "succeeded"]
    document = cli_json("batches", "--limit", "2")
    assert document["total"] == 3 and [i["bid"] for i in document["items"]] == [child.bid, batch.bid]
    item = document["items"][1]
    assert (item["description"], item["total"], item["succeeded"], item["pending"], item["failures"], item["dead"],
            item["state"], item["death"]) == ("import\x1b[2J 42", 5, 1, 4, 2, 1, "incomplete", True)
    assert document["items"][0]["parent"] == batch.bid
    _, err = cli("batches", "--limit", "2")
    assert err == "(1-2 of 3, page 1 of 2; --page 2 for more)\n"


def test_a_batch_shows_its_counts_callbacks_children_and_jobs_where_they_are(rb):
    _, batch, child, jids = _batches()
    out, err = cli("batches", batch.bid)
    fields, callbacks, children, jobs = out.split("\n\n")
    table = dict(columns(line) for line in fields.splitlines()[1:])
    assert (table["bid"], table["total"], table["dead"], table["failing"], table["waiting"], table["succeeded"]) == (
        batch.bid, "5", "1", "1", "2", "1")
    assert table["state"] == "in progress, a job died"
    assert callbacks.splitlines()[0].split() == ["EVENT", "CALLBACK", "CLASS", "QUEUE", "STATE", "WHERE"]
    death = next(line for line in callbacks.splitlines() if line.startswith("death"))
    assert "pushed" in death and death.endswith("not in retry or dead")
    assert "not fired" in next(line for line in callbacks.splitlines() if line.startswith("success"))
    assert children.splitlines()[1].split()[:3] == [child.bid, "child", "0/1"]
    rows = [line.split(None, 2) for line in jobs.splitlines()[1:]]
    assert [(r[0], r[1]) for r in rows[:2]] == [(jids[0], "dead"), (jids[1], "failing")]
    assert "ValueError: no such customer" in jobs.splitlines()[1] and err == ""
    assert ("batch", child.bid) in [(r[0], r[1].split()[0]) for r in rows]
    document = cli_json("batches", batch.bid)
    assert document["batch"]["bid"] == batch.bid and document["jobs"]["counts"] == {
        "dead": 1, "failing": 1, "waiting": 2, "succeeded": 1}
    assert document["jobs"]["items"][0] == {"jid": jids[0], "child": None, "state": "dead", "failure": {
        "class": "testproject.demo.jobs.RecordJob", "error": "ValueError", "message": "no such customer",
        "at": document["jobs"]["items"][0]["failure"]["at"]}}
    assert [c["bid"] for c in document["children"]] == [child.bid]
    assert {c["event"]: c["state"] for c in document["callbacks"]} == {"success": "not fired", "death": "pushed"}


def fields(out: str) -> dict[str, str]:
    """The FIELD, VALUE table of ``batches BID`` (a field without a value left out)."""
    return dict(cells for cells in map(columns, out.split("\n\n")[0].splitlines()[1:]) if len(cells) == 2)


@pytest.mark.parametrize("name", ["meta", "pending", "failed"])
def test_a_batch_with_a_key_of_the_wrong_type_is_shown_poisoned_never_a_traceback(rb, name):
    # (``batches BID`` printed a traceback: WRONGTYPE out of every read of the key.)
    from admin_fixtures import batch_step

    _, batch, child, jids = _batches()
    key = getattr(K.batch(batch.bid), name)
    rb.delete(key)
    rb.set(key, "not mine")
    out, err = cli("batches", batch.bid)
    table = fields(out)
    assert table["state"].endswith(", poisoned") and table["wrong type"].startswith(f"{name}: read as empty")
    assert cli_json("batches", batch.bid)["batch"]["poisoned"] == [name] and "Traceback" not in err
    assert ", poisoned" in next(line for line in cli("batches")[0].splitlines() if line.startswith(batch.bid))
    for member in (jids[1], jids[3], f"b:{child.bid}"):  # (the steps of its jobs meet it: moved to quarantine)
        batch_step(batch.bid, member, "success")
    table = fields(cli("batches", batch.bid)[0])
    assert table["lost"].startswith(f"{name}: found holding the wrong type") and "wrong type" not in table
    assert cli_json("batches", batch.bid)["batch"]["lost"] == [name]


def test_a_batch_listing_cut_at_its_bound_says_so(rb, monkeypatch):
    from django_cogworker import Batch
    from django_cogworker.features.batches.api import detail

    monkeypatch.setattr(detail, "JOB_LIMIT", 3)
    big = Batch("big")
    with big.jobs():
        RecordJob.perform_bulk([["seen", n] for n in range(10)])
    out, err = cli("batches", big.bid)
    assert len(out.split("\n\n")[-1].splitlines()) == 4  # the header and 3 jobs
    assert ["waiting", "10 (3 listed)"] in [columns(line) for line in out.splitlines()]
    assert err == "(3 of 10 jobs listed, the dead and failing first; the counts above cover them all)\n"


def test_an_unknown_or_expired_batch_is_named_in_a_clear_error(rb):

    from django_cogworker import Batch

    with pytest.raises(CommandError, match=r"no batch 'nope': never created, or its data expired") as caught:
        cli("batches", "nope")
    assert caught.value.returncode == 1
    short = Batch("short", ttl=1)
    with short.jobs():
        pass
    assert cli_json("batches", short.bid)["batch"]["success"] is True
    wait_until(lambda: not rb.exists(K.batch(short.bid).meta), timeout=5, message="its data expired")
    with pytest.raises(CommandError, match=f"no batch '{short.bid}'"):
        cli("batches", short.bid)
    assert cli_json("batches")["items"] == []


def test_the_exit_codes_seen_from_a_shell(redis_url):
    env = {**os.environ, "COGWORKER_REDIS_URL": redis_url, "DJANGO_SETTINGS_MODULE": "testproject.settings"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "manage.py", "cogworker", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)

    assert run("queues").returncode == 0
    unknown = run("pause", "nope")
    assert unknown.returncode == 1 and "no such queue 'nope'" in unknown.stderr
    assert run("clear", "default").returncode == 2
    assert run("bogus").returncode == 2
    gone = run("batches", "no-such-bid")
    assert gone.returncode == 1 and "no batch 'no-such-bid'" in gone.stderr and gone.stdout == ""
    jid = RecordJob.perform_async("seen", 1)
    cancelled = run("cancel", jid)
    assert cancelled.returncode == 0
    assert cancelled.stdout == f"{jid}: cancelled (taken off where it waited; it won't run)\n"
    nowhere = run("cancel", jid)
    assert nowhere.returncode == 1 and nowhere.stdout == ""
    assert f"{jid}: no such job waiting, scheduled, retrying or running" in nowhere.stderr


def test_genkey_and_the_listings_answer_while_a_system_check_fails_and_a_write_is_checked(redis_url, rb, tmp_path):
    # A job class with encrypt = True and no key yet: cogworker.E020 says to run `cogworker genkey`,
    # which that very check refused, with every listing (--skip-checks was refused after the action).
    (tmp_path / "cli_keyless_settings.py").write_text(
        f"from {os.environ['DJANGO_SETTINGS_MODULE']} import *  # noqa: F403\n"
        "COGWORKER = {**COGWORKER, 'ENCRYPTION_KEYS': []}  # noqa: F405\n")
    env = {**os.environ, "COGWORKER_REDIS_URL": redis_url, "DJANGO_SETTINGS_MODULE": "cli_keyless_settings",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=60)

    check = run("check")
    assert check.returncode == 1 and "cogworker.E020" in check.stderr  # (the premise)
    key = run("cogworker", "genkey")
    assert key.returncode == 0 and key.stderr == ""
    from django_cogworker.features.encryption.keys import problems

    assert problems([key.stdout.strip()]) == []
    rb.set(K.stat_processed, 7)
    stats = run("cogworker", "stats", "--json")
    assert stats.returncode == 0 and json.loads(stats.stdout)["processed"] == 7
    assert run("cogworker", "queues").returncode == 0
    # A write runs every check (it acts on what the config may be wrong about), unless skipped,
    # before or after the action's name.
    refused = run("cogworker", "pause", "default")
    assert refused.returncode == 1 and "cogworker.E020" in refused.stderr and not rb.smembers(K.paused_queues)
    assert run("cogworker", "pause", "default", "--skip-checks").returncode == 0
    assert rb.smembers(K.paused_queues) == {b"default"}
    assert run("cogworker", "--skip-checks", "unpause", "default").returncode == 0
    assert rb.smembers(K.paused_queues) == set()


def test_a_listing_reads_past_a_wrong_setting_it_does_not_need_and_names_it(rb):
    from django.conf import settings
    from django.test import override_settings

    rb.set(K.stat_processed, 7)
    with override_settings(COGWORKER={**settings.COGWORKER, "MAX_ORPHANINGS": 0}):
        out, err = cli("stats")
        assert "processed          7" in out.splitlines()
        assert "read with the default of MAX_ORPHANINGS" in err
        assert 'COGWORKER["MAX_ORPHANINGS"] must be a positive integer, got 0' in err
    with override_settings(COGWORKER={**settings.COGWORKER, "KEY_PREFIX": ""}):
        with pytest.raises(CommandError, match=r"can't be read:\nCOGWORKER\[\"KEY_PREFIX\"\] must be") as caught:
            cli("stats")  # (where its keys are: no default can stand in for the project's)
        assert caught.value.returncode == 1


def test_an_unreachable_redis_is_a_clear_error(monkeypatch):
    from django_cogworker.push import runtime

    monkeypatch.setattr(runtime, "get_shared_redis",
                        lambda: redis.Redis(host="127.0.0.1", port=free_port(), socket_timeout=1))
    with pytest.raises(CommandError, match="can't reach Redis") as caught:
        cli("stats")
    assert caught.value.returncode == 1


# -- limits (written into Redis as the workers write them: admin_fixtures.limiter) ------------------


def test_limits_lists_each_key_with_its_use_holders_and_refusals(rb):
    from admin_fixtures import hold, limiter, recent

    limiter(rb, "stripe", "concurrent", 3, lease=60, used_ago=1,
            totals={"granted": 40, "over": 7, "rescheduled": 5, "expired": 1})
    hold(rb, "stripe", "jid-a", "host:1:a")
    hold(rb, "stripe", "jid-gone", "host:2:b", expires_in=-1)  # lapsed: not a holder
    recent(rb, "stripe", 0, over=2, rescheduled=2)
    recent(rb, "stripe", 30, over=3)
    for jid in ("jid-w1", "jid-w2"):  # (two refused jobs waiting for a place: LIMIT_PARK's entries)
        rb.zadd(Keys().limit("stripe").waiting, {jid: time.time() + 5})
    limiter(rb, "mail", "bucket", 25, 1, used_ago=30)
    out, err = cli("limits")
    header, stripe, mail = out.splitlines()
    assert header.split() == ["KEY", "KIND", "SIZE", "IN", "USE", "HOLDERS", "WAITING", "OVER", "5M/60M",
                              "RESCHEDULED", "GRANTED", "OVER", "LAPSED"]
    assert stripe.split() == ["stripe", "concurrent", "3", "1/3", "jid-a", "2", "2/5", "5", "40", "7", "1"]
    assert mail.split()[:4] == ["mail", "bucket", "25/1s", "0/25"] and err == ""
    document = cli_json("limits", "--limit", "1")
    assert document["total"] == 2 and document["per_page"] == 1
    (item,) = document["items"]
    assert item["key"] == "stripe" and item["in_use"] == 1 and item["holders"][0]["jid"] == "jid-a"
    assert item["holders"][0]["process"] == "host:1:a" and item["totals"]["granted"] == 40
    assert item["recent"] == {"over_5m": 2, "over_60m": 5, "rescheduled_5m": 2, "rescheduled_60m": 2}
    _, err = cli("limits", "--limit", "1")
    assert "1-1 of 2, page 1 of 2; --page 2 for more" in err


def test_a_limiter_with_a_key_of_the_wrong_type_is_listed_poisoned(rb):
    from admin_fixtures import limiter

    from django_cogworker import Limiter

    lk = limiter(rb, "stripe", "concurrent", 3, lease=60)
    rb.set(lk.holders, "not mine")
    out, err = cli("limits")
    assert out.splitlines()[1].split()[:3] == ["stripe", "concurrent", "(poisoned)"] and err == ""
    assert cli_json("limits")["items"][0]["poisoned"] == ["holders"]
    with Limiter.concurrent("stripe", 3, lease=60).within(redis=rb, keys=K):  # (a take meets it)
        pass
    (item,) = cli_json("limits")["items"]
    assert (item["lost"], item["poisoned"]) == (["holders"], [])


def test_limits_with_none_used_is_an_empty_table(rb):
    out, _ = cli("limits")
    assert out.splitlines()[0].startswith("KEY") and len(out.splitlines()) == 1
    assert cli_json("limits")["items"] == []


# -- cancel (django_cogworker.features.cancellation.cancel) ---------------------------------------------------------


def test_cancel_takes_a_waiting_job_off_and_an_unknown_jid_fails(rb):
    kept = RecordJob.perform_async("seen", 1)
    jid = RecordJob.perform_async("seen", 2)
    later = RecordJob.perform_in(3600, "seen", 3)
    assert cli("cancel", jid) == (f"{jid}: cancelled (taken off where it waited; it won't run)\n", "")
    assert cli("cancel", later)[0] == f"{later}: cancelled (taken off where it waited; it won't run)\n"
    assert [j.jid for j in api.Queue("default").jobs(1, 10).items] == [kept] and api.ScheduledSet().size() == 0
    assert rb.get(K.stat_cancelled) == b"2"
    for unknown in (jid, "no-such-jid"):
        with pytest.raises(CommandError, match=f"{unknown}: no such job waiting, scheduled, retrying or running") \
                as caught:
            cli("cancel", unknown)
        assert caught.value.returncode == 1
    assert rb.get(K.stat_cancelled) == b"2" and api.Queue("default").size() == 1
    assert not rb.hexists(K.cancels, "no-such-jid")  # (no request left behind for a job that is nowhere)


def test_cancel_of_a_jid_utf8_can_not_carry_is_a_usage_error_not_a_traceback(rb):
    # (Bytes of argv that aren't UTF-8 come as lone surrogates: UnicodeEncodeError from redis-py before.)
    with pytest.raises(CommandError, match=r"cancel's jid must be text UTF-8 can encode") as caught:
        cli("cancel", "ab\udcff")
    assert caught.value.returncode == 2  # (a usage error)
    assert rb.dbsize() == 0


def test_cancel_of_a_batch_s_hand_over_job_fails_with_the_reason(rb):
    from django_cogworker.features.batches import BatchChildDone

    payload = BatchChildDone.set().build([{"bid": "child-bid", "event": "complete"}], {"parent": "parent-bid"})
    rb.lpush(K.queue("default"), json.dumps(payload, separators=(",", ":")))
    rb.sadd(K.queues, "default")
    with pytest.raises(CommandError, match=f"{payload['jid']}: not cancelled: job '{payload['jid']}' is batch "
                                           f"'parent-bid''s own bookkeeping") as caught:
        cli("cancel", payload["jid"])
    assert caught.value.returncode == 1
    assert api.Queue("default").size() == 1 and not rb.exists(K.cancels) and not rb.exists(K.stat_cancelled)


