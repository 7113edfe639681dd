"""The Cogworker admin pages through Django's test client: rendering, actions, permissions, escaping."""

from __future__ import annotations

import json
import re
import time
from html import unescape
from urllib.parse import quote

import pytest
import redis
from admin_fixtures import KEYS, RECORD_JOB, XSS, XSS_ESCAPED, XSS_QUEUE, failed, fake_process, job, push, seed, zadd
from django.contrib.auth.models import Permission, User
from django.test import Client
from helpers import wait_until

from django_cogworker import api
from django_cogworker.push import payload as payloads

# (Every database: the Outbox page reads the outbox of each, "pg" and "mysql" too.)
pytestmark = pytest.mark.django_db(databases=["default", "pg", "mysql"])

BASE = "/admin/django_cogworker/"
PAGES = ["dashboard/", "queue/", "busy/", "scheduled/", "retry/", "dead/", "batches/", "limits/", "metrics/",
         "profiles/", "periodic/", "quarantine/", "outbox/"]


@pytest.fixture
def seeded(rb):
    return seed(rb)


def _user(name: str, *perms: str, staff: bool = True) -> User:
    user = User.objects.create_user(name, password="pw", is_staff=staff)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="django_cogworker",
                                                        codename__in=perms))
    return user


def _client(user: User | None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


@pytest.fixture
def admin_client():
    return _client(User.objects.create_superuser("root", password="pw"))


@pytest.fixture
def viewer():
    return _client(_user("viewer", "view_cogworker"))


@pytest.fixture
def changer():
    return _client(_user("changer", "change_cogworker"))


def all_urls(seeded) -> list[str]:
    token_urls = [f"{BASE}{page}/job/{quote(seeded[page])}/" for page in ("scheduled", "retry", "dead")]
    return ([BASE + p for p in PAGES] + [BASE, f"{BASE}queue/default/", f"{BASE}queue/{quote(XSS_QUEUE)}/",
                                         f"{BASE}dashboard/?refresh=5", f"{BASE}dead/?job={RECORD_JOB}&q=seed",
                                         f"{BASE}batches/{seeded['batch']}/", f"{BASE}limits/stripe/",
                                         f"{BASE}limits/{quote('customer:' + XSS)}/"]
            + token_urls)


def all_actions(seeded) -> list[tuple[str, dict]]:
    """Every POST the pages offer, confirmed where they ask first."""
    yes = {"confirmed": "yes"}
    actions = [("queue/", {"action": "pause", "queue": "default"}),
               ("queue/", {"action": "unpause", "queue": "default"}),
               ("queue/", {"action": "clear", "queue": "default", **yes}), ("queue/", {"action": "prune"}),
               ("busy/", {"action": "quiet", "identity": seeded["process"]}),
               ("busy/", {"action": "stop", "identity": seeded["process"], **yes}),
               ("busy/", {"action": "dump", "identity": seeded["process"]}),
               ("scheduled/", {"action": "enqueue", "token": seeded["scheduled"]}),
               ("scheduled/", {"row_action": f"delete {seeded['scheduled']}"}),
               ("scheduled/", {"action": "enqueue_all", **yes}), ("scheduled/", {"action": "delete_all", **yes}),
               ("retry/", {"row_action": f"retry {seeded['retry']}"}), ("retry/", {"action": "kill",
                                                                                  "token": seeded["retry"]}),
               ("retry/", {"action": "delete", "token": seeded["retry"]}), ("retry/", {"action": "retry_all", **yes}),
               ("retry/", {"action": "delete_all", **yes}),
               ("dead/", {"row_action": f"retry {seeded['dead']}"}), ("dead/", {"action": "delete",
                                                                               "token": seeded["dead"]}),
               ("dead/", {"action": "retry_all", **yes}), ("dead/", {"action": "delete_all", **yes}),
               ("periodic/", {"action": "disable", "pjid": "nightly-report"}),
               ("periodic/", {"action": "enable", "pjid": "nightly-report"}),
               ("periodic/", {"action": "enqueue", "pjid": "nightly-report"}),
               ("periodic/", {"action": "forget", "pjid": "nightly-report"}),
               ("quarantine/", {"action": "restore", "key": seeded["quarantined"]}),
               ("quarantine/", {"action": "delete", "key": seeded["quarantined"], **yes}),
               ("busy/cancel/", {"jid": seeded["queued"]}),
               ("busy/cancel/", {"jid": seeded["running"], "interrupt": "yes", **yes}),
               ("profiles/run/", {"profile_entry": f"dead:{seeded['dead']}"})]
    return [(BASE + page, data) for page, data in actions]


def snapshot(rb) -> dict:
    """Everything an action could change."""
    return {key: (rb.type(key), rb.dump(key)) for key in sorted(rb.keys("*")) if b":signals:" not in key
            and b":process:" not in key}


# -- rendering ---------------------------------------------------------------


def test_every_page_renders_with_its_data(admin_client, seeded):
    for url in all_urls(seeded):
        response = admin_client.get(url)
        assert response.status_code == 200, url
    content = {p: admin_client.get(BASE + p).content.decode() for p in PAGES}
    assert "123,456" in content["dashboard/"] and "<svg" in content["dashboard/"]
    assert "Europe/Paris" in content["periodic/"] and "0 3 * * *" in content["periodic/"]
    assert "cogworker:queue:broken" in content["quarantine/"] and "hash" in content["quarantine/"]
    assert "host:4242:abc123" in content["busy/"] and "running" in content["busy/"]
    assert content["retry/"].count('name="token"') == 2
    detail = admin_client.get(f"{BASE}retry/job/{quote(seeded['retry'])}/").content.decode()
    assert "Traceback (most recent call last):" in detail and "RuntimeError" in detail


def test_dashboard_shows_live_counts_latency_and_redis(admin_client, seeded):
    page = admin_client.get(BASE + "dashboard/?refresh=5").content.decode()
    assert '<meta http-equiv="refresh" content="5">' in page
    assert "Redis" in page and redis.__name__ and "Connected clients" in page
    assert ">5<" in page  # enqueued: 3 default + 1 mail + 1 evil
    stats = api.Stats()
    assert stats.redis_info["version"] in page
    assert page.count("<rect") == 60  # 30 days x (processed, failed)


def test_the_dashboard_chart_keeps_its_coordinates_in_a_locale_with_a_decimal_comma(viewer, seeded, settings):
    # Floats are localized in templates: under "de", a bar's x of 58.8 was written "58,8", no number.
    import re

    settings.LANGUAGE_CODE = "de"
    page = viewer.get(BASE + "dashboard/", HTTP_ACCEPT_LANGUAGE="de").content.decode()
    assert 'lang="de"' in page
    coordinates = re.findall(r'<rect class="\w+" x="([^"]*)" y="([^"]*)" width="([^"]*)" height="([^"]*)"', page)
    assert len(coordinates) == 60
    assert all(float(value) >= 0 for rect in coordinates for value in rect)


def test_admin_index_and_app_index_list_the_pages(admin_client, seeded):
    for url in ("/admin/", "/admin/django_cogworker/"):
        page = admin_client.get(url).content.decode()
        assert "Cogworker" in page
        for p in PAGES:
            assert f'href="{BASE}{p}"' in page, (url, p)


def test_the_admin_index_lists_the_dashboard_first_with_a_view_link(admin_client, viewer, seeded):
    # It listed Busy before Dashboard (sorted by name), and "Change" on the read-only dashboard.
    for client in (admin_client, viewer):
        page = client.get("/admin/").content.decode()
        links = re.findall(rf'<a href="{BASE}([a-z]+)/" class="(viewlink|changelink)"', page)
        assert links[0] == ("dashboard", "viewlink"), links
        assert [name for name, _ in links] == ["dashboard", "dead", "batches", "limits", "metrics", "outbox",
                                                "periodic", "busy", "profiles", "quarantine", "queue", "retry",
                                                "scheduled"]
    links = dict(re.findall(rf'<a href="{BASE}([a-z]+)/" class="(viewlink|changelink)"',
                            admin_client.get("/admin/").content.decode()))
    assert {name for name, kind in links.items() if kind == "changelink"} == {
        "queue", "busy", "scheduled", "retry", "dead", "periodic", "quarantine", "outbox"}
    links = dict(re.findall(rf'<a href="{BASE}([a-z]+)/" class="(viewlink|changelink)"',
                            viewer.get("/admin/").content.decode()))
    assert set(links.values()) == {"viewlink"}
    assert ">Processes<" in admin_client.get(BASE + "busy/").content.decode()
    assert ">Job batches<" in admin_client.get(BASE + "batches/").content.decode()


def test_queue_jobs_are_paginated(admin_client, rb):
    from admin_fixtures import push

    for i in range(30):
        push(rb, job(args=[f"n{i}"]))
    first = admin_client.get(f"{BASE}queue/default/?per_page=25").content.decode()
    second = admin_client.get(f"{BASE}queue/default/?per_page=25&page=2").content.decode()
    assert "n29" in first and "n5" in first and "n4" not in first
    assert "n4" in second and "n0" in second and "page 2 of 2" in second


def test_sorted_set_filters_and_pages(admin_client, rb):
    now = time.time()
    for i in range(60):
        zadd(rb, KEYS.dead, failed(klass=RECORD_JOB if i % 2 else "x.Other", message=f"m{i}"), now - i)
    page = admin_client.get(f"{BASE}dead/?per_page=25").content.decode()
    assert "page 1 of 3" in page and "m0" in page and "m25" not in page
    page = admin_client.get(f"{BASE}dead/?job={RECORD_JOB}&per_page=25&page=2").content.decode()
    assert "30 matches" in page and "page 2 of 2" in page and "Searched all 60 entries" in page
    page = admin_client.get(f"{BASE}dead/?q=m17").content.decode()
    assert "1 match" in page and "m17" in page


def test_gone_entry_detail_redirects_with_a_message(admin_client, seeded, rb):
    rb.delete(KEYS.dead)
    response = admin_client.get(f"{BASE}dead/job/{quote(seeded['dead'])}/", follow=True)
    assert response.redirect_chain[-1][0] == BASE + "dead/"
    assert "no longer there" in response.content.decode()


# -- actions -----------------------------------------------------------------


def test_queue_pause_unpause_and_clear_after_confirmation(changer, seeded):
    changer.post(BASE + "queue/", {"action": "pause", "queue": "default"})
    assert api.Queue("default").paused
    changer.post(BASE + "queue/", {"action": "unpause", "queue": "default"})
    assert not api.Queue("default").paused
    asked = changer.post(BASE + "queue/", {"action": "clear", "queue": "default"})
    assert asked.status_code == 200 and "Delete all 3 jobs" in asked.content.decode()
    assert 'name="confirmed" value="yes"' in asked.content.decode()
    assert api.Queue("default").size() == 3
    done = changer.post(BASE + "queue/", {"action": "clear", "queue": "default", "confirmed": "yes"}, follow=True)
    assert api.Queue("default").size() == 0 and "3 jobs deleted" in done.content.decode()


def test_busy_signals_reach_the_process_signal_list(changer, seeded, rb):
    identity = seeded["process"]
    for action in ("quiet", "dump"):
        assert changer.post(BASE + "busy/", {"action": action, "identity": identity}).status_code == 302
    assert changer.post(BASE + "busy/", {"action": "stop", "identity": identity}).status_code == 200  # asks
    changer.post(BASE + "busy/", {"action": "stop", "identity": identity, "confirmed": "yes"})
    assert rb.lrange(KEYS.signals(identity), 0, -1) == [b"stop", b"dump", b"quiet"]
    assert 0 < rb.ttl(KEYS.signals(identity)) <= 60
    gone = changer.post(BASE + "busy/", {"action": "quiet", "identity": "nobody"}, follow=True)
    assert "no longer running" in gone.content.decode()


def test_scheduled_actions(changer, seeded, rb):
    changer.post(BASE + "scheduled/", {"row_action": f"enqueue {seeded['scheduled']}"})
    assert api.ScheduledSet().size() == 1 and api.Queue("default").size() == 4
    changer.post(BASE + "scheduled/", {"action": "delete", "token": [seeded["scheduled_2"]]})
    assert api.ScheduledSet().size() == 0


def test_retry_actions_per_row_selected_and_all(changer, seeded, rb):
    changer.post(BASE + "retry/", {"action": "kill", "token": [seeded["retry"]]})
    assert api.RetrySet().size() == 1 and api.DeadSet().size() == 3
    killed = api.DeadSet().page(1, 1).items[0]
    assert killed.payload["dead_reason"] == api.KILLED_REASON
    changer.post(BASE + "retry/", {"row_action": f"retry {seeded['retry_2']}"})
    assert api.RetrySet().size() == 0 and api.Queue("default").size() == 4
    gone = changer.post(BASE + "retry/", {"row_action": f"retry {seeded['retry_2']}"}, follow=True)
    assert "no longer there" in gone.content.decode()


def test_dead_retry_all_and_delete_all_ask_first(changer, seeded):
    asked = changer.post(BASE + "dead/", {"action": "retry_all"})
    assert asked.status_code == 200 and "Retry all 2 entries of Dead?" in asked.content.decode()
    assert api.DeadSet().size() == 2
    done = changer.post(BASE + "dead/", {"action": "retry_all", "confirmed": "yes"}, follow=True)
    assert api.DeadSet().size() == 0 and "2 entries moved" in done.content.decode()
    changer.post(BASE + "retry/", {"action": "delete_all"})
    assert api.RetrySet().size() == 2
    changer.post(BASE + "retry/", {"action": "delete_all", "confirmed": "yes"})
    assert api.RetrySet().size() == 0


def test_job_detail_actions_post_to_the_list(changer, seeded):
    page = changer.get(f"{BASE}dead/job/{quote(seeded['dead'])}/").content.decode()
    assert f'action="{BASE}dead/"' in page and f'value="delete {seeded["dead"]}"' in page
    response = changer.post(BASE + "dead/", {"row_action": f"delete {seeded['dead']}", "next": BASE + "dead/"})
    assert response.status_code == 302 and response["Location"] == BASE + "dead/"
    assert api.DeadSet().find(seeded["dead"]) is None


def test_an_entry_no_process_declares_is_marked_and_can_be_forgotten(changer, seeded, rb):
    assert 'value="forget"' not in changer.get(BASE + "periodic/").content.decode()
    spec = json.loads(rb.hget(KEYS.periodic_schedule, "nightly-report"))
    spec["published_at"] = time.time() - api.periodic.STALE_AFTER - 60  # taken out of the settings
    rb.hset(KEYS.periodic_schedule, "nightly-report", json.dumps(spec))
    page = changer.get(BASE + "periodic/").content.decode()
    assert ">declared by no live process</span>" in page and 'value="forget"' in page
    changer.post(BASE + "periodic/", {"action": "forget", "pjid": "nightly-report"})
    assert not rb.hexists(KEYS.periodic_schedule, "nightly-report")
    assert 'name="pjid" value="nightly-report"' not in changer.get(BASE + "periodic/").content.decode()


def test_periodic_enable_disable_enqueue(changer, seeded, rb):
    changer.post(BASE + "periodic/", {"action": "disable", "pjid": "nightly-report"})
    assert rb.sismember(KEYS.periodic_disabled, "nightly-report")
    assert "disabled" in changer.get(BASE + "periodic/").content.decode()
    changer.post(BASE + "periodic/", {"action": "enable", "pjid": "nightly-report"})
    assert not rb.sismember(KEYS.periodic_disabled, "nightly-report")
    changer.post(BASE + "periodic/", {"action": "enqueue", "pjid": "nightly-report"})
    (pushed,) = [j for j in api.Queue("default").jobs(1, 10).items if j.args == ["periodic:ran", XSS]]
    assert pushed.display_class == RECORD_JOB


def test_quarantine_restore_only_when_the_original_is_free_then_delete(changer, seeded, rb):
    name = seeded["quarantined"]
    rb.rpush(KEYS.queue("broken"), "a fresh job")  # work carried on with a fresh key
    refused = changer.post(BASE + "quarantine/", {"action": "restore", "key": name}, follow=True)
    assert "exists" in refused.content.decode() and rb.exists(name)
    rb.delete(KEYS.queue("broken"))
    changer.post(BASE + "quarantine/", {"action": "restore", "key": name})
    assert not rb.exists(name) and rb.type(KEYS.queue("broken")) == b"hash" and rb.ttl(KEYS.queue("broken")) == -1
    rb.rename(KEYS.queue("broken"), name)
    assert changer.post(BASE + "quarantine/", {"action": "delete", "key": name}).status_code == 200  # asks
    assert rb.exists(name)
    changer.post(BASE + "quarantine/", {"action": "delete", "key": name, "confirmed": "yes"})
    assert not rb.exists(name)


def test_next_must_stay_on_this_site(changer, seeded):
    response = changer.post(BASE + "queue/", {"action": "pause", "queue": "default", "next": "https://evil.test/"})
    assert response["Location"] == BASE + "queue/"
    response = changer.post(BASE + "queue/", {"action": "pause", "queue": "default", "next": BASE + "dashboard/"})
    assert response["Location"] == BASE + "dashboard/"


def test_unknown_actions_are_refused_without_effect(changer, seeded, rb):
    before = snapshot(rb)
    for page, data in (("queue/", {"action": "flush", "queue": "default"}),
                       ("dead/", {"action": "kill", "token": seeded["dead"]}),
                       ("busy/", {"action": "explode", "identity": seeded["process"]})):
        response = changer.post(BASE + page, data, follow=True)
        assert "Unknown action" in response.content.decode(), page
    assert snapshot(rb) == before


# -- permissions -------------------------------------------------------------


def test_view_only_staff_can_look_at_every_page_without_action_buttons(viewer, seeded):
    for url in all_urls(seeded):
        response = viewer.get(url)
        assert response.status_code == 200, url
        assert 'name="action"' not in response.content.decode(), url
        assert 'name="row_action"' not in response.content.decode(), url


def test_view_only_staff_is_denied_every_action(viewer, seeded, rb):
    before = snapshot(rb)
    actions = all_actions(seeded)
    assert len(actions) == 29
    for url, data in actions:
        for payload in (data, {k: v for k, v in data.items() if k != "confirmed"}):
            assert viewer.post(url, payload).status_code == 403, (url, payload)
    assert snapshot(rb) == before
    assert not rb.exists(KEYS.signals(seeded["process"]))


def test_change_permission_allows_every_action(changer, seeded):
    for url, data in all_actions(seeded):
        assert changer.post(url, data).status_code in (200, 302), (url, data)


def test_staff_without_the_permissions_sees_nothing(seeded):
    client = _client(_user("staff"))
    assert client.get(BASE + "dashboard/").status_code == 403
    assert client.post(BASE + "queue/", {"action": "pause", "queue": "default"}).status_code == 403
    assert "Cogworker" not in client.get("/admin/").content.decode()


def test_anonymous_and_non_staff_are_sent_to_the_login(seeded):
    for client in (Client(), _client(_user("customer", "change_cogworker", staff=False))):
        for url in all_urls(seeded):
            response = client.get(url)
            assert response.status_code == 302 and response["Location"].startswith("/admin/login/"), url
        for url, data in all_actions(seeded):
            response = client.post(url, data)
            assert response.status_code == 302 and response["Location"].startswith("/admin/login/"), url
    assert not api.Queue("default").paused and api.DeadSet().size() == 2


def test_posts_need_the_csrf_token(seeded):
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_superuser("root", password="pw"))
    assert client.post(BASE + "queue/", {"action": "pause", "queue": "default"}).status_code == 403
    assert not api.Queue("default").paused


