"""A running job's progress on the admin's busy page, in a real browser (headless Chromium through
selenium, test_admin_browser.py's fixtures) against a real worker: its bar, its note, escaped (a
job's own text, with markup and a script in it), and its ETA; gone once the job succeeded."""

from __future__ import annotations

import pytest
import test_admin_browser as admin_browser
from admin_fixtures import XSS
from helpers import FAST_ENV, Worker, wait_until
from selenium.webdriver.common.by import By

from django_cogworker import api
from testproject.demo.jobs import ProgressJob

pytestmark = pytest.mark.django_db(transaction=True)
# test_admin_browser.py's: the browser (one per module), logged in through the admin's form; its helpers.
browser, logged_in = admin_browser.browser, admin_browser.logged_in
BASE, open_page, screenshot = admin_browser.BASE, admin_browser.open_page, admin_browser.screenshot


def test_the_busy_page_shows_a_running_jobs_bar_note_and_eta_with_its_note_escaped(logged_in, live_server, rb):
    note = f"<b>acme</b> rows {XSS}"
    with Worker("-c", "2", env=FAST_ENV) as worker:
        worker.wait_ready()
        jid = ProgressJob.perform_async("progress-browser:gate", 3, 10, note)
        # (Its first report is written at once, its next one a second later: with it, a rate and an ETA.)
        wait_until(lambda: (p := api.get_progress(jid)) is not None and p.eta is not None, timeout=20,
                   message="the job reported 3 of 10 with an ETA")
        wait_until(lambda: any(w.job.jid == jid for w in api.Workers()), timeout=10,
                   message="its process's beat lists it running")
        open_page(logged_in, live_server, BASE + "busy/", "Processes")  # (an alert, a script run, fails it)
        row = logged_in.find_element(By.ID, f"job-{jid}")
        bar = row.find_element(By.CSS_SELECTOR, ".cw-job-progress .cw-bar")
        assert bar.get_attribute("aria-label") == "30% done"
        assert "width: 30%" in (bar.find_element(By.TAG_NAME, "span").get_attribute("style") or "")
        assert row.find_element(By.CSS_SELECTOR, ".cw-progress").text == "3 / 10 (30%)"
        assert row.find_element(By.CSS_SELECTOR, ".cw-eta").text.startswith("ETA ")
        shown = row.find_element(By.CSS_SELECTOR, ".cw-progress-note")
        assert shown.text == note  # (the markup shown as text, not made into elements)
        assert shown.find_elements(By.XPATH, ".//*") == []
        screenshot(logged_in, "busy_progress")
        rb.set("progress-browser:gate", 1)
        wait_until(lambda: not rb.exists(f"cogworker:progress:{jid}"), timeout=15,
                   message="its progress deleted once it succeeded")
        wait_until(lambda: all(w.job.jid != jid for w in api.Workers()), timeout=10,
                   message="its process's next beat no longer lists it")
        open_page(logged_in, live_server, BASE + "busy/", "Processes")
        assert logged_in.find_elements(By.ID, f"job-{jid}") == []
        assert worker.alive
