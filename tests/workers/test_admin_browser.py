"""The Cogworker admin in a real browser: headless Debian Chromium (selenium) against the live server.

Logs in through the admin's login form, opens every page (saving a screenshot of each to
docs/screenshots/), and operates real worker subprocesses: retries a dead job and sees it run (and
a batch the outbox sent to dead: its jobs run once),
disables a periodic entry the worker published, quiets the worker. Never skipped: without
chromium and chromedriver (scripts/ensure_chromium.sh installs them) these tests fail.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from admin_fixtures import KEYS, RECORD_JOB, demo, failed, seed, zadd
from django.contrib.auth.models import User
from helpers import FAST_ENV, Worker, wait_until
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from django_cogworker import api
from django_cogworker.outbox.models import OutboxJob

# `make screenshots` refreshes the ones in docs/; an ordinary run writes them to a temp dir, so
# the suite leaves the work tree as it found it.
SCREENSHOTS = Path(os.environ.get("COGWORKER_SCREENSHOTS") or tempfile.mkdtemp(prefix="cogworker-shots-"))
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1280,900"]
BASE = "/admin/django_cogworker/"
# (Every database: the Outbox page reads the outbox of each, "pg" and "mysql" too.)
pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg", "mysql"])


@pytest.fixture(scope="module")
def browser():
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not chromedriver:
        raise RuntimeError("chromium and chromedriver must be on PATH for the admin browser tests: run "
                           "`bash scripts/ensure_chromium.sh` (or apt-get install chromium chromium-driver), "
                           "or `make test`, which does")
    profile = tempfile.mkdtemp(prefix="cogworker-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    # The driver's path is given, so selenium never looks for (or downloads) a driver or a browser.
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def logged_in(browser, live_server, transactional_db):
    """The browser, logged in as a superuser through the admin's login form."""
    User.objects.create_superuser("operator", password="s3cret-pw")
    browser.delete_all_cookies()
    browser.get(f"{live_server.url}/admin/login/?next={BASE}dashboard/")
    browser.find_element(By.ID, "id_username").send_keys("operator")
    browser.find_element(By.ID, "id_password").send_keys("s3cret-pw")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait_until(lambda: browser.current_url.endswith(f"{BASE}dashboard/"), timeout=10, message="logged in")
    return browser


def open_page(browser, live_server, path: str, heading: str) -> None:
    browser.get(live_server.url + path)
    assert_page(browser, heading)


def assert_page(browser, heading: str) -> None:
    h1 = browser.find_element(By.TAG_NAME, "h1").text
    assert h1 == heading, (browser.current_url, h1)
    try:  # a payload's <script> must never run
        alert = browser.switch_to.alert
        raise AssertionError(f"an alert opened on {browser.current_url}: {alert.text}")
    except NoAlertPresentException:
        pass