def test_pages_without_actions_refuse_posts(admin_client, seeded):
    for url in (BASE + "dashboard/", f"{BASE}queue/default/", f"{BASE}dead/job/{quote(seeded['dead'])}/",
                BASE + "batches/", f"{BASE}batches/{seeded['batch']}/", BASE + "limits/", f"{BASE}limits/stripe/"):
        assert admin_client.post(url, {"action": "clear"}).status_code == 405, url


# -- escaping ----------------------------------------------------------------


def test_payload_data_is_escaped_everywhere(admin_client, seeded, changer):
    seen = 0
    for url in all_urls(seeded):
        page = admin_client.get(url).content.decode()
        assert XSS not in page, url
        assert "<script>alert" not in page, url
        seen += XSS_ESCAPED in page
    assert seen >= 10
    # Messages and the confirmation page echo user-controlled names too.
    response = changer.post(BASE + "queue/", {"action": "clear", "queue": XSS_QUEUE})
    assert XSS not in response.content.decode() and XSS_ESCAPED in response.content.decode()
    response = changer.post(BASE + "queue/", {"action": "pause", "queue": XSS_QUEUE}, follow=True)
    assert XSS not in response.content.decode() and XSS_ESCAPED in response.content.decode()


# -- garbage in Redis: every page reads what it can and keeps the entry deletable ----------


