"""conf: one COGWORKER dict plus the environment -> one validated, frozen Config.

Every bad value is named (setting and value given); a password never shows in an error or the banner.
"""

from __future__ import annotations

import dataclasses
import os
import runpy

import pytest
import redis
from django.test import override_settings
from helpers import REPO_ROOT, RedisServer

from django_cogworker import ConfigError, Job
from django_cogworker.conf import SETTINGS, Config, build_config, redact_url
from django_cogworker.push import runtime

PASSWORD = "s3cret-Pw"


class ConfPing(Job):
    def perform(self, n):
        pass


def errors_of(raw, environ=None, **overrides) -> list[str]:
    with pytest.raises(ConfigError) as info:
        build_config(raw, environ or {}, **overrides)
    return info.value.errors


# -- defaults and sources ------------------------------------------------------------------


def test_defaults_are_the_documented_ones():
    cfg = build_config({}, {})
    assert (cfg.redis_url, cfg.key_prefix, cfg.concurrency, cfg.fetch) == (
        "redis://localhost:6379/0", "cogworker:", 5, "reliable")
    assert (cfg.shutdown_timeout, cfg.max_retries, cfg.dead_max_jobs) == (25, 25, 10_000)
    assert cfg.dead_timeout == 180 * 24 * 3600
    assert (cfg.orphan_threshold, cfg.max_orphanings, cfg.enqueue_on_commit) == (300, 3, True)
    assert cfg.queues == (("default", 1),)
    assert cfg == Config()


def test_settings_are_uppercase_keys_of_one_dict():
    cfg = build_config({"CONCURRENCY": 12, "FETCH": "basic", "KEY_PREFIX": "app1:", "MAX_RETRIES": 0,
                        "ENQUEUE_ON_COMMIT": False, "DEAD_TIMEOUT": 3600.5}, {})
    assert (cfg.concurrency, cfg.fetch, cfg.key_prefix, cfg.max_retries) == (12, "basic", "app1:", 0)
    assert (cfg.enqueue_on_commit, cfg.dead_timeout) == (False, 3600.5)


@pytest.mark.parametrize(("raw", "environ", "expected"), [
    ({}, {"COGWORKER_REDIS_URL": "redis://a:1/1", "REDIS_URL": "redis://b:2/2"}, "redis://a:1/1"),
    ({}, {"REDIS_URL": "redis://b:2/2"}, "redis://b:2/2"),
    ({}, {"COGWORKER_REDIS_URL": "", "REDIS_URL": "redis://b:2/2"}, "redis://b:2/2"),
    ({"REDIS_URL": "redis://s:3/3"}, {"COGWORKER_REDIS_URL": "redis://a:1/1", "REDIS_URL": "redis://b:2/2"},
     "redis://s:3/3"),
], ids=["cogworker-env-first", "redis-url-env", "empty-env-skipped", "settings-win"])
def test_redis_url_from_settings_then_environment(raw, environ, expected):
    assert build_config(raw, environ).redis_url == expected


def test_runtime_reads_settings_and_falls_back_to_the_environment(redis_url):
    with override_settings(COGWORKER={"CONCURRENCY": 7}):
        cfg = runtime.get_config()
        assert (cfg.concurrency, cfg.redis_url) == (7, redis_url)
    with override_settings(COGWORKER={"REDIS_URL": "redis://elsewhere:6390/4"}):
        assert runtime.get_config().redis_url == "redis://elsewhere:6390/4"
    assert runtime.get_config().redis_url == redis_url  # override gone, config rebuilt


