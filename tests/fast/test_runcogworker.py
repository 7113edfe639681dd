"""What ``runcogworker`` says at startup (management/commands/runcogworker.py): its one-line
banner, and which Redis URL it uses when the settings and the environment name different ones.

The banner as a real worker prints it is tested in tests/workers/test_worker.py.
"""

from __future__ import annotations

import logging

import pytest
from django.test import override_settings

from django_cogworker.conf import build_config
from django_cogworker.management.commands import runcogworker

RUNCOGWORKER = "django_cogworker.management.commands.runcogworker"


def test_the_banner_names_the_outbox_the_caps_and_the_health_port_when_set():
    plain = build_config({"REDIS_URL": "redis://:s3cret@h:6390/1", "QUEUES": [("mail", 3), "default"],
                          "CONCURRENCY": 10})
    capped = plain.replace(outbox=True, max_memory_mb=512, max_jobs_per_process=10_000, health_port=8086,
                           health_host="0.0.0.0")
    assert runcogworker.banner(plain, 0, 1).split(" | ")[1:] == [
        "redis redis://:***@h:6390/1", "queues mail(3), default(1)", "concurrency 10", "async 100",
        "fetch reliable", "periodic entries 0", "outbox off"]
    assert runcogworker.banner(capped, 2, 4).split(" | ")[6:] == [
        "periodic entries 2", "processes 4", "outbox on", "max memory 512 MB", "max jobs 10000 per process",
        "health 0.0.0.0:8086"]


@pytest.mark.parametrize("setting,environ,expected", [
    # The getting-started snippet's hard-coded URL beat the deployment's COGWORKER_REDIS_URL, silently.
    ({"REDIS_URL": "redis://localhost:6379/0"}, {"COGWORKER_REDIS_URL": "redis://:pw-1@prod:6390/0"},
     'Redis URL from COGWORKER["REDIS_URL"]: redis://localhost:6379/0; also set, and ignored: COGWORKER_REDIS_URL '
     '(redis://:***@prod:6390/0) (the first set of COGWORKER["REDIS_URL"], COGWORKER_REDIS_URL, REDIS_URL wins)'),
    ({}, {"COGWORKER_REDIS_URL": "redis://:pw-1@a:1/0", "REDIS_URL": "redis://:pw-2@b:2/0"},
     "Redis URL from COGWORKER_REDIS_URL: redis://:***@a:1/0; also set, and ignored: REDIS_URL (redis://:***@b:2/0) "
     '(the first set of COGWORKER["REDIS_URL"], COGWORKER_REDIS_URL, REDIS_URL wins)'),
    ({"REDIS_URL": "redis://a:1/0"}, {"COGWORKER_REDIS_URL": "redis://a:1/0", "REDIS_URL": "redis://:pw-2@b:2/0"},
     'Redis URL from COGWORKER["REDIS_URL"]: redis://a:1/0; also set, and ignored: REDIS_URL (redis://:***@b:2/0) '
     '(the first set of COGWORKER["REDIS_URL"], COGWORKER_REDIS_URL, REDIS_URL wins)'),
    ({"REDIS_URL": "redis://a:1/0"}, {"COGWORKER_REDIS_URL": "redis://a:1/0"}, None),  # (the same: nothing to say)
    ({}, {"COGWORKER_REDIS_URL": "redis://a:1/0"}, None),
], ids=["settings-over-env", "env-over-env", "one-of-two-differs", "same", "one"])
def test_a_second_redis_url_that_differs_is_named_as_ignored_its_password_masked(monkeypatch, caplog, setting,
                                                                                 environ, expected):
    for name in ("COGWORKER_REDIS_URL", "REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with override_settings(COGWORKER=setting), caplog.at_level(logging.INFO, logger=RUNCOGWORKER):
        runcogworker._log_redis_url_source()
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == RUNCOGWORKER]
    assert logged == ([("WARNING", expected)] if expected else [])