def _raw_dead(rb, text: str, score: float = 1_000.0) -> None:
    rb.zadd(KEYS.dead, {text.encode(): score})


def _delete_every_row(client, page: str) -> None:
    """Delete each listed row through its own button; the set must end empty."""
    listing = client.get(BASE + page).content.decode()
    tokens = re.findall(r'value="delete ([^"]+)"', listing)
    assert tokens, listing
    for token in tokens:
        assert client.post(BASE + page, {"row_action": f"delete {unescape(token)}"}).status_code == 302


def _shows_and_deletes(client, rb, page: str, key: str, *shown: str) -> None:
    listing = client.get(BASE + page)
    assert listing.status_code == 200
    text = listing.content.decode()
    for piece in shown:
        assert piece in text, piece
    for href in re.findall(rf'href="({BASE}{page}job/[^"]+)"', text):
        assert client.get(unescape(href)).status_code == 200, href
    _delete_every_row(client, page)
    assert rb.zcard(key) == 0


def test_a_jid_holding_a_slash_is_listed_opened_and_deleted(admin_client, rb):
    _raw_dead(rb, '{"jid":"tenant/42","class":"x.Job","args":[1],"queue":"default","error_message":"slashed"}')
    _shows_and_deletes(admin_client, rb, "dead/", KEYS.dead, "tenant/42", "slashed")


def test_infinite_scores_are_listed_opened_and_deleted(admin_client, rb):
    rb.zadd(KEYS.retry, {payloads.encode(failed(message="sky-high")): float("inf"),
                         payloads.encode(failed(message="bottomless")): float("-inf")})
    _shows_and_deletes(admin_client, rb, "retry/", KEYS.retry, "sky-high", "bottomless")


def test_args_nested_950_deep_are_listed_opened_and_deleted(admin_client, rb):
    deep = "[" * 950 + "]" * 950
    _raw_dead(rb, f'{{"jid":"deep1","class":"x.Job","args":{deep},"queue":"default","error_message":"abyss"}}')
    push(rb, job(args=["shallow"]))
    rb.lpush(KEYS.queue("default"), f'{{"jid":"deep2","class":"x.Job","args":{deep},"queue":"default"}}')
    assert admin_client.get(f"{BASE}queue/default/").status_code == 200
    _shows_and_deletes(admin_client, rb, "dead/", KEYS.dead, "deep1", "abyss")


def test_a_lone_surrogate_in_args_or_error_is_shown_escaped_and_deletable(admin_client, rb):
    _raw_dead(rb, '{"jid":"sur1","class":"x.Job","args":["\\ud800"],"queue":"default","error_message":"bad \\udfff"}')
    rb.lpush(KEYS.queue("default"), '{"jid":"sur2","class":"x.Job","args":["\\ud800"],"queue":"default"}')
    rb.sadd(KEYS.queues, "default")
    assert "sur2" in admin_client.get(f"{BASE}queue/default/").content.decode()
    _shows_and_deletes(admin_client, rb, "dead/", KEYS.dead, "sur1", "bad \\udfff")


