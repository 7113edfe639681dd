"""The Cogworker admin pages through Django's test client: rendering, actions, permissions, escaping.

Here, the tests that run a real worker process; the in-process ones are in tests/fast/test_admin.py.
"""

from __future__ import annotations

import time

import pytest
from admin_fixtures import KEYS
from helpers import FAST_ENV, Worker, wait_until

# Helpers shared with this subject's fast tests, defined there once.
from test_admin import BASE, CANCEL, _client, _messages, _now, _user, changer  # noqa: F401, F811 - the changer fixture

from django_cogworker import api

pytestmark = pytest.mark.django_db(databases=["default", "pg"])


def test_cancel_a_running_job_from_the_processes_page_with_a_real_worker(changer, rb):  # noqa: F811 - the fixture imported above
    from testproject.demo.flow_jobs import CancellableJob

    key = "cancel:admin"
    jid = _now(CancellableJob).perform_async(key, 600, 0.05)  # 30 s of steps unless stopped
    with Worker("-c", "2", env=FAST_ENV) as worker:
        worker.wait_ready()
        wait_until(lambda: rb.lrange(f"{key}:started", 0, -1) == [jid.encode()], timeout=15, message="started")

        def listed() -> str | None:  # (a process lists what it runs at its next beat)
            page = changer.get(BASE + "busy/").content.decode()
            return page if f'id="job-{jid}"' in page else None

        busy = wait_until(listed, timeout=10, message="listed on the Processes page")
        assert f'name="jid" value="{jid}"' in busy and 'name="interrupt" value="yes"' in busy
        response = changer.post(CANCEL, {"jid": jid, "next": f"{BASE}busy/"}, follow=True)
        assert response.redirect_chain == [(f"{BASE}busy/", 302)]
        assert f"Job {jid} is running: asked to stop" in _messages(response)
        wait_until(lambda: rb.lrange(f"{key}:stopped", 0, -1) == [jid.encode()], timeout=10,
                   message="the job stopped between two steps")
        wait_until(lambda: rb.get(KEYS.stat_cancelled) == b"1", timeout=10, message="counted cancelled")
        wait_until(lambda: not listed(), timeout=10, message="no longer on the Processes page")
        assert "cancelled jid=" in worker.log()
        time.sleep(1.5)  # (three beats: a retry or a rerun would show by now)
        assert worker.alive
    assert not rb.exists(f"{key}:finished") and rb.llen(f"{key}:started") == 1
    assert rb.zcard(KEYS.retry) == 0 and rb.zcard(KEYS.dead) == 0 and api.Queue("default").size() == 0
