"""The Profiles pages (features/profiling/admin_views.py) through Django's test client: the list and a
profile's page escape what a job's code names, pyinstrument's view is sandboxed by its
Content-Security-Policy (or a download), and "Run profiled" enqueues a waiting entry marked."""

from __future__ import annotations

import json
import time

import pytest
from admin_fixtures import KEYS, RECORD_JOB, failed, zadd
from django.contrib.auth.models import Permission, User
from django.test import Client

from django_cogworker.features.profiling import records
from django_cogworker.features.profiling.admin_views import HTML_POLICY, STORAGE_SHIM

pytestmark = pytest.mark.django_db
BASE = "/admin/django_cogworker/profiles/"
XSS = "<script>alert('x')</script>"


def client_with(*perms: str) -> Client:
    user = User.objects.create_user("-".join(perms), password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="django_cogworker", codename__in=perms))
    client = Client()
    client.force_login(user)
    return client


def kept(rb, ident: str = "a" * 16, html: str | None = None, **fields) -> records.Profile:
    profile = records.Profile(ident, fields.pop("label", XSS), "jid-1", fields.pop("job_class", f"app.{XSS}"),
                              "default", started=time.time(), elapsed=0.25, profiler="cProfile",
                              error=f"RuntimeError: {XSS}",
                              top=[{"function": "<img src=x onerror=alert(1)>", "where": "/app/jobs.py:3",
                                    "calls": 5, "cumtime": 0.2, "tottime": 0.1}], **fields)
    records.save(rb, KEYS, profile, html)
    return profile


def test_the_list_and_a_profile_s_page_escape_what_the_job_s_code_names(rb):
    viewer = client_with("view_cogworker")
    kept(rb)
    listing = viewer.get(BASE).content.decode()
    assert XSS not in listing and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in listing
    assert f'href="{BASE}{"a" * 16}/"' in listing and "0.250 s" in listing
    page = viewer.get(f"{BASE}{'a' * 16}/").content.decode()
    assert XSS not in page and "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "/app/jobs.py:3" in page and "RuntimeError: &lt;script&gt;" in page
    assert "pyinstrument&#x27;s view" not in page and "pyinstrument's view" not in page  # (no HTML kept)
    assert viewer.get(f"{BASE}{'a' * 16}/html/").status_code == 404


def test_a_profile_gone_sends_back_to_the_list_saying_so(rb):
    response = client_with("view_cogworker").get(f"{BASE}{'b' * 16}/", follow=True)
    assert response.redirect_chain[-1][0] == BASE and "no longer kept" in response.content.decode()
    # (an id the hook never makes names no key: "*" or another key's name is never read)
    rb.hset(KEYS.profile("*"), mapping={"label": "not a profile"})
    odd = client_with("change_cogworker").get(f"{BASE}*/", follow=True)
    assert odd.redirect_chain[-1][0] == BASE and "not a profile" not in odd.content.decode()


def test_pyinstrument_s_view_is_sandboxed_by_its_policy_or_downloaded(rb):
    viewer = client_with("view_cogworker")
    kept(rb, html="<!DOCTYPE html><html><head></head><script>document.title = 'tree'</script></html>")
    assert "pyinstrument" in viewer.get(f"{BASE}{'a' * 16}/").content.decode()
    shown = viewer.get(f"{BASE}{'a' * 16}/html/")
    made = "<!DOCTYPE html><html><head></head><script>document.title = 'tree'</script></html>"
    assert shown.status_code == 200 and shown.content.decode() == made.replace("<head>", "<head>" + STORAGE_SHIM)
    policy = shown["Content-Security-Policy"]
    assert policy == HTML_POLICY and "sandbox allow-scripts" in policy and "allow-same-origin" not in policy
    assert "default-src 'none'" in policy and shown["X-Content-Type-Options"] == "nosniff"
    assert "Content-Disposition" not in shown
    downloaded = viewer.get(f"{BASE}{'a' * 16}/html/?download=1")
    assert downloaded["Content-Disposition"] == f'attachment; filename="profile-{"a" * 16}.html"'
    assert downloaded.content.decode().startswith("<!DOCTYPE html><html><head></head>")  # (as pyinstrument made it)


def test_run_profiled_enqueues_a_dead_entry_marked_and_a_bad_request_changes_nothing(rb):
    changer = client_with("change_cogworker")
    token = zadd(rb, KEYS.dead, failed(klass=RECORD_JOB, args=["x"]), time.time() - 5)
    bad = changer.post(f"{BASE}run/", {"profile_entry": f"queue:{token}"}, follow=True)
    assert "Name the entry to run profiled." in bad.content.decode() and rb.zcard(KEYS.dead) == 1
    response = changer.post(f"{BASE}run/", {"profile_entry": f"dead:{token}", "next": "/admin/django_cogworker/dead/"})
    assert response.status_code == 302 and response["Location"] == "/admin/django_cogworker/dead/"
    [raw] = rb.lrange(KEYS.queue("default"), 0, -1)
    assert json.loads(raw)["profile"] == "admin: change_cogworker" and rb.zcard(KEYS.dead) == 0
    again = changer.post(f"{BASE}run/", {"profile_entry": f"dead:{token}"}, follow=True)
    assert "no longer there" in again.content.decode()
    assert changer.get(f"{BASE}run/").status_code == 405


def test_the_sets_offer_run_profiled_to_those_who_may_change_only(rb):
    token = zadd(rb, KEYS.retry, failed(klass=RECORD_JOB, args=["x"]), time.time() + 60)
    button = f'name="profile_entry" value="retry:{token}"'
    assert button in client_with("change_cogworker").get("/admin/django_cogworker/retry/").content.decode()
    assert button not in client_with("view_cogworker").get("/admin/django_cogworker/retry/").content.decode()