def test_timestamps_out_of_range_are_left_blank(admin_client, rb):
    rb.sadd(KEYS.queues, "default")
    rb.lpush(KEYS.queue("default"), '{"jid":"old1","class":"x.Job","args":[],"queue":"default","enqueued_at":-1e999}')
    _raw_dead(rb, '{"jid":"old2","class":"x.Job","args":[],"queue":"default","failed_at":1e999,"created_at":-1e999}')
    for url in (BASE + "dashboard/", BASE + "queue/", f"{BASE}queue/default/"):
        assert admin_client.get(url).status_code == 200, url
    assert "old1" in admin_client.get(f"{BASE}queue/default/").content.decode()
    _shows_and_deletes(admin_client, rb, "dead/", KEYS.dead, "old2")


@pytest.mark.parametrize("info", [{"concurrency": "abc"}, {"concurrency": [1]}, {"concurrency": 1e999},
                                  {"queues": 5}])
def test_process_info_of_the_wrong_types_is_shown_leniently(admin_client, rb, info):
    identity = fake_process(rb)
    stored = json.loads(rb.hget(KEYS.process(identity), "info"))
    text = json.dumps({**stored, **info}).replace("Infinity", "1e999")
    rb.hset(KEYS.process(identity), "info", text)
    assert admin_client.get(BASE + "dashboard/").status_code == 200
    busy = admin_client.get(BASE + "busy/")
    assert busy.status_code == 200 and identity in busy.content.decode()


def test_unreadable_queue_names_are_listed_and_can_be_removed(admin_client, rb):
    rb.sadd(KEYS.queues, b"", b"caf\xc3", "default")
    rb.sadd(KEYS.paused_queues, b"\xff\xfe")
    push(rb, job(args=["kept"]))
    for url in (BASE + "dashboard/", BASE + "queue/"):
        response = admin_client.get(url)
        assert response.status_code == 200, url
        assert "caf\\xc3" in response.content.decode() and "\\xff\\xfe" in response.content.decode(), url
    page = admin_client.get(BASE + "queue/").content.decode()
    (hexed,) = re.findall(r'name="queue_hex" value="(fffe)"', page)
    admin_client.post(BASE + "queue/", {"action": "unpause", "queue_hex": hexed})
    assert rb.smembers(KEYS.paused_queues) == set()
    admin_client.post(BASE + "queue/", {"action": "prune", "confirmed": "yes"})
    assert rb.smembers(KEYS.queues) == {b"default"}


@pytest.mark.parametrize("query", ["?page=99999999999999999999",
                                   "?page=99999999999999999999&per_page=99999999999999999999"])
def test_page_numbers_out_of_range_show_a_page(admin_client, rb, query):
    zadd(rb, KEYS.dead, failed(message="the only one"), 10.0)
    push(rb, job(args=["queued-one"]))
    for url, shown in ((BASE + "dead/", "the only one"), (f"{BASE}queue/default/", "queued-one"),
                       (BASE + "queue/", "default")):
        response = admin_client.get(url + query)
        assert response.status_code == 200, url
        assert shown in response.content.decode(), url


# -- poison: a payload Python reads and can't write back -------------------------------------

POISON_1E309 = '{"jid":"poison1","class":"x.Job","args":[1e309],"queue":"default","error_message":"inf"}'
# A queue name Redis can't be sent (a lone surrogate in args is written as its escape: no poison).
POISON_SURROGATE = '{"jid":"poison2","class":"x.Job","args":[],"queue":"tenant-\\udc00","error_message":"sur"}'


def test_retry_all_moves_the_good_entries_past_poison_ones_and_buries_those(changer, rb):
    rb.zadd(KEYS.retry, {POISON_1E309: 1.0, POISON_SURROGATE: 2.0})
    for i in range(3):
        zadd(rb, KEYS.retry, failed(message=f"good{i}"), 10.0 + i)
    done = changer.post(BASE + "retry/", {"action": "retry_all", "confirmed": "yes"}, follow=True)
    assert done.status_code == 200
    assert "3 entries moved" in done.content.decode() and "2 that can" in done.content.decode()
    assert rb.llen(KEYS.queue("default")) == 3 and rb.zcard(KEYS.retry) == 0
    buried = {e.jid: e for e in api.DeadSet().page().items}
    assert set(buried) == {"poison1", "poison2"}
    for entry in buried.values():
        assert "can't be written back" in entry.payload["dead_reason"] and entry.queue is None
    assert '"args":[1e309]' in buried["poison1"].payload["raw"]  # the stored text is kept


def test_poison_in_dead_stays_marked_while_the_good_ones_retry(changer, rb):
    rb.zadd(KEYS.dead, {POISON_SURROGATE: 1.0})
    zadd(rb, KEYS.dead, failed(message="good"), 5.0)
    listing = changer.get(BASE + "dead/").content.decode()
    assert "can&#x27;t be written back" in listing
    (token,) = re.findall(r'value="retry (1\.0\|[^"]+)"', listing)
    refused = changer.post(BASE + "dead/", {"row_action": f"retry {unescape(token)}"}, follow=True)
    assert refused.status_code == 200 and "stays in dead" in refused.content.decode()
    changer.post(BASE + "dead/", {"action": "retry_all", "confirmed": "yes"})
    assert rb.llen(KEYS.queue("default")) == 1
    assert rb.zrange(KEYS.dead, 0, -1) == [POISON_SURROGATE.encode()]


def test_retry_now_of_a_poison_retry_sends_it_to_dead(changer, rb):
    rb.zadd(KEYS.retry, {POISON_1E309: 1.0})
    listing = changer.get(BASE + "retry/").content.decode()
    (token,) = re.findall(r'value="retry ([^"]+)"', listing)
    response = changer.post(BASE + "retry/", {"row_action": f"retry {unescape(token)}"}, follow=True)
    assert response.status_code == 200 and "sent to dead" in response.content.decode()
    assert rb.zcard(KEYS.retry) == 0 and api.DeadSet().page().items[0].jid == "poison1"


# -- pages cost what they show ---------------------------------------------------------------

BIG = 2_000_000  # bytes of each big entry's args


def _net_out(rb) -> int:
    return int(rb.info("stats")["total_net_output_bytes"])


def _big_dead(rb, n: int) -> list[str]:
    return [zadd(rb, KEYS.dead, failed(args=["x" * BIG], message=f"needle-{i}"), 100.0 + i) for i in range(n)]


def test_a_list_of_big_entries_reads_and_shows_a_bounded_part_of_each(viewer, rb):
    _big_dead(rb, 5)
    before = _net_out(rb)
    page = viewer.get(BASE + "dead/")
    read = _net_out(rb) - before
    assert page.status_code == 200 and read < 100_000, read
    text = page.content.decode()
    assert len(text) < 100_000 and text.count("shown in part") == 5 and "needle-4" in text  # error from the tail
    before = _net_out(rb)
    found = viewer.get(BASE + "dead/?q=needle-3")
    assert _net_out(rb) - before < 100_000 and "1 match" in found.content.decode()


def test_a_big_entry_page_is_capped_with_a_download_of_the_whole(viewer, rb):
    (token,) = _big_dead(rb, 1)
    before = _net_out(rb)
    page = viewer.get(f"{BASE}dead/job/{quote(token)}/")
    read = _net_out(rb) - before
    assert page.status_code == 200 and read < 2 * api.records.DETAIL_BYTES, read
    text = page.content.decode()
    assert len(text) < 500_000 and "needle-0" in text and "Download the stored JSON" in text
    download = viewer.get(f"{BASE}dead/job/{quote(token)}/raw/")
    assert download.status_code == 200 and "attachment" in download["Content-Disposition"]
    assert json.loads(download.content)["args"] == ["x" * BIG]


