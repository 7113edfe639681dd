"""The Metrics page (features/history/) in a real browser: classes by run time with their
percentiles, a chart per class with the deploy marks, and the class and queue filters kept in the
URL. Uses test_admin_browser's browser and login; the history is counted as a worker counts it."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

# The browser and its login, defined once in test_admin_browser.
from test_admin_browser import BASE, assert_page, browser, click, logged_in, screenshot  # noqa: F401

from django_cogworker.broker.keys import Keys
from django_cogworker.engine.loops import redis_time
from django_cogworker.features.history import api
from django_cogworker.features.history.recorder import Recorder

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg", "mysql"])
ODD = "<script>alert('x')</script>|odd"


def test_the_metrics_page_ranks_classes_charts_them_with_marks_and_keeps_its_filters_in_the_url(
        logged_in, live_server, rb):  # noqa: F811 - the fixtures imported above
    page = logged_in
    rec = Recorder(Keys())
    rec.anchor(redis_time(rb))
    for _ in range(4):
        rec.record("default", "shop.Sync", 0.2, failed=False)
    rec.record("default", "shop.Sync", 0.2, failed=True)
    for _ in range(10):
        rec.record("mail", ODD, 0.003, failed=False)
    rec.flush(rb)
    api.add_mark("deploy 1.4.2", redis=rb)

    page.get(f"{live_server.url}{BASE}metrics/")
    assert_page(page, "Metrics")  # (and the odd class's <script> never ran)
    rows = [[cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
            for row in page.find_elements(By.CSS_SELECTOR, "#cw-metrics-classes tbody tr")]
    assert rows == [["shop.Sync", "5", "1", "1,000.0 ms", "200.0 ms", "175.0 ms", "242.5 ms", "248.5 ms"],
                    [ODD, "10", "0", "30.0 ms", "3.0 ms", "2.5 ms", "4.8 ms", "5.0 ms"]]
    charts = page.find_elements(By.CSS_SELECTOR, ".cw-class-chart")
    assert [c.find_element(By.TAG_NAME, "h2").text for c in charts] == ["shop.Sync", ODD]
    assert len(charts[0].find_elements(By.CSS_SELECTOR, "svg line.cw-mark")) == 1
    assert len(charts[0].find_elements(By.CSS_SELECTOR, "svg rect.failed")) == 1
    assert "deploy 1.4.2" in page.find_element(By.CSS_SELECTOR, ".cw-mark").text
    screenshot(page, "metrics")

    # The filters are the URL's: chosen in the form, kept by a reload (a bookmark).
    Select(page.find_element(By.NAME, "hours")).select_by_value("24")
    Select(page.find_element(By.NAME, "queue")).select_by_visible_text("mail")
    click(page, "//form[@id='cw-metrics-filters']//button")
    assert parse_qs(urlparse(page.current_url).query) == {"hours": ["24"], "queue": ["mail"]}  # (class: "", all)
    page.get(page.current_url)
    names = [row.find_element(By.TAG_NAME, "td").text
             for row in page.find_elements(By.CSS_SELECTOR, "#cw-metrics-classes tbody tr")]
    assert names == [ODD]
    assert Select(page.find_element(By.NAME, "queue")).first_selected_option.text == "mail"
    assert Select(page.find_element(By.NAME, "hours")).first_selected_option.get_attribute("value") == "24"
    click(page, f"//table[@id='cw-metrics-classes']//a[text()=\"{ODD}\"]")
    query = parse_qs(urlparse(page.current_url).query)
    assert query == {"hours": ["24"], "class": [ODD], "queue": ["mail"]}
    assert [c.find_element(By.TAG_NAME, "h2").text for c in page.find_elements(By.CSS_SELECTOR, ".cw-class-chart")] \
        == [ODD]
