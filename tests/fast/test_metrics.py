"""The Prometheus metrics view (django_cogworker/metrics/): who may read it, what a scrape shows
(checked with Prometheus's own parser), escaping, bounds with many queues, a Redis away; and the
per-class counts a real worker process writes."""

from __future__ import annotations

import json
import time

import pytest
import redis
from admin_fixtures import KEYS, failed, fake_process, job, push, zadd
from django.contrib.auth.models import Permission, User
from django.test import Client
from helpers import free_port, round_trips, wait_until
from prometheus_client.parser import text_string_to_metric_families

from django_cogworker import api
from django_cogworker.engine.settle.stats import Stats
from django_cogworker.features.limits import metrics as limit_metrics
from django_cogworker.metrics import collect as collect_module
from django_cogworker.metrics.exposition import CONTENT_TYPE
from django_cogworker.push import runtime
from testproject.demo.jobs import RecordJob

URL = "/cogworker/metrics"
TOKEN = "s3cret-token-for-the-scraper"


@pytest.fixture
def token(settings):
    settings.COGWORKER = {**settings.COGWORKER, "METRICS_TOKEN": TOKEN}
    return TOKEN


def scrape(client: Client | None = None, token: str | None = TOKEN):
    client = client or Client()
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return client.get(URL, **headers)