def test_big_entries_read_in_part_still_retry_and_delete_whole(changer, rb):
    first, second = _big_dead(rb, 2)
    assert changer.get(BASE + "dead/").content.decode().count("shown in part") == 2
    changer.post(BASE + "dead/", {"row_action": f"retry {first}"})
    assert json.loads(rb.lindex(KEYS.queue("default"), 0))["args"] == ["x" * BIG]
    changer.post(BASE + "dead/", {"row_action": f"delete {second}"})
    assert rb.zcard(KEYS.dead) == 0


def test_no_one_can_ask_for_more_than_a_hundred_rows(viewer, rb):
    rb.zadd(KEYS.dead, {payloads.encode(failed(message=f"m{i}")): float(i) for i in range(150)})
    for query in ("?per_page=500", "?per_page=100"):
        page = viewer.get(BASE + "dead/" + query).content.decode()
        assert page.count("/admin/django_cogworker/dead/job/") <= 2 * api.MAX_PER_PAGE == 200, query
    assert api.DeadSet().page(1, 500).per_page == api.MAX_PER_PAGE == 100


# -- thousands of queue names ------------------------------------------------------------------


def test_the_queues_page_is_paged_and_the_dashboard_lists_the_largest(viewer, rb):
    rb.sadd(KEYS.queues, *[f"tenant-{i:04d}" for i in range(130)])
    push(rb, job(queue="tenant-0129", args=["a"]))
    push(rb, job(queue="tenant-0129", args=["b"]))
    first = viewer.get(BASE + "queue/").content.decode()
    assert first.count(f'href="{BASE}queue/tenant-') == 50 and "page 1 of 3" in first
    last = viewer.get(BASE + "queue/?page=3").content.decode()
    assert last.count(f'href="{BASE}queue/tenant-') == 30 and "tenant-0129" in last
    dashboard = viewer.get(BASE + "dashboard/").content.decode()
    assert dashboard.count(f'href="{BASE}queue/tenant-') == 25 and "of 130" in dashboard
    assert dashboard.index("tenant-0129") < dashboard.index("tenant-0000")  # the largest first
    assert api.Stats().enqueued == 2


def _queue_rows(page: str) -> dict[str, str]:
    """Queue name -> the text of its row on the queues page."""
    rows = re.findall(r"<tr>(.*?)</tr>", page, re.S)
    return {m.group(1): re.sub(r"<[^>]+>", " ", row) for row in rows
            if (m := re.search(r'href="/admin/django_cogworker/queue/([^/"]+)/"', row))}


def test_the_queues_page_marks_a_queue_no_live_process_reads(viewer, rb):
    # Its jobs waited forever, and nothing on the page said so.
    for queue in ("default", "mail", "reports", "exports"):
        push(rb, job(queue=queue))
    fake_process(rb, "host:1:aaaaaa", queues=["default", "mail"])
    fake_process(rb, "host:2:bbbbbb", queues=["default"])
    fake_process(rb, "host:3:cccccc", queues=["reports"], quiet=True)  # quiet: fetches nothing
    rows = _queue_rows(viewer.get(BASE + "queue/").content.decode())
    assert set(rows) == {"default", "mail", "reports", "exports"}
    assert " 2 " in rows["default"] and " 1 " in rows["mail"]
    for name in ("default", "mail"):
        assert "no process reads it" not in rows[name]
    for name in ("reports", "exports"):
        assert "no process reads it" in rows[name]
    assert api.ProcessSet().readers() == {"default": 2, "mail": 1}
    dashboard = _queue_rows(viewer.get(BASE + "dashboard/").content.decode())
    assert [name for name, row in sorted(dashboard.items()) if "no process reads it" in row] == ["exports", "reports"]


def test_a_queue_page_for_a_name_never_pushed_to_is_404(viewer, rb):
    assert viewer.get(BASE + "queue/never-heard-of/").status_code == 404
    rb.sadd(KEYS.paused_queues, "paused-empty")
    push(rb, job(queue="waiting"))
    rb.sadd(KEYS.queues, "pushed-once")  # (emptied since: listed until forgotten)
    for name in ("paused-empty", "waiting", "pushed-once"):
        assert viewer.get(f"{BASE}queue/{name}/").status_code == 200, name


def test_forget_empty_queues_keeps_the_busy_and_the_paused(changer, viewer, rb):
    rb.sadd(KEYS.queues, *[f"tenant-{i}" for i in range(2500)])
    push(rb, job(queue="tenant-7"))
    rb.sadd(KEYS.paused_queues, "tenant-8")
    assert viewer.post(BASE + "queue/", {"action": "prune"}).status_code == 403
    changer.post(BASE + "queue/", {"action": "prune"})
    assert rb.smembers(KEYS.queues) == {b"tenant-7", b"tenant-8"}
    push(rb, job(queue="tenant-9"))  # a push lists its queue again
    assert {q.name for q in api.Queue.all()} == {"tenant-7", "tenant-8", "tenant-9"}


# -- retry all, bounded per request -------------------------------------------------------------


def test_retry_all_moves_a_bounded_share_per_request_and_offers_to_go_on(changer, rb, monkeypatch):
    monkeypatch.setattr(api.sorted_sets, "RETRY_SOME_LIMIT", 1_000)
    rb.zadd(KEYS.dead, {payloads.encode(payloads.dead_letter(f"{{garbage {i}", "unparseable", 1.0)): float(i)
                        for i in range(3)})  # can't move: they stay in front
    rb.zadd(KEYS.dead, {payloads.encode(failed(message=f"m{i}")): 10.0 + i for i in range(2_600)})
    data = {"action": "retry_all", "confirmed": "yes"}
    requests = 0
    while True:
        before = rb.llen(KEYS.queue("default"))
        response = changer.post(BASE + "dead/", data)
        requests += 1
        assert rb.llen(KEYS.queue("default")) - before <= 1_000
        if response.status_code == 302:
            break
        page = response.content.decode()
        assert "left to look at" in page and 'name="confirmed" value="yes"' in page
        data = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page))
        assert data["resume"] == "3"
    assert requests == 3 and rb.llen(KEYS.queue("default")) == 2_600 and rb.zcard(KEYS.dead) == 3


def test_busy_groups_the_workers_of_a_supervisor_in_slot_order(admin_client, rb):
    supervisor = "host:100:aaa111"
    fake_process(rb, "host:102:ccc333", supervisor=supervisor, index=1, pid=102)
    fake_process(rb, "host:101:bbb222", supervisor=supervisor, index=0, pid=101)
    fake_process(rb, "host:4242:abc123")  # a lone process: no group
    content = admin_client.get(BASE + "busy/").content.decode()
    assert content.count("Supervisor ") == 1
    header = content.index(f"Supervisor {supervisor}")
    assert header < content.index("#0</span> host:101") < content.index("#1</span> host:102")
    assert "host:4242:abc123" in content and "#</span> host:4242" not in content
    assert [p.index for p in api.ProcessSet()] == [0, 1, None]
    assert {p.supervisor for p in api.ProcessSet()} == {supervisor, ""}


# -- batches (read only: made with the real API; their jobs' steps run here, as a worker's settlement runs them)


def _batches_with_every_state():
    """A finished batch, one whose jobs have failed and died (with a child batch and callbacks), and
    one in progress, oldest first; with the jids of the second."""
    from admin_fixtures import batch_step

    from django_cogworker import Batch
    from testproject.demo.jobs import BatchCallbackJob, RecordJob

    done = Batch("all done")
    with done.jobs():
        (done_jid,) = [RecordJob.perform_async("seen")]
    batch_step(done.bid, done_jid, "success")
    broken = Batch(f"import {XSS}").on("death", BatchCallbackJob, key="cb").on("success", BatchCallbackJob, key="cb")
    with broken.jobs():
        jids = [RecordJob.perform_async("seen", n) for n in range(3)]
        child = Batch("its child")
        with child.jobs():
            RecordJob.perform_async("seen")
    batch_step(broken.bid, jids[0], "dead", f"no such customer {XSS}")
    batch_step(broken.bid, jids[1], "failure", "timeout talking to the bank")
    running = Batch("running")
    with running.jobs():
        RecordJob.perform_async("seen")
    return done, broken, child, running, jids


