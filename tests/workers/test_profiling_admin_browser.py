"""Profiling on request (features/profiling/) in a real browser against a real worker: "Run profiled"
on a dead entry enqueues it marked, the worker runs it under pyinstrument, and the Profiles page lists
it; its page shows the known hot function on top, and pyinstrument's view opens sandboxed (its
script runs, in an origin of its own: no cookie of the admin's). A profile whose names hold markup
never runs it. Uses test_admin_browser's browser and login."""

from __future__ import annotations

import time

import pytest
from admin_fixtures import KEYS, failed, zadd
from helpers import FAST_ENV, Worker, wait_until
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

# The browser and its login, defined once in test_admin_browser.
from test_admin_browser import BASE, assert_page, browser, click, logged_in, messages, screenshot  # noqa: F401

from django_cogworker.features.profiling import records

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg", "mysql"])
HOT_JOB = "testproject.demo.profiled_jobs.HotJob"
XSS = "<script>alert('x')</script>"


def cells(page, table: str) -> list[list[str]]:
    return [[cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
            for row in page.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr")]


def test_run_a_dead_job_profiled_and_read_its_profile(logged_in, live_server, rb):  # noqa: F811 - the fixtures
    page = logged_in
    dead = failed(klass=HOT_JOB, args=["browser:profiled"], message="too slow", dead_reason="retries exhausted")
    token = zadd(rb, KEYS.dead, dead, time.time() - 5)
    with Worker("-c", "2", "-q", "default", env=FAST_ENV) as worker:
        worker.wait_ready()
        page.get(f"{live_server.url}{BASE}dead/")
        assert_page(page, "Dead")
        click(page, f"//button[@name='profile_entry' and @value='dead:{token}']")
        assert_page(page, "Dead")
        assert "Enqueued now, to run profiled (admin: operator)" in messages(page)
        wait_until(lambda: rb.zcard(KEYS.profiles) == 1, timeout=20, message="the profiled run's profile kept")
        assert rb.lrange("browser:profiled", 0, -1) == [dead["jid"].encode()]
    assert rb.zcard(KEYS.dead) == 0

    page.get(f"{live_server.url}{BASE}profiles/")
    assert_page(page, "Profiles")
    [row] = cells(page, "cw-profiles")
    attempt = dead["retry_count"] + 2  # (the run after its last failure: retry_count counts from 0)
    assert row[0] == "admin: operator" and row[1].splitlines() == [HOT_JOB, f"{dead['jid']} · attempt {attempt}"]
    assert row[3].endswith(" s") and row[4] == "pyinstrument" and row[5] == ""
    screenshot(page, "profiles")

    click(page, "//table[@id='cw-profiles']//a[text()='admin: operator']")
    assert_page(page, "Profile admin: operator")
    top = {r[0]: r for r in cells(page, "cw-profile-top")}
    assert "hot" in top and top["hot"][1].endswith("testproject/demo/profiled_jobs.py:10"), list(top)[:10]
    assert float(top["hot"][3].split()[0]) > 0 and top["hot"][2] == "-"  # (a sampling profiler counts no calls)
    screenshot(page, "profile")

    view = page.find_element(By.XPATH, "//p[@id='cw-profile-html']/a[1]").get_attribute("href")
    page.get(view)
    # Its own script ran (pyinstrument draws the call tree), in a sandbox: an origin of its own.
    WebDriverWait(page, 15).until(lambda b: "hot" in b.find_element(By.TAG_NAME, "body").text)
    assert page.execute_script("try { return String(document.cookie) } catch (e) { return e.name }") \
        == "SecurityError"
    assert page.execute_script("return window.origin") == "null"


def test_a_profile_whose_names_hold_markup_shows_them_as_text(logged_in, live_server, rb):  # noqa: F811
    page = logged_in
    records.save(rb, KEYS, records.Profile("c" * 16, XSS, "jid-x", f"app.{XSS}", "default", started=time.time(),
                                           elapsed=0.5, profiler="cProfile", error=f"RuntimeError: {XSS}",
                                           top=[{"function": XSS, "where": f"/{XSS}.py:1", "calls": 1,
                                                 "cumtime": 0.5, "tottime": 0.5}]))
    page.get(f"{live_server.url}{BASE}profiles/")
    assert_page(page, "Profiles")  # (and the <script> never ran)
    [row] = cells(page, "cw-profiles")
    assert row[0] == XSS and row[5] == f"RuntimeError: {XSS}"
    click(page, f"//table[@id='cw-profiles']//a[text()=\"{XSS}\"]")
    assert_page(page, f"Profile {XSS}")
    assert cells(page, "cw-profile-top") == [[XSS, f"/{XSS}.py:1", "1", "0.5000 s", "0.5000 s"]]
    assert page.find_element(By.ID, "cw-profile-error").text == f"RuntimeError: {XSS}"
