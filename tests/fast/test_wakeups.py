"""The subscription to schedule:wake (engine/schedule/wakeups.py): its faults, and what it ignores."""

from __future__ import annotations

import logging
import time

from engine_fixtures import (
    launcher_factory_fixture,  # noqa: F401 - the launcher_factory fixture
    make_config,
    new_token,
)
from helpers import Proxy, RedisServer, wait_until
from peek import queued_payloads
from poller_fixtures import (
    LONG,
    WOKEN_WITHIN,
    Extremes,
    K,
    Stamp,
    calls,
    entry,
    live_poller_fixture,  # noqa: F401 - the live_poller fixture
    stamp_entry,
    subscribed_and_settled,
    woken_for,
)

from django_cogworker.push.client import Client


def test_after_its_subscription_is_cut_the_poller_sweeps_for_what_it_missed(launcher_factory, r, caplog):
    running = launcher_factory(POLL_INTERVAL_AVERAGE=LONG)
    poller = running.launcher.poller
    subscribed_and_settled(poller)
    token = new_token()
    due = time.time() + 2
    r.zadd(K.schedule, {stamp_entry(token): due})  # as if its message had been lost with the connection

    with caplog.at_level(logging.WARNING, logger="django_cogworker.engine.schedule.wakeups"):
        assert r.client_kill_filter(_type="pubsub") == 1
        woken_for(token, due)

    assert poller.subscribed
    assert [m for m in caplog.messages if "subscription" in m or "subscribed" in m] == [
        f"poller: lost its subscription to {K.schedule_wake} (ConnectionError: Connection closed by server.); "
        f"due jobs wait for the timed rounds (every {LONG}s or so) until it is back",
        f"poller: subscribed to {K.schedule_wake} again"]


def test_the_poller_rides_out_a_redis_restart(launcher_factory, tmp_path, caplog):
    srv = RedisServer(tmp_path / "redis", appendonly=True).start()
    running = None
    try:
        with caplog.at_level(logging.WARNING, logger="django_cogworker.engine.schedule.wakeups"):
            running = launcher_factory(url=srv.url, POLL_INTERVAL_AVERAGE=LONG)
            poller = running.launcher.poller
            subscribed_and_settled(poller)
            srv.kill()
            wait_until(lambda: not poller.subscribed, timeout=5, message="subscription lost")
            time.sleep(2)  # attempts to subscribe again fail meanwhile
            srv.start()
            wait_until(lambda: poller.subscribed, timeout=20, message="subscribed again")
            token = new_token()
            due = time.time() + 1
            running.client.push(Stamp.set().build([token], {}), at=due)
            woken_for(token, due)
        assert poller._thread.is_alive()
        down = [m for m in caplog.messages if "subscri" in m and "again" not in m]
        assert len(down) == 1, down  # logged once, however many attempts failed
        assert any("subscribed to" in m and "again" in m for m in caplog.messages)
    finally:
        if running is not None:
            running.stop()
        srv.cleanup()


def test_messages_that_are_not_due_times_are_ignored(launcher_factory, r, caplog):
    running = launcher_factory(POLL_INTERVAL_AVERAGE=LONG)
    poller = running.launcher.poller
    subscribed_and_settled(poller)
    with caplog.at_level(logging.DEBUG, logger="django_cogworker.engine.schedule.wakeups"):
        for bad in ("soon", "", "nan", "-inf", "1e999", "[1700000000]"):
            r.publish(K.schedule_wake, bad)
        token = new_token()
        due = time.time() + 1
        running.client.push(Stamp.set().build([token], {}), at=due)
        woken_for(token, due)

    assert poller.subscribed
    assert len([m for m in caplog.messages if "not a due time" in m]) == 6


def test_without_the_channel_the_poller_falls_back_to_its_timed_rounds(live_poller, redis_url, r, caplog):
    r.acl_setuser("nochannels", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all"],
                  reset_channels=True)
    try:
        url = redis_url.replace("redis://", "redis://nochannels:pw@")
        r.zadd(K.schedule, {entry("due-soon"): time.time() + 1.5})
        with caplog.at_level(logging.WARNING, logger="django_cogworker.engine.schedule.wakeups"):
            r.config_resetstat()
            poller = live_poller(url=url, POLL_INTERVAL_AVERAGE=2, rng=Extremes(high=False))
            time.sleep(3.2)
            stats = calls(r)
            assert not poller.subscribed
        assert [p["jid"] for p in queued_payloads(r)] == ["due-soon"]  # by its peek, as ever
        assert stats.get("subscribe", 0) <= stats["lrange"] + 1  # one attempt a round at most
        assert len([m for m in caplog.messages if "subscri" in m]) == 1
        assert "NOPERM" in caplog.messages[0] or "permission" in caplog.messages[0]
    finally:
        r.acl_deluser("nochannels")


def test_a_subscription_that_stops_answering_is_replaced(live_poller, redis_url, r, caplog):
    proxy = Proxy(int(redis_url.rsplit(":", 1)[1].split("/")[0]))
    try:
        with caplog.at_level(logging.WARNING, logger="django_cogworker.engine.schedule.wakeups"):
            # Rounds every second: each checks the subscription with a PING.
            poller = live_poller(url=proxy.url(), POLL_INTERVAL_AVERAGE=2, rng=Extremes(high=False))
            subscribed_and_settled(poller)
            proxy.freeze()
            wait_until(lambda: any("no answer to a PING" in m for m in caplog.messages), timeout=15,
                       message="the silent subscription noticed")
            wait_until(lambda: poller.subscribed, message="subscribed again")
        client = Client(make_config(redis_url), r)
        due = time.time() + 1
        client.push({"jid": "after", "class": "x.Job", "args": [], "kwargs": {}, "queue": "default", "retry": True},
                    at=due, on_commit=False)
        wait_until(lambda: r.llen(K.queue("default")), timeout=due - time.time() + WOKEN_WITHIN, message="moved")
    finally:
        proxy.close()