def test_the_batches_page_lists_them_newest_first_with_progress_and_state(viewer):
    done, broken, child, running, _ = _batches_with_every_state()
    page = viewer.get(BASE + "batches/").content.decode()
    rows = re.findall(rf'<td class="cw-key"><a href="{BASE}batches/([0-9a-f]+)/">', page)
    assert rows == [running.bid, child.bid, broken.bid, done.bid]
    row = lambda bid: page[page.index(f'<td class="cw-key"><a href="{BASE}batches/{bid}/">'):].split("</tr>")[0]  # noqa: E731
    assert "1 / 1" in row(done.bid) and "cw-ok\">succeeded<" in row(done.bid)
    broken_row = row(broken.bid)
    assert "0 / 4" in broken_row and "a job died" in broken_row and "in progress" in broken_row
    assert re.findall(r"<td>(\d+)</td>", broken_row) == ["4", "2", "1"]  # pending, failures, dead
    assert 'class="cw-bar-failing" style="width: 25.0%"' in broken_row
    assert 'class="cw-bar-dead" style="width: 25.0%"' in broken_row
    assert f"child of <a href=\"{BASE}batches/{broken.bid}/\">" in row(child.bid)
    assert XSS not in page and XSS_ESCAPED in page
    assert 'name="action"' not in page


def test_a_batch_page_shows_its_jobs_where_they_are_its_children_and_callbacks(viewer):
    _, broken, child, _, jids = _batches_with_every_state()
    page = viewer.get(f"{BASE}batches/{broken.bid}/").content.decode()
    jobs = page[page.index('class="module cw-jobs"'):]
    # The dead first, then the failing, each with its error and a link to find it where it is.
    assert jobs.index(jids[0]) < jobs.index(jids[1]) < jobs.index(jids[2])
    assert f"no such customer {XSS_ESCAPED}" in jobs and XSS not in page
    assert f'href="{BASE}dead/?q={jids[0]}">find in Dead' in jobs
    assert f'href="{BASE}retry/?q={jids[1]}">find in Retries' in jobs
    assert "timeout talking to the bank" in jobs
    assert "1 dead · 1 failing · 2 waiting · 0 succeeded" in re.sub(r"<[^>]+>", "", jobs)
    assert f'batch <a href="{BASE}batches/{child.bid}/">' in jobs
    children = page[page.index("<h2>Child batches</h2>"):page.index('class="module cw-jobs"')]
    assert "its child" in children and "in progress" in children
    callbacks = page[page.index('class="module cw-callbacks"'):page.index("<h2>Child batches</h2>")]
    death = callbacks[callbacks.index("<td>death</td>"):].split("</tr>")[0]
    assert "pushed" in death and "not in Retries or Dead" in death
    success = callbacks[callbacks.index("<td>success</td>"):].split("</tr>")[0]
    assert "not fired" in success
    # The child's page names its parent.
    assert f'<dt>Parent</dt><dd><a href="{BASE}batches/{broken.bid}/">' in viewer.get(
        f"{BASE}batches/{child.bid}/").content.decode()


def test_a_batch_page_lists_a_bounded_number_of_jobs_and_counts_the_rest(viewer, monkeypatch):
    from django_cogworker import Batch
    from django_cogworker.features.batches.api import detail
    from testproject.demo.jobs import RecordJob

    monkeypatch.setattr(detail, "JOB_LIMIT", 3)
    big = Batch("big")
    with big.jobs():
        RecordJob.perform_bulk([["seen", n] for n in range(10)])
    page = viewer.get(f"{BASE}batches/{big.bid}/").content.decode()
    jobs = page[page.index('class="module cw-jobs"'):]
    assert jobs.count('<span class="cw-flag">waiting</span>') == 3
    assert "10 waiting (3 listed)" in re.sub(r"<[^>]+>", "", jobs)


def test_a_batch_page_for_an_unknown_or_expired_bid_is_404(viewer):

    from django_cogworker import Batch

    assert viewer.get(f"{BASE}batches/no-such-bid/").status_code == 404
    short = Batch("short", ttl=1)
    with short.jobs():
        pass
    assert viewer.get(f"{BASE}batches/{short.bid}/").status_code == 200
    wait_until(lambda: viewer.get(f"{BASE}batches/{short.bid}/").status_code == 404, timeout=5,
               message="its data expired")
    assert short.bid not in viewer.get(BASE + "batches/").content.decode()


def test_the_progress_bar_keeps_its_widths_in_a_locale_with_a_decimal_comma(viewer, settings):
    # Floats are localized in templates: under "de", a width of 33.3% was written "33,3%", no width at all.
    from admin_fixtures import batch_step

    from django_cogworker import Batch
    from testproject.demo.jobs import RecordJob

    settings.LANGUAGE_CODE = "de"
    third = Batch("a third done")
    with third.jobs():
        jids = [RecordJob.perform_async("seen", n) for n in range(3)]
    batch_step(third.bid, jids[0], "success")
    page = viewer.get(BASE + "batches/", HTTP_ACCEPT_LANGUAGE="de").content.decode()
    assert 'lang="de"' in page
    assert 'class="cw-bar-succeeded" style="width: 33.3%"' in page


@pytest.mark.parametrize("name", ["meta", "jobs", "pending", "failed", "dead", "outbox"])
def test_a_batch_with_a_key_of_the_wrong_type_shows_as_poisoned_before_and_after_its_quarantine(viewer, rb, name):
    # (A pending, failed or meta of the wrong type answered 500: each read of it a WRONGTYPE.)
    from admin_fixtures import batch_step

    from django_cogworker import Batch
    from testproject.demo.jobs import RecordJob

    _, broken, child, _, jids = _batches_with_every_state()
    key = getattr(KEYS.batch(broken.bid), name)
    rb.delete(key)
    rb.set(key, "not mine")
    # (The listing reads no outbox: its page says it.)
    for url in (f"{BASE}batches/{broken.bid}/", *([BASE + "batches/"] if name != "outbox" else [])):
        response = viewer.get(url)
        assert response.status_code == 200 and ">poisoned<" in response.content.decode()
    assert f"<dt>Wrong type</dt><dd><span class=\"cw-flag cw-warn\">{name}</span>" in viewer.get(
        f"{BASE}batches/{broken.bid}/").content.decode()
    if name == "jobs":  # (a push into the batch meets it: moved to quarantine)
        with Batch(bid=broken.bid).jobs():
            RecordJob.perform_async("seen")
    else:  # (the steps of its other jobs meet it)
        for member in (jids[1], jids[2], f"b:{child.bid}"):
            batch_step(broken.bid, member, "success")
    page = viewer.get(f"{BASE}batches/{broken.bid}/").content.decode()
    assert f'<span class="cw-flag cw-warn">lost: {name}</span>' in page and "<dt>Wrong type</dt>" not in page


def test_a_limiter_with_a_key_of_the_wrong_type_shows_as_poisoned_before_and_after_its_quarantine(viewer, rb):
    from admin_fixtures import hold, limiter

    from django_cogworker import Limiter

    lk = limiter(rb, "stripe", "concurrent", 3, lease=60)
    rb.set(lk.holders, "not mine")
    page = viewer.get(f"{BASE}limits/stripe/").content.decode()
    assert '<dt>Wrong type</dt><dd><span class="cw-flag cw-warn">holders</span>' in page
    assert ">poisoned<" in viewer.get(BASE + "limits/").content.decode()
    with Limiter.concurrent("stripe", 3, lease=60).within(redis=rb, keys=KEYS):  # (a take meets it)
        hold(rb, "stripe", "jid-one", "host:1:a")
        page = viewer.get(f"{BASE}limits/stripe/").content.decode()
    assert '<span class="cw-flag cw-warn">lost: holders</span>' in page and "<dt>Wrong type</dt>" not in page
    assert "jid-one" in page


# -- limits (read only: written into Redis as the workers write them, admin_fixtures.limiter) ---------


