"""Periodic entries: declared in settings or with @periodic, validated at startup naming the entry.

`build_entries(settings_list, default_tz)` is what `runcogworker` and `manage.py check` call (with
settings.TIME_ZONE); a bad entry raises ConfigError listing every problem, each naming the entry.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import zoneinfo

import pytest
from helpers import REPO_ROOT

from django_cogworker import Job, periodic
from django_cogworker.errors import ConfigError
from django_cogworker.push import periodic as entries_module
from django_cogworker.push.periodic import Entry, build_entries
from testproject.demo.jobs import RecordJob

RECORD = "testproject.demo.jobs.RecordJob"


class Tidy(Job):
    queue = "mail"

    def perform(self, *args, **kwargs):
        pass


@pytest.fixture
def declared():
    """Isolate @periodic: its declarations are module-global in entries.py."""
    saved = list(entries_module._declared)
    entries_module._declared.clear()
    yield entries_module._declared
    entries_module._declared[:] = saved


def errors_of(raw, default_tz="UTC") -> list[str]:
    with pytest.raises(ConfigError) as info:
        build_entries(raw, default_tz)
    return info.value.errors


# -- settings dicts ----------------------------------------------------------------------------------


def test_a_settings_entry_keeps_every_option(declared):
    [entry] = build_entries([{
        "name": "nightly", "cron": "0 3 * * *", "job": RECORD, "args": ["k", 1], "kwargs": {"value": "v"},
        "queue": "mail", "tz": "Europe/Paris", "until_executed": True, "catch_up": True, "retry": 2,
    }], "UTC")
    assert entry == Entry(name="nightly", cron="0 3 * * *", job=RECORD, args=("k", 1), kwargs={"value": "v"},
                          queue="mail", tz="Europe/Paris", until_executed=True, catch_up=True, retry=2)
    assert entry.pjid == "nightly"


def test_defaults_tz_from_the_default_given_and_options_unset(declared):
    [entry] = build_entries([{"name": "n", "cron": "*/5 * * * *", "job": RECORD}], "Asia/Tokyo")
    assert entry.tz == "Asia/Tokyo"  # runcogworker and check pass settings.TIME_ZONE
    assert (entry.args, dict(entry.kwargs), entry.queue) == ((), {}, None)
    assert entry.until_executed is False
    assert entry.catch_up is None  # None: COGWORKER["PERIODIC_CATCH_UP"] decides
    assert entry.retry is None


def test_the_job_may_be_given_as_its_class(declared):
    [entry] = build_entries([{"name": "n", "cron": "* * * * *", "job": RecordJob}], "UTC")
    assert entry.job == RecordJob.name == RECORD


def test_slots_are_computed_in_the_entry_time_zone(declared):
    [paris, utc] = build_entries([{"name": "p", "cron": "0 3 * * *", "job": RECORD, "tz": "Europe/Paris"},
                                  {"name": "u", "cron": "0 3 * * *", "job": RECORD}], "UTC")
    now = dt.datetime(2024, 6, 1, 12, 0, tzinfo=dt.UTC).timestamp()
    assert dt.datetime.fromtimestamp(paris.latest_slot(now), dt.UTC) == dt.datetime(2024, 6, 1, 1, 0, tzinfo=dt.UTC)
    assert dt.datetime.fromtimestamp(utc.latest_slot(now), dt.UTC) == dt.datetime(2024, 6, 1, 3, 0, tzinfo=dt.UTC)
    # A slot exactly now is the latest slot.
    assert utc.latest_slot(dt.datetime(2024, 6, 1, 3, 0, tzinfo=dt.UTC).timestamp()) == int(
        dt.datetime(2024, 6, 1, 3, 0, tzinfo=dt.UTC).timestamp())
    # slots_after keeps the newest `limit` slots in (after, until], oldest first.
    start = int(dt.datetime(2024, 6, 1, 3, 0, tzinfo=zoneinfo.ZoneInfo("Europe/Paris")).timestamp())
    assert paris.slots_after(start, start + 10 * 86400, 3) == [start + d * 86400 for d in (8, 9, 10)]


# -- the decorator -----------------------------------------------------------------------------------


def test_the_decorator_declares_an_entry_for_its_class(declared):
    @periodic("*/5 * * * *", name="sync-feeds", args=[1], kwargs={"a": 2}, queue="mail", tz="America/New_York",
              until_executed=True, catch_up=False)
    class SyncFeeds(Job):
        def perform(self, *args, **kwargs):
            pass

    assert isinstance(SyncFeeds, type) and issubclass(SyncFeeds, Job)  # the class itself, unchanged
    [entry] = build_entries([], "UTC")
    assert entry == Entry(name="sync-feeds", cron="*/5 * * * *", job=SyncFeeds.name, args=(1,), kwargs={"a": 2},
                          queue="mail", tz="America/New_York", until_executed=True, catch_up=False)


def test_the_decorator_defaults_name_to_the_job_and_tz_to_the_settings(declared):
    @periodic("0 * * * *")
    class Hourly(Job):
        def perform(self):
            pass

    [entry] = build_entries([], "Europe/Paris")
    assert (entry.name, entry.job, entry.tz, entry.queue) == (Hourly.name, Hourly.name, "Europe/Paris", None)


def test_settings_and_decorated_entries_are_built_together(declared):
    periodic("0 1 * * *", name="from-decorator")(Tidy)
    built = build_entries([{"name": "from-settings", "cron": "0 2 * * *", "job": RECORD}], "UTC")
    assert [e.name for e in built] == ["from-settings", "from-decorator"]


# -- startup validation ----------------------------------------------------------------------------


def test_an_invalid_cron_names_the_entry(declared):
    [error] = errors_of([{"name": "ok", "cron": "* * * * *", "job": RECORD},
                         {"name": "bad-cron", "cron": "61 * * * *", "job": RECORD}])
    assert error.startswith("COGWORKER[\"PERIODIC\"][1] ('bad-cron'): 'cron' is not a valid cron expression")
    assert "'61 * * * *'" in error


def test_an_unknown_job_names_the_entry(declared):
    [error] = errors_of([{"name": "ghost", "cron": "* * * * *", "job": "nowhere.jobs.Ghost"}])
    assert "('ghost')" in error and "'nowhere.jobs.Ghost' is not a registered job" in error


def test_a_class_that_is_not_a_job_is_refused(declared):
    [error] = errors_of([{"name": "notjob", "cron": "* * * * *", "job": dict}])
    assert "('notjob')" in error and "is not a registered job" in error


def test_a_duplicate_name_names_the_entry(declared):
    [error] = errors_of([{"name": "twice", "cron": "* * * * *", "job": RECORD},
                         {"name": "twice", "cron": "0 * * * *", "job": RECORD}])
    assert error == "COGWORKER[\"PERIODIC\"][1]: duplicate periodic entry name 'twice'"


def test_a_decorated_entry_clashing_with_a_settings_name_is_a_duplicate(declared):
    periodic("0 1 * * *", name="shared")(Tidy)
    [error] = errors_of([{"name": "shared", "cron": "* * * * *", "job": RECORD}])
    assert error == "@periodic entry: duplicate periodic entry name 'shared'"


def test_an_invalid_decorated_entry_fails_at_startup_not_at_import(declared):
    periodic("not a cron", name="broken")(Tidy)  # no error here
    [error] = errors_of([])
    assert error.startswith("@periodic entry ('broken'): 'cron' is not a valid cron expression")


def test_every_problem_is_reported_at_once(declared):
    errors = errors_of([
        {"name": "a", "cron": "nope", "job": RECORD},
        {"name": "b", "cron": "* * * * *", "job": "missing.Job"},
        {"name": "c", "cron": "* * * * *", "job": RECORD, "tz": "Mars/Olympus"},
        {"cron": "* * * * *", "job": RECORD},
        {"name": "d:x", "cron": "* * * * *", "job": RECORD},
        {"name": "e", "cron": "* * * * *", "job": RECORD, "until_executed": "yes"},
        {"name": "f", "cron": "* * * * *", "job": RECORD, "args": "k"},
        {"name": "g", "cron": "* * * * *", "job": RECORD, "colour": "red"},
        "not a dict",
    ])
    assert len(errors) == 9, errors
    for where, fragment in [("[0] ('a')", "'cron'"), ("[1] ('b')", "not a registered job"),
                            ("[2] ('c')", "'tz' is not a known time zone: 'Mars/Olympus'"), ("[3]", "'name'"),
                            ("[4] ('d:x')", "without ':'"), ("[5] ('e')", "'until_executed' must be True or False"),
                            ("[6] ('f')", "'args' must be a list"), ("[7] ('g')", "unknown key(s) ['colour']"),
                            ("[8]", "must be a dict")]:
        assert any(f'COGWORKER["PERIODIC"]{where}' in e and fragment in e for e in errors), (where, errors)


def test_arguments_and_queue_are_checked_at_startup(declared):
    errors = errors_of([
        {"name": "when", "cron": "* * * * *", "job": RECORD, "args": [dt.date(2024, 1, 1)]},
        {"name": "set", "cron": "* * * * *", "job": RECORD, "kwargs": {"tags": {1, 2}}},
        {"name": "q", "cron": "* * * * *", "job": RECORD, "queue": ""},
    ])
    assert len(errors) == 3, errors
    assert "('when')" in errors[0] and "JSON-native" in errors[0]
    assert "('set')" in errors[1] and "JSON-native" in errors[1]
    assert "('q')" in errors[2] and "'queue' must be a non-empty string" in errors[2]


# -- the edges that run the validation -------------------------------------------------------------

BAD = [
    {"name": "bad-cron", "cron": "61 * * * *", "job": RECORD},
    {"name": "ghost", "cron": "* * * * *", "job": "nowhere.jobs.Ghost"},
    {"name": "twice", "cron": "* * * * *", "job": RECORD},
    {"name": "twice", "cron": "0 * * * *", "job": RECORD},
]
NAMED = ["('bad-cron'): 'cron' is not a valid cron expression", "('ghost'): 'job' 'nowhere.jobs.Ghost'",
         "duplicate periodic entry name 'twice'"]


def test_manage_py_check_reports_each_bad_entry():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings", "COGWORKER_PERIODIC": json.dumps(BAD)}
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert out.count("cogworker.E003") == 3, out
    for fragment in NAMED:
        assert fragment in out, out