def test_config_is_frozen_and_replace_validates_again():
    cfg = build_config({}, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.concurrency = 50  # type: ignore[misc]
    assert cfg.replace(concurrency=8).concurrency == 8
    with pytest.raises(ConfigError, match=r'COGWORKER\["CONCURRENCY"\] must be a positive integer, got 0'):
        cfg.replace(concurrency=0)


@pytest.mark.parametrize(("value", "expected"), [
    (["mail", "default"], (("mail", 1), ("default", 1))),
    ([("mail", 3), ["default", 1]], (("mail", 3), ("default", 1))),
    (["mail,3", "low"], (("mail", 3), ("low", 1))),
])
def test_queues_names_or_weighted_pairs_keep_their_order(value, expected):
    cfg = build_config({"QUEUES": value}, {})
    assert cfg.queues == expected
    assert cfg.queue_names == tuple(name for name, _ in expected)


# -- every bad value named -------------------------------------------------------------------


@pytest.mark.parametrize(("key", "value", "message"), [
    ("MAX_ORPHANINGS", 0, 'COGWORKER["MAX_ORPHANINGS"] must be a positive integer, got 0'),
    ("CONCURRENCY", "5", "COGWORKER[\"CONCURRENCY\"] must be a positive integer, got '5'"),
    ("CONCURRENCY", True, 'COGWORKER["CONCURRENCY"] must be a positive integer, got True'),
    ("CONCURRENCY", 2.5, 'COGWORKER["CONCURRENCY"] must be a positive integer, got 2.5'),
    ("PROCESSES", 0, 'COGWORKER["PROCESSES"] must be a positive integer or "auto", got 0'),
    ("PROCESSES", "4", 'COGWORKER["PROCESSES"] must be a positive integer or "auto", got \'4\''),
    ("PROCESSES", "AUTO", 'COGWORKER["PROCESSES"] must be a positive integer or "auto", got \'AUTO\''),
    ("PROCESSES", True, 'COGWORKER["PROCESSES"] must be a positive integer or "auto", got True'),
    ("DEAD_MAX_JOBS", -1, 'COGWORKER["DEAD_MAX_JOBS"] must be a positive integer, got -1'),
    ("MAX_RETRIES", -1, 'COGWORKER["MAX_RETRIES"] must be an integer >= 0, got -1'),
    ("PREFETCH", -1, 'COGWORKER["PREFETCH"] must be an integer >= 0, got -1'),
    ("PREFETCH", True, 'COGWORKER["PREFETCH"] must be an integer >= 0, got True'),
    ("FETCH", "fast", "COGWORKER[\"FETCH\"] must be one of \"reliable\", \"basic\", got 'fast'"),
    ("SHUTDOWN_TIMEOUT", 0, 'COGWORKER["SHUTDOWN_TIMEOUT"] must be a positive number of seconds, got 0'),
    ("DEAD_TIMEOUT", float("inf"), 'COGWORKER["DEAD_TIMEOUT"] must be a positive number of seconds, got inf'),
    ("ORPHAN_THRESHOLD", "300", "COGWORKER[\"ORPHAN_THRESHOLD\"] must be a positive number of seconds, got '300'"),
    ("TIMEOUT_GRACE", -1, 'COGWORKER["TIMEOUT_GRACE"] must be a positive number of seconds, got -1'),
    # (Past what Redis can expire: every batch failed in its opening script; 10**400 raised OverflowError.)
    ("BATCH_TTL", 1e16, 'COGWORKER["BATCH_TTL"] must be at most 1e9 seconds (about 31 years), got 1e+16'),
    ("UNIQUE_LOCK_TTL", 10**400, f'COGWORKER["UNIQUE_LOCK_TTL"] must be at most 1e9 seconds (about 31 years), '
                                 f'got {10**400}'),
    ("PRIORITY_AGING", -1, 'COGWORKER["PRIORITY_AGING"] must be a number of seconds from 0 (no aging) to 1e9 '
                           'seconds (about 31 years), got -1'),
    ("PRIORITY_AGING", True, 'COGWORKER["PRIORITY_AGING"] must be a number of seconds from 0 (no aging) to 1e9 '
                             'seconds (about 31 years), got True'),
    ("PRIORITY_AGING", "60", 'COGWORKER["PRIORITY_AGING"] must be a number of seconds from 0 (no aging) to 1e9 '
                             "seconds (about 31 years), got '60'"),
    ("ENQUEUE_ON_COMMIT", "no", "COGWORKER[\"ENQUEUE_ON_COMMIT\"] must be True or False, got 'no'"),
    ("KEY_PREFIX", "", "COGWORKER[\"KEY_PREFIX\"] must be a non-empty string, got ''"),
    ("QUEUES", "default", "COGWORKER[\"QUEUES\"] must be a list of queue names or (name, weight) pairs, "
                          "got 'default'"),
    ("QUEUES", [("mail", 0)], "COGWORKER[\"QUEUES\"] weight of 'mail' must be a positive integer, got 0"),
    ("QUEUES", ["mail", "mail"], "COGWORKER[\"QUEUES\"] must list each queue once, got 'mail' more than once"),
    ("QUEUES", ["has space"], "COGWORKER[\"QUEUES\"] queue names must be non-empty strings without spaces, "
                              "got 'has space'"),
    ("REDIS_URL", "localhost:6379", 'COGWORKER["REDIS_URL"] must be a redis://, rediss://, unix://, redis+sentinel://, '
                                    'rediss+sentinel://, redis+cluster:// or rediss+cluster:// URL, '
                                    "got 'localhost:6379'"),
    ("REDIS_URL", "http://h:6379/0", 'COGWORKER["REDIS_URL"] must be a redis://, rediss://, unix://, '
                                     'redis+sentinel://, rediss+sentinel://, redis+cluster:// or rediss+cluster:// '
                                     "URL, got 'http://h:6379/0'"),
    ("REDIS_URL", "redis://h:63x9/0", 'COGWORKER["REDIS_URL"] must be a URL with a numeric port (and a '
                                      "well-formed host), got 'redis://h:63x9/0'"),
    ("REDIS_URL", "redis://[::1/0", 'COGWORKER["REDIS_URL"] must be a URL with a numeric port (and a '
                                    "well-formed host), got 'redis://[::1/0'"),
    ("CLIENT_MIDDLEWARE", ["NoDots"], "COGWORKER[\"CLIENT_MIDDLEWARE\"] must be a list of dotted import paths, "
                                      "got ['NoDots']"),
])
def test_bad_value_names_setting_and_value(key, value, message):
    assert errors_of({key: value}) == [message]


def test_priority_aging_is_a_minute_a_step_unless_set_and_takes_0_for_strict():
    assert build_config({}, {}).priority_aging == 60
    assert (build_config({"PRIORITY_AGING": 0}, {}).priority_aging, build_config({"PRIORITY_AGING": 2.5}, {})
            .priority_aging) == (0, 2.5)


def test_a_heartbeat_interval_over_an_hour_is_refused_naming_the_setting():
    assert errors_of({"HEARTBEAT_INTERVAL": 4000, "ORPHAN_THRESHOLD": 9000}) == [
        'COGWORKER["HEARTBEAT_INTERVAL"] must be at most 3600 seconds, got 4000']
    assert build_config({"HEARTBEAT_INTERVAL": 3600, "ORPHAN_THRESHOLD": 9000}, {}).heartbeat_interval == 3600


def test_orphan_threshold_must_leave_room_for_missed_beats():
    (message,) = errors_of({"ORPHAN_THRESHOLD": 10, "HEARTBEAT_INTERVAL": 5})
    assert message.startswith('COGWORKER["ORPHAN_THRESHOLD"] must be more than twice HEARTBEAT_INTERVAL (5)')
    assert message.endswith("got 10")


class _Weird:
    def __repr__(self) -> str:
        return "<weird value>"


@pytest.mark.parametrize("key", sorted(SETTINGS))
def test_every_setting_rejects_a_nonsense_value_by_name(key):
    # Drift guard: a setting added without validation fails here.
    errors = errors_of({key: _Weird()})
    # REDIS_OPTIONS and METRICS_TOKEN name the type instead of echoing the value: it may be a secret.
    shown = "_Weird" if key in ("REDIS_OPTIONS", "METRICS_TOKEN", "ENCRYPTION_KEYS") else "<weird value>"
    assert any(e.startswith(f'COGWORKER["{key}"]') and shown in e for e in errors), errors


@pytest.mark.parametrize("token", ["short", "has a space in it somewhere", "x" * 15, "tab\tinside-a-long-token"])
def test_a_metrics_token_too_short_or_with_spaces_is_refused_without_echoing_it(token):
    (error,) = errors_of({"METRICS_TOKEN": token})
    assert error.startswith('COGWORKER["METRICS_TOKEN"] must be "" or a string of at least 16')
    assert token not in error and error.endswith(f"got {len(token)} characters")


def test_a_metrics_token_is_kept_and_never_shown():
    config = build_config({"METRICS_TOKEN": "Tk_" + "a" * 40})
    assert config.metrics_token == "Tk_" + "a" * 40 and build_config({}).metrics_token == ""
    assert "Tk_" not in repr(config) and "metrics_token='***'" in repr(config)


def test_all_problems_are_reported_at_once():
    errors = errors_of({"CONCURRENCY": 0, "FETCH": "fast", "CONCURENCY": 3})
    assert len(errors) == 3
    assert {e.split("]")[0] for e in errors} == {'COGWORKER["CONCURRENCY"', 'COGWORKER["FETCH"',
                                                 'COGWORKER["CONCURENCY"'}


@pytest.mark.parametrize(("key", "hint"), [("CONCURENCY", "CONCURRENCY"), ("concurrency", "CONCURRENCY"),
                                           ("MAX_ORPHANS", "MAX_ORPHANINGS"), ("REDIS", "REDIS_URL")])
def test_unknown_key_is_reported_with_a_suggestion(key, hint):
    assert errors_of({key: 1}) == [f'COGWORKER["{key}"] is not a setting (did you mean "{hint}"?)']


def test_unknown_key_without_a_close_match_has_no_suggestion():
    assert errors_of({"BANANA_SPLIT": 1}) == ['COGWORKER["BANANA_SPLIT"] is not a setting']


def test_cogworker_must_be_a_dict():
    assert errors_of(["CONCURRENCY", 5]) == ["COGWORKER must be a dict, got ['CONCURRENCY', 5]"]


def test_processes_is_one_by_default_a_count_or_auto_for_every_usable_cpu():
    assert (Config().processes, Config().process_count) == (1, 1)
    assert build_config({"PROCESSES": 3}, {}).process_count == 3
    auto = build_config({"PROCESSES": "auto"}, {})
    assert auto.processes == "auto"
    assert auto.process_count == len(os.sched_getaffinity(0)) >= 1


def test_command_line_overrides_win_and_are_validated():
    assert build_config({"CONCURRENCY": 3}, {}, concurrency=9).concurrency == 9
    assert errors_of({"CONCURRENCY": 3}, concurrency=0) == [
        'COGWORKER["CONCURRENCY"] must be a positive integer, got 0']


# -- URLs and passwords ------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "shown"), [
    (f"redis://:{PASSWORD}@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
    (f"redis://alice:{PASSWORD}@cache.internal:6379/2", "redis://alice:***@cache.internal:6379/2"),
    (f"rediss://default:{PASSWORD}@cache:6380/1?ssl_cert_reqs=none", "rediss://default:***@cache:6380/1?ssl_cert_reqs=none"),
    (f"unix://:{PASSWORD}@/run/redis.sock?db=3", "unix://:***@/run/redis.sock?db=3"),
    (f"unix:///run/redis.sock?db=0&password={PASSWORD}", "unix:///run/redis.sock?db=0&password=***"),
    (f"redis://cache:6379/0?password={PASSWORD}&db=1", "redis://cache:6379/0?password=***&db=1"),
    (f"redis://:{PASSWORD}@[::1]:6379/0", "redis://:***@[::1]:6379/0"),
    ("redis://:p%40ss%3Aword@cache/0", "redis://:***@cache/0"),
    ("redis://alice@cache:6379/0", "redis://alice@cache:6379/0"),
    ("redis://cache:6379/0", "redis://cache:6379/0"),
])
def test_redacted_url_hides_only_the_password(url, shown):
    assert redact_url(url) == shown
    assert build_config({"REDIS_URL": url}, {}).redacted_url == shown