def test_the_limits_page_shows_use_holders_refusals_and_recent_figures(viewer, rb):
    from admin_fixtures import hold, limiter, recent

    limiter(rb, "stripe", "concurrent", 4, lease=60, used_ago=1,
            totals={"granted": 1234, "over": 56, "rescheduled": 7, "expired": 2})
    hold(rb, "stripe", "jid-one", "host:1:a")
    hold(rb, "stripe", "jid-two", "host:2:b")
    hold(rb, "stripe", "jid-lapsed", "host:3:c", expires_in=-1)
    recent(rb, "stripe", 0, over=3, rescheduled=1)
    recent(rb, "stripe", 30, over=9)
    limiter(rb, "mail", "bucket", 25, 1, used_ago=50)
    limiter(rb, "customer:42", "concurrent", 1, lease=30, family="customer", used_ago=20)
    hold(rb, "customer:42", "jid-c", "host:1:a")
    page = viewer.get(BASE + "limits/").content.decode()
    rows = re.findall(rf'<td class="cw-key"><a href="{BASE}limits/([^/"]+)/">', page)
    assert rows == ["stripe", "customer:42", "mail"]  # the most recently used first
    row = lambda key: page[page.index(f'<a href="{BASE}limits/{key}/">'):].split("</tr>")[0]  # noqa: E731
    stripe = row("stripe")
    assert "2 / 4" in stripe and 'class="cw-bar-ok" style="width: 50.0%"' in stripe
    assert f'href="{BASE}busy/#job-jid-one">jid-one</a>' in stripe and "jid-lapsed" not in stripe
    assert "56<br>" in stripe and "3 in 5m<br>12 in 1h" in stripe and "1 in 5m<br>1 in 1h" in stripe
    assert "1,234" in stripe and "2 lapsed" in stripe
    customer = row("customer:42")
    assert "family customer" in customer and "1 / 1" in customer and 'class="cw-bar-full"' in customer
    assert ">full<" in customer
    assert "25 per 1.0s" in row("mail") and "0 / 25" in row("mail")
    assert 'name="jid"' not in page and 'name="action"' not in page


def test_a_limit_page_lists_its_holders_with_links_and_cancel_buttons_for_those_who_may_act(viewer, changer, rb):
    from admin_fixtures import hold, limiter

    limiter(rb, "stripe", "concurrent", 3, lease=60)
    hold(rb, "stripe", "jid-one", "host:1:a", since_ago=30)
    hold(rb, "stripe", None, "host:2:b")  # a within() block outside a job
    page = viewer.get(f"{BASE}limits/stripe/").content.decode()
    holders = page[page.index('class="module cw-holders"'):]
    assert f'<a href="{BASE}busy/#job-jid-one" title="where it runs">jid-one</a>' in holders
    assert "host:1:a" in holders and "host:2:b" in holders and "no job" in holders
    assert "2 / 3" in page and 'name="jid"' not in page
    acting = changer.get(f"{BASE}limits/stripe/").content.decode()
    assert f'action="{BASE}busy/cancel/"' in acting and 'name="jid" value="jid-one"' in acting
    assert 'name="interrupt" value="yes"' in acting
    assert viewer.get(f"{BASE}limits/no-such-key/").status_code == 404


def test_the_bar_keeps_its_width_in_a_locale_with_a_decimal_comma(viewer, rb, settings):
    from admin_fixtures import hold, limiter

    settings.LANGUAGE_CODE = "de"
    limiter(rb, "stripe", "concurrent", 3, lease=60)
    hold(rb, "stripe", "j", "host:1:a")
    page = viewer.get(BASE + "limits/", HTTP_ACCEPT_LANGUAGE="de").content.decode()
    assert 'lang="de"' in page and 'class="cw-bar-ok" style="width: 33.3%"' in page


def test_cancel_buttons_are_offered_where_a_job_would_run_and_only_to_who_may_act(viewer, changer, rb):
    running = job(args=["running"])
    fake_process(rb, busy_job=running)
    waiting = job(args=["waiting"])
    push(rb, waiting)
    scheduled, retrying, dead = job(), failed(), failed()
    zadd(rb, KEYS.schedule, scheduled, time.time() + 60)
    zadd(rb, KEYS.retry, retrying, time.time() + 60)
    zadd(rb, KEYS.dead, dead, time.time())
    cancel_url = f"{BASE}busy/cancel/"
    busy = changer.get(BASE + "busy/").content.decode()
    assert f'id="job-{running["jid"]}"' in busy
    assert f'name="jid" value="{running["jid"]}"' in busy and 'name="interrupt" value="yes"' in busy
    queue = changer.get(f"{BASE}queue/default/").content.decode()
    assert f'action="{cancel_url}"' in queue and f'name="jid" value="{waiting["jid"]}"' in queue
    assert 'name="interrupt"' not in queue  # (waiting: nothing to interrupt)
    for page, entry in (("scheduled", scheduled), ("retry", retrying)):
        listing = changer.get(f"{BASE}{page}/").content.decode()
        assert f'formaction="{cancel_url}" name="jid" value="{entry["jid"]}"' in listing, page
    assert f'name="jid" value="{dead["jid"]}"' not in changer.get(f"{BASE}dead/").content.decode()
    for url in (BASE + "busy/", f"{BASE}queue/default/", f"{BASE}scheduled/", f"{BASE}retry/"):
        assert 'name="jid"' not in viewer.get(url).content.decode(), url


def test_cancel_is_a_post_for_who_may_act(viewer, rb):
    waiting = job()
    push(rb, waiting)
    assert viewer.post(f"{BASE}busy/cancel/", {"jid": waiting["jid"]}).status_code == 403
    assert viewer.get(f"{BASE}busy/cancel/").status_code == 405
    assert api.Queue("default").size() == 1


# -- cancel (busy/cancel/, django_cogworker.features.cancellation.cancel) on jobs pushed with the real client ---------

CANCEL = f"{BASE}busy/cancel/"


def _now(job_class):
    """``job_class`` pushed at once: these tests run inside a transaction, which would hold a push back
    until its commit (ENQUEUE_ON_COMMIT)."""
    return job_class.set(on_commit=False)


def _messages(response) -> str:
    return unescape(" ".join(str(m) for m in response.context["messages"]))


def test_cancel_takes_a_waiting_job_off_its_queue_and_counts_it(changer, rb):
    from testproject.demo.jobs import RecordJob

    kept = _now(RecordJob).perform_async("cancel:kept", 1)
    jid = _now(RecordJob).perform_async("cancel:gone", 2)
    page = changer.get(f"{BASE}queue/default/").content.decode()
    assert f'name="jid" value="{jid}"' in page and f'name="next" value="{BASE}queue/default/"' in page
    response = changer.post(CANCEL, {"jid": jid, "next": f"{BASE}queue/default/"}, follow=True)
    assert response.redirect_chain == [(f"{BASE}queue/default/", 302)]
    assert f"Job {jid} cancelled: taken off where it waited; it won't run." in _messages(response)
    assert [j.jid for j in api.Queue("default").jobs(1, 10).items] == [kept]
    assert f'name="jid" value="{jid}"' not in response.content.decode()
    assert rb.get(KEYS.stat_cancelled) == b"1"
    again = changer.post(CANCEL, {"jid": jid, "next": f"{BASE}queue/default/"}, follow=True)
    assert f"Job {jid} is nowhere to cancel" in _messages(again)
    assert rb.get(KEYS.stat_cancelled) == b"1" and api.Queue("default").size() == 1


def test_cancel_takes_a_scheduled_and_a_retry_entry_off_their_sets(changer, rb):
    from testproject.demo.jobs import RecordJob

    later = _now(RecordJob).perform_in(3600, "cancel:later", 1)
    kept = _now(RecordJob).perform_in(7200, "cancel:kept", 2)
    retrying = failed(message="it failed once")
    zadd(rb, KEYS.retry, retrying, time.time() + 600)
    for page, jid in (("scheduled", later), ("retry", retrying["jid"])):
        listing = changer.get(f"{BASE}{page}/").content.decode()
        assert f'formaction="{CANCEL}" name="jid" value="{jid}"' in listing, page
        # What the row's Cancel button posts: its form's next, and its own name and value.
        response = changer.post(CANCEL, {"next": f"{BASE}{page}/", "jid": jid}, follow=True)
        assert response.redirect_chain == [(f"{BASE}{page}/", 302)], page
        assert f"Job {jid} cancelled: taken off where it waited" in _messages(response), page
        assert f'value="{jid}"' not in response.content.decode(), page
    assert api.RetrySet().size() == 0 and [e.jid for e in api.ScheduledSet().page(1, 10).items] == [kept]
    assert rb.get(KEYS.stat_cancelled) == b"2" and api.Queue("default").size() == 0


