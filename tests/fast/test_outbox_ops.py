"""What operators see of the outbox: the admin page and its Relay now, ``manage.py cogworker outbox``,
the metrics, the WARNING for rows waiting over a minute, the system check (cogworker.E010), and the
dead set's retry of an outbox unit (a batch sent to dead half done: back to the outbox, run once)."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import time

import pytest
from django.contrib.auth.models import Permission, User
from django.core import checks
from django.core.management import call_command
from django.db import connections, transaction
from django.test import Client
from helpers import REPO_ROOT, RedisServer, wait_until
from outbox_fixtures import alias_fixture, silent_port  # noqa: F401 - a fixture
from prometheus_client.parser import text_string_to_metric_families

from django_cogworker import Batch, Job, api
from django_cogworker.broker.keys import Keys
from django_cogworker.outbox.models import OutboxJob
from django_cogworker.outbox.relay import Relay, relay_once, waiting
from django_cogworker.push import runtime

K = Keys()
URL = "/admin/django_cogworker/outbox/"
pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg", "mysql"])


class Note(Job):
    def perform(self, *args):
        pass


@pytest.fixture
def away(settings, tmp_path):
    """OUTBOX on, on a Redis of the test's own, killed: pushes wait in the outbox."""
    server = RedisServer(tmp_path / "redis").start()
    settings.COGWORKER = {**settings.COGWORKER, "OUTBOX": True, "REDIS_URL": server.url,
                          "METRICS_TOKEN": "s3cret-token-for-the-scraper"}
    server.kill()
    yield server
    runtime.reset()
    server.cleanup()


def user(name: str, *perms: str) -> Client:
    account = User.objects.create_user(name, password="pw", is_staff=True)
    account.user_permissions.set(Permission.objects.filter(content_type__app_label="django_cogworker",
                                                           codename__in=perms))
    client = Client()
    client.force_login(account)
    return client


def wait_rows(alias: str, count: int, age: float = 0.0) -> list[str]:
    """``count`` jobs committed on ``alias`` while Redis is away, written ``age`` seconds ago."""
    with transaction.atomic(using=alias):
        jids = Note.perform_bulk([(i,) for i in range(count)])
    OutboxJob.objects.using(alias).update(created=time.time() - age)
    return jids


def cells(page: str) -> dict[str, list[str]]:
    """The outbox table's rows: database -> its cells' text."""
    table = page[page.index('id="cw-outbox"'):]
    table = table[:table.index("</table>")]
    rows = {}
    for row in re.findall(r"<tr>(.*?)</tr>", table, re.S)[1:]:
        texts = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        rows[texts[0]] = texts[1:]
    return rows


def test_the_admin_page_shows_each_databases_rows_and_the_oldests_age(away):
    wait_rows("default", 3, age=125)
    wait_rows("pg", 2)
    page = user("viewer", "view_cogworker").get(URL).content.decode()
    shown = cells(page)
    assert shown["default"][0] == "3" and shown["default"][1].startswith("2m")
    assert shown["pg"][0] == "2"
    assert "Relay now" not in page  # (a viewer looks; the button is for the change permission)


def test_relay_now_needs_the_change_permission_and_pushes_what_waits(away):
    jids = wait_rows("default", 3) + wait_rows("pg", 2)
    away.restart()
    viewer = user("viewer", "view_cogworker")
    assert viewer.post(URL, {"action": "relay"}).status_code == 403
    assert waiting("default")[0] == 3
    changer = user("changer", "view_cogworker", "change_cogworker")
    assert "Relay now" in changer.get(URL).content.decode()
    response = changer.post(URL, {"action": "relay"}, follow=True)
    assert "5 job(s) relayed." in response.content.decode()
    client = away.client()
    assert sorted(json.loads(raw)["jid"] for raw in client.lrange(K.queue("default"), 0, -1)) == sorted(jids)
    assert waiting("default")[0] == waiting("pg")[0] == 0


def test_relay_now_with_redis_away_says_so_and_keeps_the_rows(away):
    wait_rows("default", 2)
    changer = user("changer", "view_cogworker", "change_cogworker")
    response = changer.post(URL, {"action": "relay"}, follow=True)
    assert "Redis refused the relay" in response.content.decode()
    assert waiting("default")[0] == 2


