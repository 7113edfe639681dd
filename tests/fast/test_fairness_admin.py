"""The queue page's groups (features/fairness/, admin/views.py) through Django's test client: listed
the busiest first and paged, the lanes counted in the sizes shown, pause and resume as POSTs that
need the change permission, and lane keys of the wrong type shown poisoned, never a 500."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from django_cogworker import api
from django_cogworker.broker.keys import Keys

pytestmark = pytest.mark.django_db
K = Keys()
BASE = "/admin/django_cogworker/"
Q = "fair-admin"


def _client(name: str, *perms: str) -> Client:
    user = User.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="django_cogworker",
                                                        codename__in=perms))
    client = Client()
    client.force_login(user)
    return client


def seed(rb, groups: dict[str, int]) -> None:
    """Grouped jobs as the core's fetch leaves them: each group's list, and the ring with ""."""
    lanes = K.lanes(Q)
    rb.sadd(K.queues, Q)
    for group, count in groups.items():
        rb.lpush(lanes.group(group), *[json.dumps({"group": group, "jid": f"{group}{i}", "class": "x", "args": [],
                                                   "queue": Q}) for i in range(count)])
        rb.lpush(lanes.ring, group)
    rb.rpush(lanes.ring, "")


def test_the_queue_page_lists_its_groups_busiest_first_with_the_lanes_in_its_counts(rb):
    seed(rb, {f"tenant-{i:02}": i for i in range(1, 31)})
    rb.zadd(K.lanes(Q).prio, {b'{"priority":3,"jid":"p"}': 1})
    viewer = _client("viewer", "view_cogworker")
    page = viewer.get(f"{BASE}queue/{Q}/").content.decode()
    assert "30 groups holding 465 jobs · 1 prioritized job waiting" in page
    assert "465 in its groups · 1 prioritized" in page
    assert page.index("tenant-30") < page.index("tenant-29") < page.index("tenant-06")
    assert "tenant-05" not in page and "groups page 1 of 2" in page
    assert ">Pause<" not in page  # (view-only: no buttons)
    second = viewer.get(f"{BASE}queue/{Q}/?gpage=2").content.decode()
    assert "tenant-05" in second and "tenant-30" not in second
    queues = viewer.get(f"{BASE}queue/").content.decode()
    assert "466" in queues  # (the queue's size on the queues page: its lanes' jobs)


def test_pause_and_resume_a_group_from_the_queue_page(rb):
    seed(rb, {"acme": 2, "globex": 1})
    changer = _client("changer", "change_cogworker")
    page = changer.get(f"{BASE}queue/{Q}/").content.decode()
    assert 'value="pause_group"' in page
    done = changer.post(f"{BASE}queue/", {"action": "pause_group", "queue": Q, "group": "acme",
                                          "next": f"{BASE}queue/{Q}/"}, follow=True)
    assert "Group acme of queue fair-admin paused" in done.content.decode()
    assert rb.smembers(K.lanes(Q).paused) == {b"acme"} and b"acme" not in rb.lrange(K.lanes(Q).ring, 0, -1)
    assert 'value="resume_group"' in done.content.decode()
    changer.post(f"{BASE}queue/", {"action": "resume_group", "queue": Q, "group": "acme"})
    assert not rb.exists(K.lanes(Q).paused) and b"acme" in rb.lrange(K.lanes(Q).ring, 0, -1)
    bad = changer.post(f"{BASE}queue/", {"action": "pause_group", "queue": Q, "group": "a b"}, follow=True)
    assert "group must be 1 to 100 characters" in bad.content.decode() and not rb.exists(K.lanes(Q).paused)


def test_a_viewer_cant_pause_a_group(rb):
    seed(rb, {"acme": 1})
    viewer = _client("viewer", "view_cogworker")
    assert viewer.post(f"{BASE}queue/", {"action": "pause_group", "queue": Q, "group": "acme"}).status_code == 403
    assert not rb.exists(K.lanes(Q).paused)


def test_clearing_a_queue_from_the_admin_clears_its_groups(rb):
    seed(rb, {"acme": 2})
    changer = _client("changer", "change_cogworker")
    asked = changer.post(f"{BASE}queue/", {"action": "clear", "queue": Q})
    assert "Delete all 2 jobs" in asked.content.decode()
    changer.post(f"{BASE}queue/", {"action": "clear", "queue": Q, "confirmed": "yes"})
    assert api.Queue(Q).size() == 0 and not rb.exists(K.lanes(Q).group("acme"), K.lanes(Q).ring)


def test_lane_keys_of_the_wrong_type_show_poisoned_never_a_500(rb):
    seed(rb, {"good": 2})
    lanes = K.lanes(Q)
    rb.lpush(lanes.ring, "bad")
    rb.set(lanes.group("bad"), "a string")
    rb.set(lanes.prio, "a string")
    viewer = _client("viewer", "view_cogworker")
    response = viewer.get(f"{BASE}queue/{Q}/")
    page = response.content.decode()
    assert response.status_code == 200
    assert "poisoned (holds another type)" in page and "poisoned lane key: prio (holds another type)" in page
    rb.delete(lanes.ring)
    rb.set(lanes.ring, "a string")
    for url in (f"{BASE}queue/{Q}/", f"{BASE}queue/", f"{BASE}dashboard/"):
        assert viewer.get(url).status_code == 200
    assert "poisoned lane key: ring" in viewer.get(f"{BASE}queue/{Q}/").content.decode()