def test_cancel_of_an_unknown_jid_is_a_warning_and_changes_nothing(changer, rb):
    from testproject.demo.jobs import RecordJob

    _now(RecordJob).perform_async("cancel:kept", 1)
    before = snapshot(rb)
    response = changer.post(CANCEL, {"jid": "no-such-jid"}, follow=True)
    assert response.redirect_chain == [(f"{BASE}busy/", 302)]
    (message,) = list(response.context["messages"])
    assert message.level_tag == "warning" and "Job no-such-jid is nowhere to cancel" in unescape(str(message))
    empty = changer.post(CANCEL, {"jid": "  "}, follow=True)
    assert "Name the job to cancel" in _messages(empty)
    assert snapshot(rb) == before and not rb.exists(KEYS.cancels) and not rb.exists(KEYS.stat_cancelled)


def test_cancel_of_a_chain_s_hand_over_job_says_why_it_is_refused_and_changes_nothing(changer, rb):
    from django_cogworker.features.batches import ChainNext

    payload = ChainNext.set().build([{"bid": "step-bid", "event": "success"}], {"chain": "chain-bid", "steps": [],
                                                                                "index": 1})
    rb.lpush(KEYS.queue("default"), payloads.encode(payload))
    rb.sadd(KEYS.queues, "default")
    before = snapshot(rb)
    response = changer.post(CANCEL, {"jid": payload["jid"], "next": f"{BASE}queue/default/"}, follow=True)
    assert response.redirect_chain == [(f"{BASE}queue/default/", 302)]
    (message,) = list(response.context["messages"])
    assert message.level_tag == "error"
    assert f"Job {payload['jid']} can't be cancelled: job '{payload['jid']}' is chain 'chain-bid'" in unescape(
        str(message)) and "To stop the chain, cancel a job of its next step" in unescape(str(message))
    assert snapshot(rb) == before


def test_cancel_is_refused_to_a_viewer_and_to_a_get(viewer, changer, rb):
    from testproject.demo.jobs import RecordJob

    jid = _now(RecordJob).perform_async("cancel:kept", 1)
    before = snapshot(rb)
    for data in ({"jid": jid}, {"jid": jid, "interrupt": "yes", "confirmed": "yes"}):
        assert viewer.post(CANCEL, data).status_code == 403
    assert viewer.get(CANCEL).status_code == 405 and changer.get(CANCEL, {"jid": jid}).status_code == 405
    assert snapshot(rb) == before and api.Queue("default").size() == 1


def test_interrupt_asks_first_and_acts_only_once_confirmed(changer, rb):
    running = job(args=["running"])
    fake_process(rb, busy_job=running)
    jid = running["jid"]
    asked = changer.post(CANCEL, {"jid": jid, "interrupt": "yes", "next": f"{BASE}busy/"})
    page = unescape(asked.content.decode())
    assert asked.status_code == 200 and f"Interrupt job {jid}?" in page and "Yes, interrupt it" in page
    for field in (f'name="jid" value="{jid}"', 'name="interrupt" value="yes"', 'name="confirmed" value="yes"'):
        assert field in page, field
    assert not rb.exists(KEYS.cancels)  # nothing done yet
    done = changer.post(CANCEL, {"jid": jid, "interrupt": "yes", "next": f"{BASE}busy/", "confirmed": "yes"},
                        follow=True)
    assert f"Job {jid} is running: it is interrupted" in _messages(done)
    assert json.loads(rb.hget(KEYS.cancels, jid))["interrupt"] is True
    assert not rb.exists(KEYS.stat_cancelled)  # (counted by the process that runs it, when it stops)


# -- links to pages named by a key, a bid or a queue name: quoted -------------------------------------

ODD_NAMES = ["a/../b", "..", ".", "x/y", "~2F", "50%/%2e%2e/c", "sp ace?#h", "naïve"]


def _follow(client, page_url: str, href: str):
    """GET ``href`` as a browser resolves it from ``page_url``: dot segments removed ("%2e" counts as
    a dot there, as the URL standard says), then the path sent as it is."""
    from urllib.parse import urljoin, urlsplit

    href = re.sub("%2e", ".", unescape(href), flags=re.IGNORECASE)
    return client.get(urlsplit(urljoin("http://testserver" + page_url, href)).path)


def test_links_to_a_limiter_key_a_batch_or_a_queue_named_with_slashes_or_dots_open_its_own_page(viewer, rb):
    # (Links were made by reverse(), which leaves "/" and "." alone: the key "a/../b" linked to the
    # page of "b", ".." to the admin index; a bid with a "/" made the batches page fail, 500.)
    from admin_fixtures import limiter
    from django.utils.html import escape

    for name in [*ODD_NAMES, "b"]:
        limiter(rb, name, "bucket", 5, 1)
        rb.hset(KEYS.batch(name).meta, mapping={"description": "", "created_at": time.time(), "ttl": 600})
        rb.zadd(KEYS.batches, {name: time.time()})
        rb.sadd(KEYS.queues, name)
        rb.lpush(KEYS.queue(name), payloads.encode({"jid": "j", "class": RECORD_JOB, "args": [], "queue": name}))
    for listing, title in (("limits/", "Limit"), ("batches/", "Batch"), ("queue/", "Queue")):
        page = viewer.get(BASE + listing).content.decode()
        links = {unescape(text): href for href, text in re.findall(
            r'<td class="cw-key"><a href="([^"]+)">(?:[^<]*</a><br><span class="cw-muted cw-bid">)?([^<]*)', page)}
        assert set(ODD_NAMES) <= set(links), (listing, links)
        for name in ODD_NAMES:
            opened = _follow(viewer, BASE + listing, links[name])
            assert opened.status_code == 200, (listing, name, links[name])
            assert f"<title>{escape(f'{title} {name}')} |" in opened.content.decode(), (listing, name, links[name])


def test_admin_md_lists_the_url_of_every_page():
    # (admin.md's list of URLs missed outbox/.)
    from django.urls import reverse
    from helpers import REPO_ROOT

    from django_cogworker.models import PAGES

    doc = (REPO_ROOT / "docs" / "admin.md").read_text()
    listed = doc.split("URLs: `/admin/django_cogworker/<page>/` with `<page>` one of ", 1)[1].split("; plus", 1)[0]
    segments = {reverse(f"admin:django_cogworker_{page._meta.model_name}_changelist").rstrip("/").rsplit("/", 1)[1]
                for page in PAGES}
    assert set(re.findall(r"`([a-z]+)`", listed)) == segments


def test_one_job_or_entry_is_counted_as_one(changer, rb):
    # ("Delete all 1 jobs", "1 jobs deleted": the admin's messages counted a lone one as many.)
    push(rb, job(queue="solo"))
    asked = changer.post(BASE + "queue/", {"action": "clear", "queue": "solo"}).content.decode()
    assert "Delete the 1 job waiting in queue solo?" in asked
    done = changer.post(BASE + "queue/", {"action": "clear", "queue": "solo", "confirmed": "yes"}, follow=True)
    assert "Queue solo cleared: 1 job deleted." in done.content.decode()
    zadd(rb, KEYS.dead, failed(), time.time())
    asked = changer.post(BASE + "dead/", {"action": "delete_all"}).content.decode()
    assert "Delete the 1 entry of Dead?" in asked
    done = changer.post(BASE + "dead/", {"action": "delete_all", "confirmed": "yes"}, follow=True)
    assert "Dead: 1 entry deleted." in done.content.decode()