@pytest.mark.parametrize("url", [f"http://alice:{PASSWORD}@cache/0", f"redis//:{PASSWORD}@cache:6379",
                                 f"redis://:{PASSWORD}@cache:port/0", f"cache:6379?password={PASSWORD}",
                                 f"redis://:{PASSWORD}#x?y@cache:6379/0"])  # unencoded # and ? in a password
def test_invalid_url_error_never_shows_the_password(url):
    for errors in (errors_of({"REDIS_URL": url}), errors_of({}, {"COGWORKER_REDIS_URL": url})):
        assert len(errors) == 1 and errors[0].startswith('COGWORKER["REDIS_URL"] must be')
        assert PASSWORD not in errors[0] and "***" in errors[0]


def test_repr_of_a_config_never_shows_a_password():
    # What records locals (an error tracker, a debugger's dump) captured it whole.
    config = build_config({"REDIS_URL": f"redis://alice:{PASSWORD}@cache:6379/0",
                           "REDIS_OPTIONS": {"password": PASSWORD, "socket_timeout": 5}}, {})
    other = build_config({"REDIS_URL": f"unix:///run/redis.sock?db=0&password={PASSWORD}"}, {})

    for text in (repr(config), str(config), f"{[config, other]}"):
        assert PASSWORD not in text
    assert "redis_url='redis://alice:***@cache:6379/0'" in repr(config)
    assert "redis_options={'password': '***', 'socket_timeout': 5}" in repr(config)
    assert "password=***" in repr(other) and "concurrency=5" in repr(other)


