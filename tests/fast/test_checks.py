"""Config problems surface before anything runs: ``manage.py check`` and the start of ``runcogworker``.

Each names the setting and the value given, and never shows a Redis password.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from typing import Any

import pytest
from django.conf import settings
from django.core import checks
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError
from django.test import override_settings as django_override_settings
from helpers import REPO_ROOT, free_port
from limiter_fixtures import fresh_limiters, unique  # noqa: F401 - the fresh_limiters fixture

from django_cogworker import Job, Limiter

PASSWORD = "s3cret-Pw"


def cogworker_errors() -> list[tuple[str, str]]:
    return [(m.id, m.msg) for m in checks.run_checks(tags=["cogworker"]) if m.level >= checks.ERROR]


def override_settings(**kwargs: Any) -> Any:
    """Django's, but a COGWORKER given whole keeps the test project's ENCRYPTION_KEYS: its jobs that
    encrypt (demo/secret_jobs.py) want them, and without them every check here would also report
    cogworker.E020 (tests/test_encryption.py's)."""
    if isinstance(kwargs.get("COGWORKER"), dict):
        kwargs["COGWORKER"] = {"ENCRYPTION_KEYS": settings.COGWORKER["ENCRYPTION_KEYS"], **kwargs["COGWORKER"]}
    return django_override_settings(**kwargs)


def cogworker_warnings() -> list[tuple[str, str]]:
    return [(m.id, m.msg) for m in checks.run_checks(tags=["cogworker"]) if m.level == checks.WARNING]


def run_manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings", **env})


# -- manage.py check -----------------------------------------------------------------------------------


def test_the_project_config_passes():
    assert cogworker_errors() == []
    out = io.StringIO()
    call_command("check", stdout=out)
    assert "no issues" in out.getvalue()


@pytest.mark.parametrize(("cogworker", "expected"), [
    ({"MAX_ORPHANINGS": 0}, 'COGWORKER["MAX_ORPHANINGS"] must be a positive integer, got 0'),
    ({"FETCH": "fast"}, "COGWORKER[\"FETCH\"] must be one of \"reliable\", \"basic\", got 'fast'"),
    ({"CONCURENCY": 5}, 'COGWORKER["CONCURENCY"] is not a setting (did you mean "CONCURRENCY"?)'),
])
def test_check_fails_naming_the_setting_and_value(cogworker, expected):
    with override_settings(COGWORKER=cogworker):
        assert cogworker_errors() == [("cogworker.E001", expected)]
        with pytest.raises(SystemCheckError) as info:
            call_command("check")
    assert expected in str(info.value)


def test_check_reports_every_problem_at_once():
    with override_settings(COGWORKER={"CONCURRENCY": 0, "DEAD_MAX_JOBS": -5, "SHUTDOWN_TIMOUT": 3}):
        messages = [msg for _, msg in cogworker_errors()]
    assert len(messages) == 3
    assert any("SHUTDOWN_TIMEOUT" in m and "did you mean" in m for m in messages)


def test_a_bad_value_does_not_hide_imports_that_fail_nor_bad_periodic_entries():
    cogworker = {"CONCURRENCY": 0, "CLIENT_MIDDLEWARE": ["no_such_module.Stamp"],
                 "PERIODIC": [{"name": "broken", "cron": "not a cron", "job": "testproject.demo.jobs.RecordJob"}]}
    with override_settings(COGWORKER=cogworker):
        ids = sorted(e for e, _ in cogworker_errors())
    assert ids == ["cogworker.E001", "cogworker.E002", "cogworker.E003"]


@pytest.mark.parametrize(("cogworker", "expected"), [
    ({"REDIS_OPTIONS": {"bogus_kw": 1}}, 'COGWORKER["REDIS_OPTIONS"] is refused by redis-py: '),
    ({"REDIS_URL": ""},
     "COGWORKER[\"REDIS_URL\"] must be a redis://, rediss://, unix://, redis+sentinel://, rediss+sentinel://, "
     "redis+cluster:// or rediss+cluster:// URL, got ''"),
    ({"REDIS_URL": f"redis://:{PASSWORD}@localhost:notaport/0"},
     "COGWORKER[\"REDIS_URL\"] must be a URL with a numeric port (and a well-formed host), "
     "got 'redis://:***@localhost:notaport/0'"),
    ({"QUEUES": ["mail,x"]}, 'COGWORKER["QUEUES"] entries must be "name", "name,weight" or (name, weight), '
                             "got 'mail,x'"),
    ({"QUEUES": ["a", "a", "b"]}, "COGWORKER[\"QUEUES\"] must list each queue once, got 'a' more than once"),
    ({"PERIODIC": ["x"]}, "COGWORKER[\"PERIODIC\"] must be a list of dicts, got ['x']"),
])
def test_each_bad_value_gets_one_clear_error(cogworker, expected):
    with override_settings(COGWORKER=cogworker):
        (error,) = cogworker_errors()
    assert error[0] == "cogworker.E001" and error[1].startswith(expected) and PASSWORD not in error[1]


def test_a_job_or_periodic_entry_whose_queue_no_worker_reads_is_warned_about():
    # Its jobs waited forever, and `manage.py check` said nothing.
    periodic = [{"name": "nightly", "cron": "0 3 * * *", "job": "testproject.demo.jobs.ScheduledHello",
                 "queue": "reports"},
                {"name": "receipts", "cron": "0 4 * * *", "job": "testproject.demo.jobs.SendReceipt", "args": [1]}]
    with override_settings(COGWORKER={"QUEUES": ["default"], "PERIODIC": periodic}):
        warnings = cogworker_warnings()
        assert cogworker_errors() == []
        out, err = io.StringIO(), io.StringIO()
        call_command("check", stdout=out, stderr=err)  # a warning: the check still passes
    tail = "which COGWORKER[\"QUEUES\"] (default) doesn't list: its jobs wait until a worker reads it"
    assert warnings == [
        ("cogworker.W001", f"job testproject.demo.jobs.SendReceipt is pushed to queue 'mail', {tail} "
                           f"(add it to QUEUES, or start one with -q mail)"),
        ("cogworker.W001", f"task testproject.demo.tasks.fail is pushed to queue 'mail', {tail} "
                           f"(add it to QUEUES, or start one with -q mail)"),
        ("cogworker.W002", f"periodic entry 'nightly' is pushed to queue 'reports', {tail} "
                           f"(add it to QUEUES, or start one with -q reports)"),
        ("cogworker.W002", f"periodic entry 'receipts' is pushed to queue 'mail', {tail} "
                           f"(add it to QUEUES, or start one with -q mail)"),
    ]
    assert "cogworker.W001" in err.getvalue() + out.getvalue()


def test_a_periodic_entry_whose_arguments_its_job_can_not_take_is_warned_about():
    periodic = [{"name": "good", "cron": "0 3 * * *", "job": "testproject.demo.jobs.RecordJob", "args": ["k"]},
                {"name": "bad", "cron": "0 3 * * *", "job": "testproject.demo.jobs.RecordJob", "args": [1, 2, 3]}]
    with override_settings(COGWORKER={"QUEUES": ["default", "mail"], "PERIODIC": periodic}):
        assert cogworker_warnings() == [
            ("cogworker.W003", "periodic entry 'bad': testproject.demo.jobs.RecordJob.perform(key, value=None) "
                               "can't take (1, 2, 3): too many positional arguments")]


def test_the_package_s_own_jobs_are_not_warned_about():
    """A user can't route them: a batch's hand-overs go where its callbacks go (features/batches/batch.py)."""
    with override_settings(COGWORKER={"QUEUES": ["mail"]}):
        warned = [msg.split(" is pushed")[0] for code, msg in cogworker_warnings() if code == "cogworker.W001"]
    assert "job testproject.demo.jobs.FailJob" in warned  # (the user's own still are)
    assert [name for name in warned if "django_cogworker" in name] == []


def test_jobs_outside_installed_apps_are_not_warned_about():
    class Elsewhere(Job):  # (a test module's: no worker imports it)
        queue = "nowhere"

    assert "nowhere" not in " ".join(msg for _, msg in cogworker_warnings())
    assert cogworker_warnings() == []  # testproject's QUEUES list every queue its jobs use


PROJECT_JOBS = """\
from django_cogworker import Job


class SendReceipt(Job):
    def perform(self, order_id):
        pass


class Nightly(SendReceipt):
    queue = "low"


def helper():
    pass
"""


@pytest.fixture
def project_package(tmp_path, monkeypatch):
    """A project package beside testproject, as ``startproject shop`` makes one (no app): its root
    URLconf is the one in use, and ``shop/jobs.py``, ``shop/tasks.py`` as a newcomer writes them."""
    from django.urls import clear_url_caches

    package = tmp_path / "shopproj"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "urls.py").write_text("urlpatterns = []\n")
    (package / "jobs.py").write_text(PROJECT_JOBS)
    (package / "tasks.py").write_text("from django_cogworker.tasks.api import task\n\n\n@task()\n"
                                      "def send_receipt(order_id):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    for name in [m for m in sys.modules if m == "shopproj" or m.startswith("shopproj.")]:
        del sys.modules[name]
    clear_url_caches()


def test_a_jobs_module_of_the_project_package_that_no_worker_imports_is_warned_about(project_package):
    # docs/tasks.md headed its example "# shop/tasks.py", flow-control.md "# shop/jobs.py", where
    # getting-started made "shop" the project package: each push was refused, and check said nothing.
    with override_settings(ROOT_URLCONF="shopproj.urls"):
        found = [(m.id, m.obj, m.msg, m.hint) for m in checks.run_checks(tags=["cogworker"])
                 if m.id == "cogworker.W004"]
    jobs, tasks = project_package / "jobs.py", project_package / "tasks.py"
    assert found == [
        ("cogworker.W004", "shopproj.jobs", f"{jobs} defines SendReceipt, Nightly but is in no installed app and "
         "nothing imports it while Django starts: workers never import it, so each push of its jobs is refused",
         "move it into an installed app (manage.py startapp; every worker imports the jobs.py and tasks.py of each "
         "app in INSTALLED_APPS)"),
        ("cogworker.W004", "shopproj.tasks", f"{tasks} defines send_receipt but is in no installed app and "
         "nothing imports it while Django starts: workers never import it, so each push of its tasks is refused",
         "move it into an installed app (manage.py startapp; every worker imports the jobs.py and tasks.py of each "
         'app in INSTALLED_APPS), or list it in the backend\'s OPTIONS["MODULES"]')]
    assert "shopproj.jobs" not in sys.modules  # (read, never imported: a worker's checks would define its jobs)


def test_a_jobs_module_of_the_project_package_its_urlconf_imports_is_not_warned_about(project_package):
    # (A worker's own checks import the root URLconf, and with it the jobs module: workers know its jobs.)
    (project_package / "urls.py").write_text("from . import jobs, tasks  # noqa: F401\n\nurlpatterns = []\n")
    with override_settings(ROOT_URLCONF="shopproj.urls"):
        assert [m for m in checks.run_checks(tags=["cogworker"]) if m.id == "cogworker.W004"] == []


def test_only_a_tasks_module_of_this_backend_is_looked_at(project_package):
    # (Without CogworkerBackend in TASKS, a project's tasks.py is another library's: Celery's, say.)
    with override_settings(ROOT_URLCONF="shopproj.urls", TASKS={}):
        assert [m.obj for m in checks.run_checks(tags=["cogworker"]) if m.id == "cogworker.W004"] == ["shopproj.jobs"]


def deploy_errors() -> list[tuple[str, str]]:
    return [(m.id, m.msg) for m in checks.run_checks(tags=["cogworker"], include_deployment_checks=True)
            if m.level >= checks.ERROR]


def test_check_deploy_says_when_redis_does_not_answer_naming_the_url_without_its_password():
    port = free_port()  # (nothing listens there: refused at once)
    with override_settings(COGWORKER={"REDIS_URL": f"redis://:{PASSWORD}@127.0.0.1:{port}/0"}):
        [(code, message)] = deploy_errors()
        assert cogworker_errors() == []  # (plain check: offline)
        with pytest.raises(SystemCheckError) as info:
            call_command("check", deploy=True, tags=["cogworker"])
    assert code == "cogworker.E006"
    assert message.startswith(f"Redis at redis://:***@127.0.0.1:{port}/0 did not answer within 2s (ConnectionError: ")
    assert message.endswith("): workers can't start, and pushes fail, until it does")
    assert f"?: (cogworker.E006) {message}" in str(info.value) and PASSWORD not in str(info.value)


def test_plain_check_never_connects_and_check_deploy_gives_up_on_a_silent_server_after_its_timeout():
    import socket

    with socket.create_server(("127.0.0.1", 0)) as silent:  # (accepts, never answers)
        silent.setblocking(False)
        with override_settings(COGWORKER={"REDIS_URL": f"redis://127.0.0.1:{silent.getsockname()[1]}/0"}):
            assert cogworker_errors() == []
            with pytest.raises(BlockingIOError):
                silent.accept()  # (no connection was made)
            [(code, message)] = deploy_errors()
    assert code == "cogworker.E006" and "(TimeoutError: " in message


def test_check_deploy_is_quiet_when_redis_answers(redis_url):
    assert os.environ["COGWORKER_REDIS_URL"] == redis_url  # (the suite's real Redis)
    assert deploy_errors() == []


def deploy_warnings() -> list[tuple[str, str, str]]:
    return [(m.id, m.msg, m.hint or "") for m in checks.run_checks(tags=["cogworker"], include_deployment_checks=True)
            if m.level == checks.WARNING]


@pytest.mark.django_db(databases=["default", "pg", "mysql"])  # (OUTBOX on: cogworker.E010 looks for its table)
def test_check_deploy_warns_when_pushes_wait_for_commits_without_the_outbox(redis_url):
    """A commit that finds Redis away loses its jobs unless the outbox is on: ``check --deploy`` says
    so, as Django's deploy checks warn of insecure settings; plain ``check`` doesn't."""
    with override_settings(COGWORKER={"QUEUES": settings.COGWORKER["QUEUES"]}):  # (ENQUEUE_ON_COMMIT on, OUTBOX off)
        [(code, message, hint)] = deploy_warnings()
        assert cogworker_warnings() == []
        out = io.StringIO()
        call_command("check", deploy=True, tags=["cogworker"], stdout=out, stderr=out)
    assert code == "cogworker.W012"
    assert 'COGWORKER["OUTBOX"] is off' in message and "its jobs are lost" in message
    assert 'COGWORKER["OUTBOX"] = True' in hint
    assert "(cogworker.W012)" in out.getvalue()
    for quiet in ({"OUTBOX": True}, {"ENQUEUE_ON_COMMIT": False}):  # (the outbox; or pushes that never wait)
        with override_settings(COGWORKER=quiet):
            assert [w for w in deploy_warnings() if w[0] == "cogworker.W012"] == []


def test_check_reports_middleware_that_cannot_be_imported():
    cogworker = {"CLIENT_MIDDLEWARE": ["middleware_fixtures.StampTenant", "middleware_fixtures.Missing"],
                 "SERVER_MIDDLEWARE": ["no_such_module.Timing"]}
    with override_settings(COGWORKER=cogworker):
        errors = cogworker_errors()
    assert [e for e, _ in errors] == ["cogworker.E002", "cogworker.E002"]
    assert errors[0][1].startswith("COGWORKER[\"CLIENT_MIDDLEWARE\"] entry 'middleware_fixtures.Missing' cannot be")
    assert errors[1][1].startswith("COGWORKER[\"SERVER_MIDDLEWARE\"] entry 'no_such_module.Timing' cannot be")


def test_check_never_shows_the_redis_password():
    with override_settings(COGWORKER={"REDIS_URL": f"http://alice:{PASSWORD}@cache:6379/0"}):
        with pytest.raises(SystemCheckError) as info:
            call_command("check")
    assert 'COGWORKER["REDIS_URL"]' in str(info.value) and "http://alice:***@cache:6379/0" in str(info.value)
    assert PASSWORD not in str(info.value)


def test_manage_py_check_fails_on_bad_environment_driven_settings():
    # testproject/settings.py reads COGWORKER_CONCURRENCY; the URL comes from the environment itself.
    result = run_manage("check", env={"COGWORKER_CONCURRENCY": "0",
                                      "COGWORKER_REDIS_URL": f"redis://:{PASSWORD}@cache:port/0"})
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert 'COGWORKER["CONCURRENCY"] must be a positive integer, got 0' in output
    assert ('COGWORKER["REDIS_URL"] must be a URL with a numeric port (and a well-formed host), '
            "got 'redis://:***@cache:port/0'") in output
    assert PASSWORD not in output


# -- runcogworker refuses to start --------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_runcogworker_bad_option_fails_before_connecting(r):
    # An unreachable Redis: reaching it at all would show as a connection error or a hang, not this.
    with override_settings(COGWORKER={"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}):
        with pytest.raises(CommandError) as info:
            call_command("runcogworker", concurrency=0)
    assert 'COGWORKER["CONCURRENCY"] must be a positive integer, got 0' in str(info.value)


@pytest.mark.timeout(20)
def test_runcogworker_bad_option_registers_nothing(r):
    with pytest.raises(CommandError, match=r'COGWORKER\["SHUTDOWN_TIMEOUT"\] must be a positive number'):
        call_command("runcogworker", timeout=-1)
    with pytest.raises(CommandError, match="queue names must be non-empty strings without spaces, got 'a b'"):
        call_command("runcogworker", "-q", "a b")
    assert r.dbsize() == 0


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("queues", "expected"), [
    (["mail,3,4"], "-q/--queue weight 4 in 'mail,3,4' follows no queue name"),
    (["3"], "-q/--queue weight 3 in '3' follows no queue name"),
    ([","], "-q/--queue needs a queue name, got ','"),
])
def test_runcogworker_queue_options_are_read_strictly(r, queues, expected):
    args = [arg for q in queues for arg in ("-q", q)]
    with pytest.raises(CommandError) as info:
        call_command("runcogworker", *args)
    assert expected in str(info.value) and "non-empty list" not in str(info.value)
    assert r.dbsize() == 0


@pytest.mark.timeout(20)
def test_runcogworker_bad_settings_fail_at_start(r):
    with override_settings(COGWORKER={"FETCH": "fast", "MAX_ORPHANINGS": 0}):
        with pytest.raises(CommandError) as info:
            call_command("runcogworker")
    assert "FETCH" in str(info.value) and "'fast'" in str(info.value)
    assert 'COGWORKER["MAX_ORPHANINGS"] must be a positive integer, got 0' in str(info.value)
    assert r.dbsize() == 0


@pytest.mark.timeout(20)
def test_runcogworker_runs_the_system_checks_first(r):
    with override_settings(COGWORKER={"SERVER_MIDDLEWARE": ["no_such_module.Timing"]}):
        with pytest.raises(SystemCheckError, match=r'COGWORKER\["SERVER_MIDDLEWARE"\] entry'):
            call_command("runcogworker", skip_checks=False)
    assert r.dbsize() == 0


# -- limiters (features/limits/) ----------------------------------------------------------------------------------


def _limiter_errors(name: str) -> list[tuple[str, str]]:
    return [(code, msg) for code, msg in cogworker_errors() if name in msg]


def test_a_lease_shorter_than_twice_the_heartbeat_is_an_error_naming_the_limiter_and_the_setting():
    limiter = Limiter.concurrent(unique("check"), 2, lease=3)
    with override_settings(COGWORKER={"HEARTBEAT_INTERVAL": 2}):
        (error,) = _limiter_errors(limiter.name)
        with pytest.raises(SystemCheckError, match=re.escape(limiter.name)):
            call_command("check")
    assert error == ("cogworker.E004", f"Limiter.concurrent('{limiter.name}', 2, lease=3): its lease (3s) must be at "
                                       f'least twice COGWORKER["HEARTBEAT_INTERVAL"] (2s): the heartbeat renews it, '
                                       f"and a lease that lapses between two beats frees the place of a job still "
                                       f"running")
    with override_settings(COGWORKER={"HEARTBEAT_INTERVAL": 1.5}):
        assert _limiter_errors(limiter.name) == []  # (3 s: twice 1.5 s, enough)


def test_a_short_lease_names_the_jobs_whose_limits_hold_it():
    from django_cogworker import Job

    limiter = Limiter.concurrent(unique("check-job"), 1, lease=3)
    type("ShortLeaseJob", (Job,), {"limits": [limiter], "__module__": __name__,
                                   "perform": lambda self: None})
    with override_settings(COGWORKER={"HEARTBEAT_INTERVAL": 2}):
        ((code, msg),) = _limiter_errors(limiter.name)
    assert code == "cogworker.E004"
    assert msg.startswith(f"Limiter.concurrent('{limiter.name}', 1, lease=3) (in the limits of "
                          f"{__name__}.ShortLeaseJob): its lease (3s) must be at least twice")


def test_a_limiter_keyed_by_a_function_is_checked_by_its_family():
    family = unique("check-family")
    Limiter.concurrent(lambda customer: f"{family}:{customer}", 1, lease=1, family=family)
    with override_settings(COGWORKER={"HEARTBEAT_INTERVAL": 1}):
        ((code, msg),) = _limiter_errors(family)
    assert code == "cogworker.E004" and msg.startswith(f"Limiter.concurrent('{family}', 1, lease=1): ")


def test_leases_are_not_checked_against_a_config_that_is_itself_invalid():
    limiter = Limiter.concurrent(unique("check-invalid"), 1, lease=1)
    with override_settings(COGWORKER={"HEARTBEAT_INTERVAL": -1}):
        errors = cogworker_errors()
    assert [code for code, _ in errors] == ["cogworker.E001"]  # (and no E004 for the 1 s lease)
    assert _limiter_errors(limiter.name)  # (which the default heartbeat, 5 s, does have one for)