def screenshot(browser, name: str) -> Path:
    """Save the whole page (the window stretched to its height) as <SCREENSHOTS>/<name>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1280, min(max(int(height), 600), 3000))
    path = SCREENSHOTS / f"{name}.png"
    browser.save_screenshot(str(path))
    browser.set_window_size(1280, 900)
    assert path.stat().st_size > 10_000
    return path


def click(browser, xpath: str) -> None:
    """Click what ``xpath`` finds and wait for the next page (every click here submits or follows a link)."""
    target = browser.find_element(By.XPATH, xpath)
    browser.execute_script("window.cwOldPage = true")  # gone once the next page has replaced this one
    target.click()
    # Mid-navigation, the driver may answer a script with an error instead of a result: ask again.
    WebDriverWait(browser, 15, ignored_exceptions=(WebDriverException,)).until(
        lambda b: b.execute_script("return !window.cwOldPage && document.readyState === 'complete'"))


def messages(browser) -> str:
    return " ".join(e.text for e in browser.find_elements(By.CSS_SELECTOR, ".messagelist li"))


PAGES = [("/admin/", "Site administration", "admin_index"),
         (BASE + "dashboard/", "Dashboard", "dashboard"),
         (BASE + "queue/", "Queues", "queues"),
         (BASE + "queue/default/", "Queue default", "queue_jobs"),
         (BASE + "busy/", "Processes", "busy"),
         (BASE + "scheduled/", "Scheduled", "scheduled"),
         (BASE + "retry/", "Retries", "retries"),
         (BASE + "dead/", "Dead", "dead"),
         (BASE + "batches/", "Job batches", "batches"),
         (BASE + "limits/", "Limits", "limits"),
         (BASE + "periodic/", "Periodic", "periodic"),
         (BASE + "quarantine/", "Quarantine", "quarantine"),
         (BASE + "outbox/", "Outbox", "outbox")]


def test_every_page_in_a_browser_runs_no_script_of_the_data(logged_in, live_server, rb):
    # `<script>` in every field a payload controls: no page may run it. (Not a picture of the
    # product: the screenshots come from the test below, with realistic data.)
    seeded = seed(rb)
    b = logged_in
    for path, heading, _name in PAGES:
        open_page(b, live_server, path, heading)
    assert "COGWORKER" in b.find_element(By.ID, "nav-sidebar").text.upper()
    # A job's detail page, reached from its row.
    open_page(b, live_server, BASE + "retry/", "Retries")
    click(b, f"//a[contains(@href, '/job/') and text()='{failed()['class']}']")
    assert_page(b, f"Retries: {failed()['class']}")
    assert "Traceback (most recent call last):" in b.page_source and "retry <script>" in b.find_element(
        By.TAG_NAME, "main").text
    # "Delete all" asks first; "No" changes nothing.
    open_page(b, live_server, BASE + "dead/", "Dead")
    click(b, "//button[@value='delete_all']")
    assert_page(b, "Are you sure?")
    click(b, "//a[contains(@class, 'cancel-link')]")
    assert_page(b, "Dead")
    assert rb.zcard(KEYS.dead) == 2 and seeded["dead"]


def test_screenshots_of_every_page_with_realistic_data(logged_in, live_server, rb):
    # The docs' screenshots showed the escaping test's queue `evil<script>alert('cogworker')</script>`.
    shown = demo(rb)
    b = logged_in
    for path, heading, name in PAGES:
        open_page(b, live_server, path, heading)
        assert "<script>" not in b.find_element(By.TAG_NAME, "main").text
        screenshot(b, name)
    open_page(b, live_server, f"{BASE}batches/{shown['batch']}/", "Batch Import supplier feed acme 2026-12-03")
    screenshot(b, "batch_detail")
    open_page(b, live_server, f"{BASE}limits/payments-api/", "Limit payments-api")
    screenshot(b, "limit_detail")
    open_page(b, live_server, BASE + "queue/", "Queues")
    assert "no process reads it" in b.find_element(By.XPATH, "//tr[td[contains(., 'reports')]]").text
    open_page(b, live_server, BASE + "retry/", "Retries")
    click(b, "//a[contains(@href, '/job/') and text()='billing.jobs.ChargeInvoice']")
    assert_page(b, "Retries: billing.jobs.ChargeInvoice")
    screenshot(b, "job_detail")
    open_page(b, live_server, BASE + "dead/", "Dead")
    click(b, "//button[@value='delete_all']")
    assert_page(b, "Are you sure?")
    screenshot(b, "confirm")


def test_retry_a_dead_job_and_see_it_run(logged_in, live_server, rb):
    dead = failed(klass=RECORD_JOB, args=["browser:ran"], message="it failed once", dead_reason="retries exhausted")
    token = zadd(rb, KEYS.dead, dead, time.time() - 5)
    with Worker("-c", "2", "-q", "default", env=FAST_ENV) as worker:
        worker.wait_ready()
        open_page(logged_in, live_server, BASE + "dead/", "Dead")
        click(logged_in, f"//button[@name='row_action' and @value='retry {token}']")
        assert_page(logged_in, "Dead")
        assert "1 entry retried" in messages(logged_in)
        ran = wait_until(lambda: rb.lrange("browser:ran", 0, -1), timeout=15, message="the retried job ran")
        assert ran == [dead["jid"].encode()]
    assert rb.zcard(KEYS.dead) == 0


def test_a_batch_whose_callback_raises_shows_it_failing_and_links_to_its_retry(logged_in, live_server, rb):
    # A real worker runs the batch's jobs, then its success callback, which raises and is retried
    # like any job: the batch's page says where it waits, with its error, and opens its entry.
    from django_cogworker import Batch
    from testproject.demo.jobs import FailJob, RecordJob

    batch = Batch("nightly export").on("success", FailJob)
    with batch.jobs():
        for n in range(3):
            RecordJob.perform_async("browser:batch", n)
    with Worker("-c", "2", env=FAST_ENV) as worker:
        worker.wait_ready()
        wait_until(lambda: rb.zcard(KEYS.retry) == 1, timeout=20, message="the callback failed into retry")
        worker.term()
        worker.wait(30)
    b = logged_in
    open_page(b, live_server, BASE + "batches/", "Job batches")
    row = b.find_element(By.XPATH, "//tr[td[contains(., 'nightly export')]]")
    assert "succeeded" in row.text and "3 / 3" in row.text
    click(b, "//a[text()='nightly export']")
    assert_page(b, "Batch nightly export")
    callback = b.find_element(By.XPATH, "//tr[td[text()='success']]")
    assert "testproject.demo.jobs.FailJob" in callback.text and "failing: in Retries" in callback.text
    assert "RuntimeError" in callback.text
    click(b, "//a[span[text()='failing: in Retries']]")
    assert_page(b, "Retries: testproject.demo.jobs.FailJob")
    assert "RuntimeError" in b.find_element(By.TAG_NAME, "main").text


def test_the_limits_page_from_the_sidebar_to_a_key_and_its_holder(logged_in, live_server, rb):
    from admin_fixtures import hold, limiter

    limiter(rb, "payments-api", "concurrent", 4, lease=60, totals={"granted": 120, "over": 9})
    hold(rb, "payments-api", "jid-charging", "worker-1:1200:8e02d7")
    b = logged_in
    open_page(b, live_server, BASE + "dashboard/", "Dashboard")
    sidebar = [a.text for a in b.find_elements(By.CSS_SELECTOR, "#nav-sidebar .app-django_cogworker th a")]
    assert sidebar[0] == "Dashboard" and "Limits" in sidebar, sidebar
    click(b, "//nav[@id='nav-sidebar']//a[text()='Limits']")
    assert_page(b, "Limits")
    row = b.find_element(By.XPATH, "//tr[td[contains(., 'payments-api')]]")
    assert "1 / 4" in row.text and "jid-charging" in row.text
    bar = row.find_element(By.CSS_SELECTOR, ".cw-bar-ok")
    assert bar.size["width"] > 0  # a quarter of the bar, drawn
    click(b, "//a[text()='payments-api']")
    assert_page(b, "Limit payments-api")
    holder = b.find_element(By.XPATH, "//div[contains(@class, 'cw-holders')]//tr[td[contains(., 'jid-charging')]]")
    assert "worker-1:1200:8e02d7" in holder.text and "Interrupt" in holder.text
    click(b, "//a[text()='jid-charging']")
    assert_page(b, "Processes")


def test_cancel_a_waiting_job_from_its_queue(logged_in, live_server, rb):
    from testproject.demo.jobs import RecordJob

    kept = RecordJob.perform_async("browser:kept", 1)
    jid = RecordJob.perform_async("browser:cancelled", 2)
    b = logged_in
    open_page(b, live_server, BASE + "queue/default/", "Queue default")
    click(b, f"//tr[td[contains(., '{jid}')]]//button[text()='Cancel']")
    assert_page(b, "Queue default")
    assert f"Job {jid} cancelled: taken off where it waited; it won't run." in messages(b)
    rows = b.find_element(By.CSS_SELECTOR, ".cw-table tbody").text
    assert jid not in rows and kept in rows
    assert [j.jid for j in api.Queue("default").jobs(1, 10).items] == [kept]
    assert rb.get(KEYS.stat_cancelled) == b"1"


def test_disable_a_periodic_entry_a_worker_published(logged_in, live_server, rb):
    entry = {"name": "browser-nightly", "cron": "0 3 * * *", "job": RECORD_JOB, "args": ["periodic:ran"],
             "tz": "Europe/Paris"}
    with Worker("-c", "1", env={**FAST_ENV, "COGWORKER_PERIODIC": json.dumps([entry])}) as worker:
        worker.wait_ready()
        wait_until(lambda: rb.hexists(KEYS.periodic_schedule, "browser-nightly"), timeout=10,
                   message="schedule published")
        open_page(logged_in, live_server, BASE + "periodic/", "Periodic")
        row = "//tr[td[contains(., 'browser-nightly')]]"
        assert "enabled" in logged_in.find_element(By.XPATH, row).text
        click(logged_in, f"{row}//button[@value='disable']")
        assert_page(logged_in, "Periodic")
        assert "disabled" in logged_in.find_element(By.XPATH, row).text
        assert rb.sismember(KEYS.periodic_disabled, "browser-nightly")
        assert "browser-nightly disabled" in messages(logged_in)


def test_quiet_a_process(logged_in, live_server, rb):
    with Worker("-c", "3", env=FAST_ENV) as worker:
        identity = worker.wait_ready()
        open_page(logged_in, live_server, BASE + "busy/", "Processes")
        row = f"//tr[td[contains(., '{identity}')]]"
        assert "running" in logged_in.find_element(By.XPATH, row).text
        click(logged_in, f"{row}//button[@value='quiet']")
        assert_page(logged_in, "Processes")
        assert f"Sent quiet to {identity}" in messages(logged_in)
        wait_until(lambda: rb.hget(KEYS.process(identity), "quiet") == b"true", timeout=10, message="quiet")
        open_page(logged_in, live_server, BASE + "busy/", "Processes")
        assert "quiet" in logged_in.find_element(By.XPATH, row).text
        screenshot(logged_in, "busy_quiet_worker")
        assert worker.alive


def test_relay_now_from_the_outbox_page(logged_in, live_server, rb, settings):
    settings.COGWORKER = {**settings.COGWORKER, "OUTBOX": True}
    # Jobs of committed transactions that Redis was away for: rows, one database each.
    for alias, jid in (("default", "jid-sqlite"), ("pg", "jid-postgres"), ("mysql", "jid-mariadb")):
        OutboxJob.objects.using(alias).create(jid=jid, created=time.time() - 150, payload=json.dumps(
            {"class": RECORD_JOB, "jid": jid, "queue": "default", "args": ["outbox"], "kwargs": {}}))
    b = logged_in
    open_page(b, live_server, BASE + "outbox/", "Outbox")
    rows = {row.find_element(By.TAG_NAME, "td").text: row.text
            for row in b.find_elements(By.CSS_SELECTOR, "#cw-outbox tbody tr")}
    assert rows["default"].split()[1] == "1" and "2m" in rows["default"], rows
    assert rows["pg"].split()[1] == "1" and rows["mysql"].split()[1] == "1", rows
    click(b, "//button[@id='cw-relay-now']")
    assert_page(b, "Outbox")
    assert "3 job(s) relayed." in messages(b)
    assert sorted(json.loads(raw)["jid"] for raw in rb.lrange(KEYS.queue("default"), 0, -1)) == [
        "jid-mariadb", "jid-postgres", "jid-sqlite"]
    assert [row.text.split()[1] for row in b.find_elements(By.CSS_SELECTOR, "#cw-outbox tbody tr")] == ["0"] * 3



def test_retry_a_batch_the_outbox_sent_to_dead_and_see_its_jobs_run_once(logged_in, live_server, rb, settings):
    from django.db import transaction

    from django_cogworker import Batch
    from django_cogworker.outbox.relay import relay_once
    from django_cogworker.push import runtime
    from testproject.demo.jobs import RecordJob

    settings.COGWORKER = {**settings.COGWORKER, "OUTBOX": True}
    # A batch committed while its queue's key held the wrong type: its unit (the batch's steps,
    # one outbox row) can't run, and a relay sends it to dead with the reason.
    rb.set(KEYS.queue("default"), "a string, not a list")
    batch = Batch("outbox export")
    with transaction.atomic():
        with batch.jobs():
            jids = RecordJob.perform_bulk([("browser:unit",), ("browser:unit",)])
    assert relay_once("default", runtime.get_client().hand_over, rb, KEYS, now=time.time(), fresh=0) == 1
    [entry] = api.DeadSet().page().items
    assert entry.payload["class"] == "django_cogworker.outbox_unit" and not entry.queue
    rb.delete(KEYS.queue("default"))  # (mended)
    with Worker("-c", "2", "-q", "default", env=FAST_ENV) as worker:
        worker.wait_ready()
        b = logged_in
        open_page(b, live_server, BASE + "dead/", "Dead")
        assert "holds the wrong type" in b.find_element(By.TAG_NAME, "main").text
        click(b, f"//button[@name='row_action' and @value='retry {entry.token}']")
        assert_page(b, "Dead")
        assert "1 entry retried" in messages(b)
        wait_until(lambda: Batch.status(batch.bid).complete, timeout=20, message="the batch's jobs ran")
        assert sorted(rb.lrange("browser:unit", 0, -1)) == sorted(j.encode() for j in jids)
        status = Batch.status(batch.bid)
        assert (status.total, status.pending, status.committed, status.success) == (2, 0, True, True)
    assert rb.zcard(KEYS.dead) == 0 and OutboxJob.objects.count() == 0
    assert len(rb.lrange("browser:unit", 0, -1)) == 2