@pytest.fixture(scope="module")
def locked_redis(tmp_path_factory):
    """A private server reachable over TCP and a unix socket, with a password and an ACL user."""
    srv = RedisServer(tmp_path_factory.mktemp("locked"))
    sock = srv.dir / "redis.sock"
    srv.extra_args = ["--unixsocket", str(sock), "--unixsocketperm", "700"]
    srv.start()
    admin = srv.client()
    # Set after start: RedisServer pings without a password to know the server is up.
    admin.execute_command("ACL", "SETUSER", "alice", "on", ">alice-Pw", "~*", "&*", "+@all")
    admin.config_set("requirepass", PASSWORD)
    admin.close()
    yield srv, sock
    srv.cleanup()


@pytest.mark.parametrize("form", ["password", "acl-user-db2", "unix-userinfo", "unix-query"])
def test_url_forms_connect_and_push(locked_redis, form):
    srv, sock = locked_redis
    url, db = {
        "password": (f"redis://:{PASSWORD}@127.0.0.1:{srv.port}/0", 0),
        "acl-user-db2": (f"redis://alice:alice-Pw@127.0.0.1:{srv.port}/2", 2),
        "unix-userinfo": (f"unix://:{PASSWORD}@{sock}?db=1", 1),
        "unix-query": (f"unix://{sock}?db=3&password={PASSWORD}", 3),
    }[form]
    check = redis.Redis(host="127.0.0.1", port=srv.port, db=db, password=PASSWORD, decode_responses=True)
    try:
        check.flushdb()
        with override_settings(COGWORKER={"REDIS_URL": url}):
            assert "Pw" not in runtime.get_config().redacted_url
            jid = ConfPing.perform_async(1)
        assert [p for p in check.lrange("cogworker:queue:default", 0, -1) if jid in p]
    finally:
        check.close()


