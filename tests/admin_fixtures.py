"""Data for the admin tests: payloads, users, and a Redis seeded with one of everything the pages show.

Payloads are written the way the engine writes them (``payload.encode``), with
``XSS`` in every field a user can control: args, kwargs, error messages, queue
names, periodic entries, quarantined keys' contents.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis as redis_lib

from django_cogworker import Batch
from django_cogworker.broker.keys import Keys
from django_cogworker.engine.recovery.key_guard import KeyGuard
from django_cogworker.engine.schedule.periodic_ticker import Ticker
from django_cogworker.engine.settle.stats import day_of
from django_cogworker.features.batches.steps import BatchSteps, step_for
from django_cogworker.push import payload as payloads
from django_cogworker.push import runtime
from django_cogworker.push.periodic import Entry
from testproject.demo.jobs import RecordJob

XSS = "<script>alert('cogworker')</script>"
XSS_ESCAPED = "&lt;script&gt;alert(&#x27;cogworker&#x27;)&lt;/script&gt;"
XSS_QUEUE = f"evil{XSS}"
RECORD_JOB = "testproject.demo.jobs.RecordJob"
FAIL_JOB = "testproject.demo.jobs.FailJob"
KEYS = Keys()


def job(klass: str = RECORD_JOB, args: list | None = None, kwargs: dict | None = None, queue: str = "default",
        **fields: Any) -> dict[str, Any]:
    now = time.time()
    return {"jid": payloads.new_jid(), "class": klass, "args": args if args is not None else ["k"],
            "kwargs": kwargs or {}, "queue": queue, "retry": 2, "created_at": now - 120, **fields}


def failed(klass: str = FAIL_JOB, message: str = "boom", **fields: Any) -> dict[str, Any]:
    now = time.time()
    return job(klass, **{"error_class": "RuntimeError", "error_message": message, "failed_at": now - 60,
                         "retry_count": 1, "retried_at": now - 30, "enqueued_at": now - 61,
                         "error_backtrace": ["Traceback (most recent call last):",
                                             f'  File "jobs.py", line 1, in {XSS}', f"RuntimeError: {message}"],
                         **fields})


def zadd(r: redis_lib.Redis, key: str, payload: dict[str, Any], score: float) -> str:
    """Add ``payload`` to a sorted set; return its admin token."""
    raw = payloads.encode(payload)
    r.zadd(key, {raw: score})
    return f"{float(score)!r}|{payload['jid']}"


def push(r: redis_lib.Redis, payload: dict[str, Any]) -> None:
    payload.setdefault("enqueued_at", time.time() - 5)
    r.sadd(KEYS.queues, payload["queue"])
    r.lpush(KEYS.queue(payload["queue"]), payloads.encode(payload))


def fake_process(r: redis_lib.Redis, identity: str = "host:4242:abc123", *, busy_job: dict | None = None,
                 quiet: bool = False, **extra_info: Any) -> str:
    """A process hash and workers hash as the heartbeat writes them (without a running process)."""
    info = {"hostname": "host", "pid": 4242, "tag": "web", "identity": identity, "started_at": time.time() - 3600,
            "queues": ["default", "mail"], "concurrency": 5, "fetch": "reliable", "version": "0.1.0",
            "rss_kb": 51200, **extra_info}
    r.hset(KEYS.process(identity), mapping={"info": json.dumps(info), "busy": "1" if busy_job else "0",
                                            "quiet": str(quiet).lower(), "beat": repr(time.time())})
    r.expire(KEYS.process(identity), 60)
    r.sadd(KEYS.processes, identity)
    if busy_job:
        r.hset(KEYS.workers(identity), "cogworker-processor-1", json.dumps(
            {"queue": busy_job["queue"], "payload": payloads.encode(busy_job), "run_at": time.time() - 3}))
    return identity


def publish_periodic(redis: Any, *entries: Entry) -> None:
    """Publish entries exactly as a worker's ticker does at start."""
    Ticker(redis, KEYS, entries, push=lambda p: None, ready=lambda: True, catch_up=False,
           catch_up_max=1).publish_schedule()


def quarantine(r: redis_lib.Redis, queue: str = "broken", content: dict[str, str] | None = None) -> str:
    """Put a hash in ``queue``'s list key and let the key guard move it; return the quarantine name.

    ``r`` must return bytes (as the engine's client does).
    """
    key = KEYS.queue(queue)
    r.delete(key)
    r.hset(key, mapping=content or {"field": XSS, "other": "value"})
    assert KeyGuard(r, KEYS, [queue]).check() == [key]
    (name,) = [n for n in r.scan_iter(match=KEYS.quarantine_prefix + "*") if key.encode() in n]
    return name.decode()


