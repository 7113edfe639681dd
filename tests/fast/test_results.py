"""Job results (django_cogworker/features/results/records.py, writer.py): the opt-in record of a class job
with ``result_ttl``, nothing for a job without it, and the record on the admin's job page."""

from __future__ import annotations

import time
from urllib.parse import quote

import pytest
from admin_fixtures import zadd
from django.contrib.auth.models import User
from django.test import Client

from django_cogworker import api
from django_cogworker.broker.keys import Keys
from django_cogworker.features.results.records import FAILED, SUCCESSFUL, get_result
from django_cogworker.features.results.writer import ResultWriter

K = Keys()


def test_a_record_gone_is_not_made_again_from_half_its_fields(rb):
    writer = ResultWriter(rb, K, "host:1:abc")
    payload = {"jid": "j1", "class": "x.Y", "args": [], "queue": "default", "created_at": time.time()}
    writer.started(payload, 60)
    rb.delete(K.result("j1"))
    writer.finished(payload, 60, value="1")
    assert not rb.exists(K.result("j1"))
    running = writer.started({**payload, "jid": "j2"}, 60)
    assert api.job_result("j2", rb, K) == running and running.status == "RUNNING"
    with pytest.raises(ValueError, match="no return value"):
        running.return_value  # noqa: B018 - None is a value a job may return: unfinished raises


def test_a_result_key_of_the_wrong_type_is_moved_aside_and_the_record_written_afresh(rb, r):
    # (Each attempt logged its record unwritable and kept none: a task's result read as an error.)
    writer = ResultWriter(rb, K, "host:1:abc")
    payload = {"jid": "j1", "class": "x.Y", "args": [], "queue": "default", "created_at": time.time()}
    r.set(K.result("j1"), "not a hash")
    assert writer.started(payload, 60).status == "RUNNING"
    r.set(K.result("j1"), "not a hash")
    writer.finished(payload, 60, value="7")  # (a record gone is not made again: moved aside, nothing else)
    assert get_result("j1") is None
    r.set(K.result("j2"), "not a hash")
    assert get_result("j2") is None  # (a reader, too, moves it aside: no WRONGTYPE for the caller)
    assert len(list(r.scan_iter(match=f"{K.quarantine_prefix}{K.result('*')}:*"))) == 3


@pytest.mark.django_db
def test_the_admin_job_page_shows_the_result(rb):
    payload = {"jid": "dead1", "class": "testproject.demo.jobs.FailJob", "args": ["boom"], "kwargs": {},
               "queue": "default", "created_at": time.time(), "error_class": "RuntimeError",
               "error_message": "boom <b>"}
    writer = ResultWriter(rb, K, "host:1:abc")
    writer.started(payload, 60)
    try:
        raise RuntimeError("boom <b>")
    except RuntimeError as exc:
        writer.finished(payload, 60, error=exc, target="dead")
    token = zadd(rb, K.dead, payload, time.time())
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    page = client.get(f"/admin/django_cogworker/dead/job/{quote(token)}/").content.decode()
    assert "<h2>Result</h2>" in page and FAILED in page
    assert "RuntimeError: boom &lt;b&gt;" in page and "host:1:abc" in page


@pytest.mark.django_db
def test_the_admin_dashboard_looks_a_result_up_by_jid(rb):
    payload = {"jid": "done1", "class": "testproject.demo.jobs.ResultJob", "args": [2, 3], "kwargs": {},
               "queue": "default", "created_at": time.time()}
    writer = ResultWriter(rb, K, "host:1:abc")
    writer.started(payload, 60)
    writer.finished(payload, 60, value='{"sum": "<5>"}')
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    page = client.get("/admin/django_cogworker/dashboard/", {"result": "done1"}).content.decode()
    assert "<h2>Result</h2>" in page and SUCCESSFUL in page and "testproject.demo.jobs.ResultJob" in page
    assert "&lt;5&gt;" in page and "<5>" not in page
    missing = client.get("/admin/django_cogworker/dashboard/", {"result": "<nope>"}).content.decode()
    assert "No result for &lt;nope&gt;" in missing