def samples(response) -> dict[tuple[str, tuple], float]:
    """Every sample of the page, by (name, sorted labels), as Prometheus's parser reads it."""
    assert response.status_code == 200, response.content
    found = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            found[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return found


def user(name: str, *perms: str, staff: bool = True) -> Client:
    account = User.objects.create_user(name, password="pw", is_staff=staff)
    account.user_permissions.set(Permission.objects.filter(content_type__app_label="django_cogworker",
                                                           codename__in=perms))
    client = Client()
    client.force_login(account)
    return client


def test_a_scrape_shows_counters_queues_sets_processes_and_periodic_runs(rb, token):
    now = time.time()
    rb.set(KEYS.stat_processed, 1200)
    rb.set(KEYS.stat_failed, 34)
    push(rb, job(queue="mail", enqueued_at=now - 90))
    push(rb, job(queue="mail", enqueued_at=now - 10))
    push(rb, job(queue="default", enqueued_at=now - 2))
    rb.sadd(KEYS.paused_queues, "mail")
    zadd(rb, KEYS.schedule, job(), now + 60)
    zadd(rb, KEYS.retry, failed(), now + 60)
    for _ in range(3):
        zadd(rb, KEYS.dead, failed(), now)
    fake_process(rb, "host:1:a", busy_job=job())
    fake_process(rb, "host:2:b")
    rb.hset(KEYS.periodic_schedule, "nightly", json.dumps({"cron": "0 3 * * *", "job": "x.Y"}))
    rb.set(KEYS.periodic_last_slot("nightly"), 1_700_000_000)
    rb.sadd(KEYS.periodic_disabled, "nightly")

    response = scrape()
    assert response["Content-Type"] == CONTENT_TYPE and response["Cache-Control"] == "no-store"
    got = samples(response)
    assert got["cogworker_processed_total", ()] == 1200 and got["cogworker_failed_total", ()] == 34
    assert got["cogworker_queue_size", (("queue", "mail"),)] == 2
    assert got["cogworker_queue_size", (("queue", "default"),)] == 1
    assert got["cogworker_queue_latency_seconds", (("queue", "mail"),)] == pytest.approx(90, abs=5)
    assert got["cogworker_queue_paused", (("queue", "mail"),)] == 1
    assert got["cogworker_queue_paused", (("queue", "default"),)] == 0
    assert (got["cogworker_scheduled_size", ()], got["cogworker_retry_size", ()], got["cogworker_dead_size", ()]) \
        == (1, 1, 3)
    assert (got["cogworker_processes", ()], got["cogworker_busy", ()], got["cogworker_concurrency", ()]) == (2, 1, 10)
    assert got["cogworker_periodic_last_run_timestamp_seconds", (("entry", "nightly"),)] == 1_700_000_000
    assert got["cogworker_periodic_enabled", (("entry", "nightly"),)] == 0
    assert (got["cogworker_queues", ()], got["cogworker_enqueued", ()]) == (2, 3)
    text = response.content.decode()
    assert "# TYPE cogworker_queue_latency_seconds gauge" in text and "# TYPE cogworker_processed_total counter" in text


@pytest.mark.django_db
def test_who_may_read_it(token):
    refused = scrape(token=None)
    assert refused.status_code == 401 and refused["WWW-Authenticate"] == 'Bearer realm="cogworker"'
    assert TOKEN not in refused.content.decode()
    assert scrape(token="wrong-token-of-the-same-size!").status_code == 403
    assert scrape(token=TOKEN[:-1]).status_code == 403
    assert Client().get(URL, HTTP_AUTHORIZATION=f"Basic {TOKEN}").status_code == 403
    assert scrape().status_code == 200
    assert user("nobody").get(URL).status_code == 403  # staff, without the permission
    assert user("outsider", "view_cogworker", staff=False).get(URL).status_code == 403
    assert user("viewer", "view_cogworker").get(URL).status_code == 200
    assert Client().post(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405


def test_a_scraper_gets_through_login_required_middleware(settings, token):
    # A project that requires a login everywhere (Django's LoginRequiredMiddleware) still lets the
    # token in, rather than redirecting the scraper to the login page; without one it is refused.
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django.contrib.auth.middleware.LoginRequiredMiddleware"]
    assert scrape().status_code == 200
    assert scrape(token=None).status_code == 401


@pytest.mark.django_db
def test_without_a_token_configured_no_bearer_is_accepted(settings):
    assert runtime.get_config().metrics_token == ""
    assert scrape(token="anything-at-all-goes-here").status_code == 403
    assert scrape(token=None).status_code == 401
    assert user("viewer", "view_cogworker").get(URL).status_code == 200


def test_label_values_are_escaped_so_the_page_still_parses(rb, token):
    names = ['evil"queue', "back\\slash", "new\nline", 'x"} 1\ncogworker_dead_size 999']
    for name in names:
        push(rb, job(queue=name))
    rb.hset(KEYS.stat_class_processed, mapping={'we"ird\nclass': 3})
    got = samples(scrape())
    for name in names:
        assert got["cogworker_queue_size", (("queue", name),)] == 1
    assert got["cogworker_job_processed_total", (("class", 'we"ird\nclass'),)] == 3
    assert got["cogworker_dead_size", ()] == 0  # not the pusher's fake sample


def test_many_queues_are_read_in_a_few_round_trips_and_only_the_largest_get_series(rb, token, monkeypatch):
    names = [f"tenant-{n:05d}" for n in range(3000)]
    rb.sadd(KEYS.queues, *names)
    for n in range(5):
        push(rb, job(queue=f"tenant-{n * 100:05d}"))
    monkeypatch.setattr(collect_module, "QUEUE_LIMIT", 100)
    trips = round_trips(monkeypatch)
    got = samples(scrape())
    # Not one per queue (21: the run-time histogram reads the history's totals; 5 more read the queues'
    # lanes, their groups and priorities counted in each size: api/lanes.py, features/fairness/metrics.py).
    assert trips["n"] <= 26
    series = [labels for (name, labels) in got if name == "cogworker_queue_size"]
    assert len(series) == 100
    assert ("queue", "tenant-00400") in {label for labels in series for label in labels}  # the largest kept
    assert got["cogworker_queues", ()] == 3000 and got["cogworker_enqueued", ()] == 5


def test_redis_away_is_a_503_not_a_page_of_zeros(token, monkeypatch):
    monkeypatch.setattr(runtime, "get_shared_redis", lambda: redis.Redis(port=free_port(), socket_connect_timeout=0.5))
    response = scrape()
    assert response.status_code == 503


def test_a_heartbeat_flush_between_a_scrape_s_reads_never_shows_class_runs_the_total_lacks(r, token, monkeypatch):
    # The scrape reads the totals and the per-class hashes in two round trips; a worker's flush
    # can land between them. Here it lands right after whichever read comes first.
    counts = Stats(KEYS)
    for _ in range(4):
        counts.job_done(False, "testproject.demo.jobs.RecordJob", 0.01)
    pending = [counts]

    def flush_after(read):
        def reading(*args, **kwargs):
            result = read(*args, **kwargs)
            if pending:
                pending.pop().flush(r)
            return result
        return reading

    monkeypatch.setattr(api.JobClassStats, "all", flush_after(api.JobClassStats.all))
    monkeypatch.setattr(api, "Stats", flush_after(api.Stats))
    got = samples(scrape())
    assert not pending  # (the flush did land between the reads)
    runs = got.get(("cogworker_job_processed_total", (("class", "testproject.demo.jobs.RecordJob"),)), 0)
    assert runs <= got["cogworker_processed_total", ()]
    assert samples(scrape())["cogworker_processed_total", ()] == 4


def test_a_scrape_counts_batches_and_the_states_of_the_newest(rb, token, monkeypatch):
    # Made with the real API; their jobs' steps run here, as a worker's settlement runs them.
    from admin_fixtures import batch_step

    from django_cogworker import Batch
    from django_cogworker.features.batches import api as api_batches

    expired = Batch("short", ttl=1)
    with expired.jobs():
        pass
    outcomes = {"succeeded": "success", "complete_with_failures": "failure", "incomplete": None}
    for outcome in outcomes.values():
        batch = Batch(f"ends in {outcome}")
        with batch.jobs():
            jid = RecordJob.perform_async("seen")
        if outcome:
            batch_step(batch.bid, jid, outcome, "boom")
    wait_until(lambda: not rb.exists(KEYS.batch(expired.bid).meta), timeout=5, message="its data expired")
    assert rb.zcard(KEYS.batches) == 4
    got = samples(scrape())
    assert got["cogworker_batches", ()] == 3  # (the expired one taken off the listing, not counted)
    assert {state: got["cogworker_recent_batches", (("state", state),)] for state in outcomes} == {
        "succeeded": 1, "complete_with_failures": 1, "incomplete": 1}
    monkeypatch.setattr(api_batches, "STATE_SAMPLE", 2)  # the two newest: complete with failures, incomplete
    got = samples(scrape())
    assert {state: got["cogworker_recent_batches", (("state", state),)] for state in outcomes} == {
        "succeeded": 0, "complete_with_failures": 1, "incomplete": 1}
    assert got["cogworker_batches", ()] == 3


def test_a_scrape_reads_batches_in_a_few_round_trips_however_many_and_states_only_the_newest(rb, token,
                                                                                            monkeypatch):
    from django_cogworker import Batch

    trips = round_trips(monkeypatch)
    samples(scrape())
    without = trips["n"]
    for n in range(1_200):
        with Batch(f"b{n}").jobs():
            pass
    trips["n"] = 0
    got = samples(scrape())
    assert trips["n"] <= without + 2  # (a pipeline each for the oldest's expiry and the newest's states)
    assert got["cogworker_batches", ()] == 1_200
    assert sum(v for (name, _), v in got.items() if name == "cogworker_recent_batches") == 1_000
    assert got["cogworker_recent_batches", (("state", "succeeded"),)] == 1_000  # (empty batches succeed at once)


def test_a_scrape_shows_limiters_per_family_summed_over_their_keys(rb, token):
    # Written into Redis as the workers write them (admin_fixtures.limiter).
    from admin_fixtures import bucket_count, hold, limiter

    limiter(rb, "stripe", "concurrent", 3, lease=60, totals={"granted": 40, "over": 7, "rescheduled": 5, "expired": 1})
    hold(rb, "stripe", "j1", "host:1:a")
    hold(rb, "stripe", "j2", "host:1:a")
    hold(rb, "stripe", "lapsed", "host:2:b", expires_in=-1)
    for n in range(3):
        limiter(rb, f"customer:{n}", "concurrent", 1, lease=60, family="customer",
                totals={"granted": 10, "over": n, "rescheduled": n})
        hold(rb, f"customer:{n}", f"c{n}", "host:1:a")
    limiter(rb, "mail", "bucket", 25, 10, totals={"granted": 100})
    bucket_count(rb, "mail", 10, 4)
    rb.set(KEYS.stat("cancelled"), 12)
    rb.set(KEYS.stat("expired"), 3)
    got = samples(scrape())
    stripe, customer, mail = (("limiter", "stripe"),), (("limiter", "customer"),), (("limiter", "mail"),)
    assert got["cogworker_limit_in_use", stripe] == 2 and got["cogworker_limit_size", stripe] == 3
    assert (got["cogworker_limit_granted_total", stripe], got["cogworker_limit_over_total", stripe],
            got["cogworker_limit_rescheduled_total", stripe], got["cogworker_limit_expired_total", stripe]) \
        == (40, 7, 5, 1)
    assert got["cogworker_limit_in_use", customer] == 3 and ("cogworker_limit_size", customer) not in got
    assert got["cogworker_limit_granted_total", customer] == 30 and got["cogworker_limit_over_total", customer] == 3
    assert not any(labels == (("limiter", "customer:0"),) for _, labels in got)  # no series per key
    assert got["cogworker_limit_in_use", mail] in (4, 0) and got["cogworker_limit_size", mail] == 25
    assert got["cogworker_cancelled_total", ()] == 12 and got["cogworker_expired_total", ()] == 3


def test_limiter_series_are_capped_at_the_families_with_the_most_grants(rb, token, monkeypatch):
    from admin_fixtures import limiter

    for n in range(12):
        limiter(rb, f"family-{n:02d}", "window", 5, 1, totals={"granted": n})
    monkeypatch.setattr(limit_metrics, "FAMILY_LIMIT", 10)
    got = samples(scrape())
    kept = {dict(labels)["limiter"] for name, labels in got if name == "cogworker_limit_granted_total"}
    assert kept == {f"family-{n:02d}" for n in range(2, 12)}
    assert samples(scrape())["cogworker_cancelled_total", ()] == 0