def seed(r: redis_lib.Redis) -> dict[str, Any]:
    """One of everything; returns the tokens, jids and names the tests act on. ``r`` returns bytes."""
    now = time.time()
    seeded: dict[str, Any] = {}
    seeded["quarantined"] = quarantine(r, "broken")
    for i in range(3):
        queued = job(args=[f"queued-{i}", XSS], kwargs={"note": XSS})
        push(r, queued)
    seeded["queued"] = queued["jid"]
    push(r, job(queue="mail", args=["m"]))
    push(r, job(queue=XSS_QUEUE, args=["x"]))
    seeded["scheduled"] = zadd(r, KEYS.schedule, job(args=["later", XSS], kwargs={"why": XSS}), now + 3600)
    seeded["scheduled_2"] = zadd(r, KEYS.schedule, job(args=["later-2"]), now + 7200)
    seeded["retry"] = zadd(r, KEYS.retry, failed(message=f"retry {XSS}", args=[XSS]), now + 600)
    seeded["retry_2"] = zadd(r, KEYS.retry, failed(message="second"), now + 900)
    seeded["dead"] = zadd(r, KEYS.dead, failed(klass=RECORD_JOB, message=f"dead {XSS}", args=["seed:dead"],
                                               kwargs={"why": XSS}, dead_reason="retries exhausted"), now - 10)
    seeded["dead_2"] = zadd(r, KEYS.dead, failed(message="dead two", dead_reason="retries exhausted"), now - 20)
    running = job(args=["running", XSS])
    seeded["process"] = fake_process(r, busy_job=running)
    seeded["running"] = running["jid"]
    publish_periodic(r, Entry(name="nightly-report", cron="0 3 * * *", job=RECORD_JOB, args=("periodic:ran", XSS),
                              tz="Europe/Paris"),
                     Entry(name="every-minute", cron="* * * * *", job=RECORD_JOB, args=("periodic:minute",),
                           until_executed=True))
    r.set(KEYS.periodic_last_slot("nightly-report"), int(now - 86400))
    for back in range(30):
        day = day_of(now - 86400 * back)
        r.set(KEYS.stat("processed", day), 1000 + 37 * ((back * 7) % 11))
        r.set(KEYS.stat("failed", day), 20 + 5 * (back % 4))
    r.set(KEYS.stat_processed, 123456)
    r.set(KEYS.stat_failed, 789)
    limiter(r, "stripe", "concurrent", 3, lease=60, totals={"granted": 40, "over": 7})
    hold(r, "stripe", "jid-holding-stripe", "host:4242:abc123")
    limiter(r, f"customer:{XSS}", "concurrent", 1, lease=60, family=f"customer {XSS}")
    hold(r, f"customer:{XSS}", XSS, f"host{XSS}:1:a")
    seeded["limit"] = "stripe"
    batch = Batch(description=f"import {XSS}")  # (no jobs, no callbacks: nothing pushed, the counts above stay)
    with batch.jobs():
        pass
    seeded["batch"] = batch.bid
    return seeded


def batch_step(bid: str, jid: str, outcome: str, message: str = "", klass: str = RECORD_JOB) -> None:
    """The batch step of job ``jid`` settling with ``outcome`` ("success", "failure", "dead"), as a
    worker's settlement runs it (``BatchSteps.run`` of the processor's ``step_for``), without the job."""
    config = runtime.get_config()
    steps = BatchSteps(runtime.get_redis(), Keys(config.key_prefix), config.batch_ttl)
    steps.run(step_for({"bid": bid, "jid": jid, "class": klass}, outcome,
                       exc=None if outcome == "success" else ValueError(message)))


# -- realistic data, for the screenshots in docs/ -----------------------------------------------

DEMO_TRACE = [
    "Traceback (most recent call last):",
    '  File "/srv/shop/billing/jobs.py", line 41, in perform',
    "    charge = gateway.charge(invoice.customer_ref, invoice.total_cents)",
    '  File "/srv/shop/billing/gateway.py", line 88, in charge',
    '    response = self.session.post(f"{self.url}/charges", json=body, timeout=10)',
    '  File "/srv/shop/.venv/lib/python3.12/site-packages/requests/sessions.py", line 637, in post',
    '    return self.request("POST", url, data=data, json=json, **kwargs)',
    "requests.exceptions.ConnectTimeout: HTTPSConnectionPool(host='api.payments.example', port=443): "
    "Max retries exceeded with url: /v1/charges (connect timeout=10)",
]