def test_the_cli_lists_each_databases_outbox(away):
    wait_rows("default", 4, age=30)
    out = io.StringIO()
    call_command("cogworker", "outbox", "--json", stdout=out)
    document = json.loads(out.getvalue())
    by_database = {d["database"]: d for d in document["databases"]}
    assert document["waiting"] == 4
    assert by_database["default"]["waiting"] == 4 and 30 <= by_database["default"]["oldest_age"] < 60
    assert (by_database["pg"]["waiting"], by_database["pg"]["oldest_age"]) == (0, None)
    out = io.StringIO()
    call_command("cogworker", "outbox", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["DATABASE", "WAITING", "OLDEST", "ERROR"]
    assert lines[1].split()[:2] == ["default", "4"]


def test_rows_dated_ahead_of_this_hosts_clock_are_flagged_and_relay_now_takes_them(away):
    """A pushing host's clock 10 minutes ahead: the listing showed OLDEST 0.0s and nothing else, and
    Relay now relayed nothing (it took rows dated up to now)."""
    jids = wait_rows("default", 2, age=-600)
    out = io.StringIO()
    call_command("cogworker", "outbox", "--json", stdout=out)
    [default] = [d for d in json.loads(out.getvalue())["databases"] if d["database"] == "default"]
    assert default["waiting"] == 2 and 590 <= default["ahead"] <= 600
    assert "ahead of this host's clock" in default["note"]
    out = io.StringIO()
    call_command("cogworker", "outbox", stdout=out)
    assert "ahead of this host's clock" in out.getvalue()
    away.restart()
    changer = user("changer", "view_cogworker", "change_cogworker")
    assert "ahead of this host&#x27;s clock" in changer.get(URL).content.decode()
    response = changer.post(URL, {"action": "relay"}, follow=True)
    assert "2 job(s) relayed." in response.content.decode()
    assert sorted(json.loads(raw)["jid"] for raw in away.client().lrange(K.queue("default"), 0, -1)) == sorted(jids)
    assert waiting("default")[0] == 0


def test_the_metrics_show_each_databases_rows_waiting_and_the_oldests_age(away):
    wait_rows("pg", 2, age=90)
    away.restart()  # (Redis away, the page is a 503, a scrape that says "down": test_metrics.py)
    response = Client().get("/cogworker/metrics", HTTP_AUTHORIZATION="Bearer s3cret-token-for-the-scraper")
    found = {(s.name, tuple(sorted(s.labels.items()))): s.value
             for family in text_string_to_metric_families(response.content.decode()) for s in family.samples}
    assert found["cogworker_outbox_waiting", (("database", "pg"),)] == 2
    assert found["cogworker_outbox_waiting", (("database", "default"),)] == 0
    assert 90 <= found["cogworker_outbox_oldest_seconds", (("database", "pg"),)] < 120


def test_a_relay_warns_of_rows_waiting_longer_than_a_minute(away, caplog):
    wait_rows("default", 2, age=75)
    relay = Relay(runtime.get_client().hand_over, runtime.get_redis(), K)
    with caplog.at_level(logging.WARNING, logger="django_cogworker.outbox"):
        relay.start()
        try:
            wait_until(lambda: "2 job(s) waiting, the oldest for" in caplog.text, timeout=20)
        finally:
            relay.stop()
    assert "outbox of database 'default'" in caplog.text
    assert waiting("default")[0] == 2  # (Redis away: they still wait)


def test_the_system_check_names_an_outbox_database_without_its_table(settings):
    """A table not made yet is a warning (migrate, which makes it, runs the checks first and stops at
    an error); one gone while its migration is recorded applied is an error. On Django 6, which
    gives every check the list of databases, the check was skipped as if under migrate."""
    from django.db.migrations.recorder import MigrationRecorder

    def found(**kwargs):
        return [(m.id, m.hint) for m in checks.run_checks(**kwargs) if m.id in ("cogworker.E010", "cogworker.W010")]

    settings.COGWORKER = {**settings.COGWORKER, "OUTBOX": True}
    assert found() == []
    recorder = MigrationRecorder(connections["default"])
    with connections["default"].schema_editor() as editor:
        editor.delete_model(OutboxJob)
    try:
        for kwargs in ({}, {"databases": ["default"]}):  # (plain check; what migrate runs)
            ((code, hint),) = found(**kwargs)
            assert code == "cogworker.E010" and "0004 --fake --database default" in hint
        errors = [m for m in checks.run_checks() if m.id == "cogworker.E010"]
        assert "database 'default' has no outbox table" in errors[0].msg
        recorder.record_unapplied("django_cogworker", "0005_outbox")  # (not migrated yet)
        for kwargs in ({}, {"databases": ["default"]}):
            assert found(**kwargs) == [("cogworker.W010", "run: manage.py migrate django_cogworker --database default")]
        settings.COGWORKER = {**settings.COGWORKER, "OUTBOX": False}
        assert found() == []
    finally:
        recorder.record_applied("django_cogworker", "0005_outbox")
        with connections["default"].schema_editor() as editor:
            editor.create_model(OutboxJob)


def test_the_system_check_gives_up_on_an_outbox_database_that_never_answers_with_a_warning():
    """A database host that accepts and never answers: ``manage.py check`` (and runcogworker's start,
    which runs it) hung there silently, for good. Now it waits CONNECT_TIMEOUT and warns
    (cogworker.W011): an unreachable database is no reason to refuse to start."""
    with silent_port() as port:
        done = subprocess.run([sys.executable, "manage.py", "check"], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=120, env={**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.suite_settings",
                                                "COGWORKER_OUTBOX": "true",
                                                "COGWORKER_TEST_POSTGRES_URL": f"postgres://postgres@127.0.0.1:{port}/x"})
    assert done.returncode == 0, done.stderr
    assert "?: (cogworker.W011) COGWORKER[\"OUTBOX\"] is on, but database 'pg' is unreachable" in done.stderr
    assert "timeout" in done.stderr.split("database 'pg' is unreachable")[1].split("\n")[0]


def bury_a_batch(alias: str, server) -> tuple[Batch, list[str], list[str], str]:
    """A batch committed on ``alias`` while Redis was away, whose unit a relay then sent to dead half
    done: its first jobs pushed, then a queue key of the wrong type. Its progress and its jobs'
    marks are then gone, as MARK_TTL later; the queue key is mended. (batch, the jobs pushed, the
    jobs left, the unit's jid.)"""
    batch = Batch("buried")
    with transaction.atomic(using=alias):
        with batch.jobs():
            pushed = [Note.set(queue="first").perform_async(1)]
            left = Note.set(queue="blocked").perform_bulk([(2,), (3,)])
    unit = OutboxJob.objects.using(alias).get().jid
    server.restart()
    client = server.client()
    client.set(K.queue("blocked"), "a string, not a list")
    assert relay_once(alias, runtime.get_client().hand_over, client, K, now=time.time(), fresh=0) == 1
    assert queue_jids(client, "first") == pushed
    [dead] = [json.loads(raw) for raw in client.zrange(K.dead, 0, -1)]
    assert dead["unit_of"] == unit and "holds the wrong type" in dead["dead_reason"]
    # (And the pushers' receipts: each says its last push was written, as long.)
    client.delete(K.outbox_pushed(unit), K.outbox_marks(), K.queue("blocked"),
                  *client.scan_iter(K.push_receipt("*")))
    return batch, pushed, left, unit


def queue_jids(client, queue: str) -> list[str]:
    return [json.loads(raw)["jid"] for raw in reversed(client.lrange(K.queue(queue), 0, -1))]


def test_retry_all_from_the_admin_hands_a_dead_batch_back_to_the_outbox_and_it_runs_once(away, alias):
    batch, pushed, left, _unit = bury_a_batch(alias, away)
    client = away.client()
    # A plain job of an outbox row that went dead beside it keeps its retry: back to its queue.
    plain = {"class": Note.name, "jid": "plain", "queue": "default", "args": [], "kwargs": {},
             "dead_reason": "outbox row 1 (jid plain) can't be pushed"}
    client.zadd(K.dead, {json.dumps(plain): time.time()})
    changer = user("changer", "view_cogworker", "change_cogworker")
    response = changer.post("/admin/django_cogworker/dead/", {"action": "retry_all", "confirmed": "yes"},
                            follow=True)
    assert "Dead: 2 entries moved to their queues" in response.content.decode()
    assert client.zcard(K.dead) == 0
    assert queue_jids(client, "first") == pushed  # (not pushed again, its marks long gone)
    assert sorted(queue_jids(client, "blocked")) == sorted(left)
    assert queue_jids(client, "default") == ["plain"]
    status = Batch.status(batch.bid)
    assert (status.total, status.pending, status.committed) == (3, 3, True)
    assert OutboxJob.objects.using(alias).count() == 0 and OutboxJob.objects.count() == 0


@pytest.mark.parametrize("alias", ["default", "pg"])
def test_a_dead_unit_retried_twice_at_once_runs_once(away, alias):
    batch, pushed, left, unit = bury_a_batch(alias, away)
    client = away.client()
    [entry] = api.DeadSet().page().items
    again = api.DeadSet().find(entry.token, whole=True)  # (a second operator's, read before the first retried)
    assert entry.retry_now() is True
    assert again.retry_now() is False
    assert sorted(queue_jids(client, "blocked")) == sorted(left) and queue_jids(client, "first") == pushed
    assert Batch.status(batch.bid).total == 3
    assert OutboxJob.objects.count() == 0 and OutboxJob.objects.using(alias).count() == 0
    assert client.zcard(K.dead) == 0


def test_a_dead_unit_retried_while_still_broken_goes_back_to_dead_through_the_relay(away):
    _batch, _pushed, left, _unit = bury_a_batch("default", away)
    client = away.client()
    client.set(K.queue("blocked"), "broken again")
    [entry] = api.DeadSet().page().items
    assert entry.retry_now() is True  # (back in the outbox; its run refused: the relay's now)
    [row] = OutboxJob.objects.all()
    assert row.claimed_until == 0.0
    assert relay_once("default", runtime.get_client().hand_over, client, K, now=time.time(), fresh=0) == 1
    [dead] = [json.loads(raw) for raw in client.zrange(K.dead, 0, -1)]
    assert [job["jid"] for job in dead["unit"][0][3]] == left  # (still what it had left, no more)
    client.delete(K.queue("blocked"))
    out = io.StringIO()
    call_command("cogworker", "retry", "dead", dead["jid"], stdout=out)
    assert sorted(queue_jids(client, "blocked")) == sorted(left)
    assert client.zcard(K.dead) == 0 and OutboxJob.objects.count() == 0