# -- OVER_LIMIT_MAX (flow control) ---------------------------------------------------------------


@pytest.mark.parametrize("value", [-1, True, "3", 2.5, None])
def test_over_limit_max_must_be_an_integer_of_0_or_more(value):
    assert errors_of({"OVER_LIMIT_MAX": value}) == [f'COGWORKER["OVER_LIMIT_MAX"] must be an integer >= 0, '
                                                    f"got {value!r}"]


def test_over_limit_max_is_20_by_default_and_0_fails_a_job_at_its_first_refusal():
    assert build_config({}, {}).over_limit_max == 20
    assert build_config({"OVER_LIMIT_MAX": 0}, {}).over_limit_max == 0
    assert build_config({"OVER_LIMIT_MAX": 500}, {}).over_limit_max == 500


def test_over_limit_max_comes_from_settings_as_every_setting_but_the_redis_url(monkeypatch):
    """The library reads two environment variables, the Redis URL's; the test project reads the
    others it lets tests set per worker (COGWORKER_MAX_ORPHANINGS, ...), this one too."""
    assert build_config({}, {"COGWORKER_OVER_LIMIT_MAX": "3"}).over_limit_max == 20
    monkeypatch.setenv("COGWORKER_OVER_LIMIT_MAX", "3")
    project = runpy.run_path(str(REPO_ROOT / "testproject" / "settings.py"))
    assert project["COGWORKER"]["OVER_LIMIT_MAX"] == 3
    assert build_config(project["COGWORKER"], {}).over_limit_max == 3