def demo(r: redis_lib.Redis) -> dict[str, Any]:
    """What a shop's admin looks like on a working day (the docs' screenshots); ``r`` returns bytes.

    No hostile data here: the escaping tests use ``seed``, whose ``<script>`` names are not a picture
    of the product.
    """
    now = time.time()
    shown: dict[str, Any] = {}
    for i in range(14):
        push(r, job("shop.jobs.ResizeImage", args=[f"products/{8812 + i}.jpg", [640, 480]],
                    enqueued_at=now - 40 + i))
    for order in (10421, 10422, 10425, 10431, 10432):
        push(r, job("shop.jobs.SendReceipt", queue="mail", args=[order], enqueued_at=now - 3))
    for day in ("2026-12-01", "2026-12-02"):
        push(r, job("reports.jobs.ExportSales", queue="reports", args=[day, "csv"], enqueued_at=now - 5400))
    zadd(r, KEYS.schedule, job("shop.jobs.RemindAbandonedCart", args=[7731], kwargs={"channel": "email"}),
         now + 1800)
    zadd(r, KEYS.schedule, job("shop.jobs.RemindAbandonedCart", args=[7740], kwargs={"channel": "email"}),
         now + 2700)
    zadd(r, KEYS.schedule, job("billing.jobs.RetryDunning", args=["INV-2026-0193"]), now + 86_400)
    shown["retry"] = zadd(r, KEYS.retry, failed(
        "billing.jobs.ChargeInvoice", args=["INV-2026-0207"], retry=5, retry_count=2,
        error_class="requests.exceptions.ConnectTimeout",
        message="HTTPSConnectionPool(host='api.payments.example', port=443): Max retries exceeded with url: "
                "/v1/charges (connect timeout=10)", error_backtrace=DEMO_TRACE), now + 95)
    zadd(r, KEYS.retry, failed("shop.jobs.SendReceipt", args=[10388], error_class="smtplib.SMTPServerDisconnected",
                               message="Connection unexpectedly closed", error_backtrace=[]), now + 640)
    zadd(r, KEYS.dead, failed("catalog.jobs.ImportSupplierFeed", args=["acme", "2026-12-03"],
                              error_class="ValueError", message="row 1824: price 'N/A' is not a number",
                              dead_reason="retries exhausted", error_backtrace=[]), now - 7200)
    zadd(r, KEYS.dead, failed("shop.jobs.SendReceipt", args=[10012], error_class="smtplib.SMTPRecipientsRefused",
                              message="{'old@example.invalid': (550, b'5.1.1 user unknown')}",
                              dead_reason="retries exhausted", error_backtrace=[]), now - 86_400)
    for n, host in enumerate(("worker-1", "worker-2")):
        fake_process(r, f"{host}:{1200 + n}:{'3fa9c1' if n else '8e02d7'}", hostname=host, pid=1200 + n,
                     tag="shop", queues=["default", "mail"], concurrency=10,
                     busy_job=job("shop.jobs.ResizeImage", args=[f"products/{8790 + n}.jpg", [640, 480]]))
    publish_periodic(r, Entry(name="nightly-sales-report", cron="0 3 * * *", job="reports.jobs.ExportSales",
                              queue="reports", args=("yesterday", "csv"), tz="Europe/Paris"),
                     Entry(name="expire-carts", cron="*/15 * * * *", job="shop.jobs.ExpireCarts",
                           until_executed=True))
    r.set(KEYS.periodic_last_slot("nightly-sales-report"), int(now - 86400))
    quarantine(r, "imports", {"started": "2026-12-03T09:12:00", "rows": "1824"})  # (a hash where a list goes)
    for back in range(30):
        day = day_of(now - 86400 * back)
        r.set(KEYS.stat("processed", day), 18_000 + 1_400 * ((back * 7) % 11) - 3_000 * (back % 7 in (5, 6)))
        r.set(KEYS.stat("failed", day), 40 + 9 * (back % 5) + (120 if back == 12 else 0))
    r.set(KEYS.stat_processed, 1_284_903)
    r.set(KEYS.stat_failed, 2_417)
    shown["batch"] = demo_batch(r)
    demo_limits(r)
    return shown


def demo_batch(r: redis_lib.Redis) -> str:
    """A supplier feed's import, most of it run: the batch page of the screenshots. Its jobs' steps
    are run here as a worker's would be; their pushes are then taken off the queue (a worker took them)."""
    prices = Batch("Reprice acme's catalogue")
    with prices.jobs():
        reprice = RecordJob.set(queue="imports").perform_bulk([[{"sku": n}] for n in range(40)])
    for jid in reprice:
        batch_step(prices.bid, jid, "success", klass="catalog.jobs.Reprice")
    feed = Batch("Import supplier feed acme 2026-12-03").on("success", RecordJob)
    with feed.jobs():
        jids = RecordJob.set(queue="imports").perform_bulk([[{"rows": f"{n}-{n + 99}"}]
                                                            for n in range(0, 12_000, 100)])
    for jid in jids[:-9]:
        batch_step(feed.bid, jid, "success", klass="catalog.jobs.ImportRows")
    for n, jid in enumerate(jids[-9:-7]):
        batch_step(feed.bid, jid, "failure", f"row {1824 + n * 377}: price 'N/A' is not a number",
                   klass="catalog.jobs.ImportRows")
    batch_step(feed.bid, jids[-7], "dead", "supplier feed returned HTTP 404 for page 113",
               klass="catalog.jobs.ImportRows")
    r.delete(KEYS.queue("imports"))
    r.srem(KEYS.queues, "imports")
    return feed.bid


# -- limiters, written as the workers write them (the data model of broker/keys/), in Redis time -----


def redis_time(r: redis_lib.Redis) -> float:
    seconds, micros = r.time()
    return seconds + micros / 1_000_000


def limiter(r: redis_lib.Redis, key: str, kind: str, size: int, per: float | None = None, *,
            lease: float | None = None, family: str | None = None, used_ago: float = 1.0,
            totals: dict[str, int] | None = None) -> Any:
    """List limiter ``key`` with its spec, as a heartbeat does; return its ``LimitKeys``."""
    r.zadd(KEYS.limits, {key: redis_time(r) - used_ago})
    r.hset(KEYS.limit_specs, key, json.dumps({"kind": kind, "size": size, "per": per, "lease": lease,
                                              "family": family or key}))
    lk = KEYS.limit(key)
    if totals:
        r.hset(lk.stats, mapping=totals)
    return lk


def hold(r: redis_lib.Redis, key: str, jid: str | None, process: str, *, since_ago: float = 5.0,
         expires_in: float = 60.0) -> None:
    """A holder of concurrency limit ``key``: its lease lapses ``expires_in`` s from Redis's now."""
    now = redis_time(r)
    member = json.dumps({"jid": jid, "process": process, "since": now - since_ago})
    r.zadd(KEYS.limit(key).holders, {member: now + expires_in})


def recent(r: redis_lib.Redis, key: str, minutes_ago: int, over: int = 0, rescheduled: int = 0) -> None:
    """Refusals and reschedules of ``key`` counted ``minutes_ago`` minutes before Redis's now, in the
    ring of ``stats`` the limiter scripts keep (slot = minute % 60; ``m<slot>`` its minute)."""
    minute = int(redis_time(r) // 60) - minutes_ago
    slot = minute % 60
    r.hset(KEYS.limit(key).stats, mapping={f"m{slot}": minute, f"o{slot}": over, f"r{slot}": rescheduled})


def bucket_count(r: redis_lib.Redis, key: str, per: float, count: int, *, buckets_ago: int = 0) -> None:
    """Starts in a bucket of ``key`` (``buckets_ago`` before the current one), as LIMIT_TAKE keeps them."""
    r.hset(KEYS.limit(key).state, mapping={"bn": int(redis_time(r) // per) - buckets_ago, "bc": count})


def demo_limits(r: redis_lib.Redis) -> None:
    """A shop's limiters on a busy afternoon: the payment gateway near its cap, mail buckets, and
    one customer's imports held to one at a time."""
    limiter(r, "payments-api", "concurrent", 4, lease=60, used_ago=0.5,
            totals={"granted": 18_204, "over": 311, "rescheduled": 287, "expired": 2})
    for n, process in enumerate(("worker-1:1200:8e02d7", "worker-2:1201:3fa9c1", "worker-1:1200:8e02d7")):
        hold(r, "payments-api", payloads.new_jid(), process, since_ago=4 + 7 * n, expires_in=55 - 7 * n)
    recent(r, "payments-api", 0, over=14, rescheduled=12)
    recent(r, "payments-api", 2, over=9, rescheduled=9)
    recent(r, "payments-api", 30, over=41, rescheduled=38)
    limiter(r, "smtp", "bucket", 600, 60, used_ago=1, totals={"granted": 96_310, "over": 1_022, "rescheduled": 1_022})
    bucket_count(r, "smtp", 60, 417)
    recent(r, "smtp", 0, over=6, rescheduled=6)
    limiter(r, "catalog-feed:acme", "concurrent", 1, lease=120, family="catalog-feed", used_ago=3,
            totals={"granted": 212, "over": 40, "rescheduled": 40})
    hold(r, "catalog-feed:acme", payloads.new_jid(), "worker-2:1201:3fa9c1", since_ago=95, expires_in=25)
    limiter(r, "partner-api", "window", 100, 60, used_ago=12, totals={"granted": 4_410})
