"""A job class no worker imports is refused at the push (push/discovery.py); those workers import
(an app's jobs.py, what it imports, what an app imports at startup, what the URLconf imports) are
pushed and run by a real worker.

The project is a newcomer's, written to a temporary folder: ``startproject shop`` (``shop/`` is the
project package, no installed app) and ``startapp orders``.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import REPO_ROOT, Worker, wait_until

from django_cogworker import CogworkerError, testing

FILES = {
    "manage.py": """
        import os, sys
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
        from django.core.management import execute_from_command_line
        execute_from_command_line(sys.argv)
    """,
    "shop/__init__.py": "",
    "shop/settings.py": """
        SECRET_KEY = "newcomer"
        INSTALLED_APPS = ["django_cogworker", "orders"]
        ROOT_URLCONF = "shop.urls"
        DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
        USE_TZ = True
        COGWORKER = {"QUEUES": ["default"], "CONCURRENCY": 2}
    """,
    # getting-started.md's example as a newcomer wrote it: in the project package
    "shop/jobs.py": """
        from django_cogworker import Job
        from django_cogworker.push.runtime import get_redis

        class SendReceipt(Job):
            def perform(self, order_id):
                get_redis().set("ran:SendReceipt", 1)
    """,
    "shop/common.py": """
        from django_cogworker import Job
        from django_cogworker.push.runtime import get_redis

        class Shared(Job):  # imported by orders/jobs.py
            def perform(self):
                get_redis().set("ran:Shared", 1)
    """,
    "shop/signals.py": """
        from django_cogworker import Job
        from django_cogworker.push.runtime import get_redis

        class Audit(Job):  # imported by orders' AppConfig.ready()
            def perform(self):
                get_redis().set("ran:Audit", 1)
    """,
    "shop/urls.py": """
        from shop import views
        urlpatterns = []
    """,
    "shop/views.py": """
        from django_cogworker import Job
        from django_cogworker.push.runtime import get_redis

        class Notify(Job):  # imported by the URLconf (a worker's system checks import it)
            def perform(self):
                get_redis().set("ran:Notify", 1)
    """,
    "orders/__init__.py": "",
    "orders/apps.py": """
        from django.apps import AppConfig

        class OrdersConfig(AppConfig):
            name = "orders"

            def ready(self):
                from shop import signals  # noqa: F401
    """,
    "orders/jobs.py": """
        from django_cogworker import Job
        from django_cogworker.push.runtime import get_redis
        from shop.common import Shared  # noqa: F401

        class Ship(Job):
            def perform(self):
                get_redis().set("ran:Ship", 1)
    """,
}


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    for name, text in FILES.items():
        path = tmp_path / "shop_project" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path / "shop_project"


def shop_env(redis_url: str) -> dict[str, str]:
    # (This checkout's package first, not the one the venv installed.)
    return {"DJANGO_SETTINGS_MODULE": "shop.settings", "PYTHONPATH": str(REPO_ROOT), "COGWORKER_REDIS_URL": redis_url}


def in_shop(shop: Path, redis_url: str, code: str) -> dict:
    """Run ``code`` in a process of the project (as a view or a shell would), after django.setup(); it
    fills ``out``, printed as JSON."""
    script = "import json, django\ndjango.setup()\nout = {}\n" + textwrap.dedent(code) + "\nprint(json.dumps(out))\n"
    done = subprocess.run([sys.executable, "-c", script], cwd=shop, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **shop_env(redis_url)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


REFUSED = ("job shop.jobs.SendReceipt can't be pushed: workers never import its module shop.jobs (it is in no "
           "installed app, and nothing imports it while Django starts), so each would fail it as unknown. Move it "
           "into the jobs.py of an installed app, or import it from one.")


def test_a_job_no_worker_imports_is_refused_at_every_push_naming_it_its_module_and_the_fix(shop, redis_url, r):
    out = in_shop(shop, redis_url, """
        import time
        from django_cogworker import Batch, CogworkerError, chain, testing
        from shop.jobs import SendReceipt

        pushes = {
            "perform_async": lambda: SendReceipt.perform_async(1),
            "perform_in": lambda: SendReceipt.perform_in(5, 1),
            "perform_at": lambda: SendReceipt.perform_at(time.time() + 5, 1),
            "perform_bulk": lambda: SendReceipt.perform_bulk([(1,), (2,)]),
            "set": lambda: SendReceipt.set(queue="mail").perform_async(1),
            "chain": lambda: chain(SendReceipt.s(1)).perform_async(),
            "batch callback": lambda: Batch().on("success", SendReceipt),
        }
        for name, push in pushes.items():
            for mode in ("redis", "fake"):
                try:
                    if mode == "fake":
                        with testing.fake():
                            push()
                    else:
                        push()
                except CogworkerError as exc:
                    out[f"{name} {mode}"] = str(exc)
                else:
                    out[f"{name} {mode}"] = "pushed"
    """)
    assert out == {f"{name} {mode}": REFUSED for name in ("perform_async", "perform_in", "perform_at", "perform_bulk",
                                                           "set", "chain", "batch callback")
                   for mode in ("redis", "fake")}
    assert r.keys("*") == []  # (nothing written)


def test_jobs_a_worker_imports_are_pushed_and_a_worker_runs_them(shop, redis_url, r):
    """An app's jobs.py, a module it imports, a module an app imports at startup (its ready()), and a
    module the URLconf imports (as a first request would, after startup)."""
    out = in_shop(shop, redis_url, """
        from django.urls import get_resolver
        get_resolver().url_patterns  # (the first request's import of the URLconf)
        from orders.jobs import Ship
        from shop.common import Shared
        from shop.signals import Audit
        from shop.views import Notify

        out["jids"] = [job.perform_async() for job in (Ship, Shared, Audit, Notify)]
    """)
    assert all(out["jids"])
    with Worker(cwd=shop, env=shop_env(redis_url)) as worker:
        worker.wait_ready()
        wait_until(lambda: r.exists("ran:Ship", "ran:Shared", "ran:Audit", "ran:Notify") == 4, timeout=30,
                   message=f"not every job ran; worker log:\n{worker.log()}")
    assert "UnknownJobError" not in worker.log()


def newcomer_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str):
    """Import ``text`` as the module ``name`` (of a package outside every installed app and test folder)."""
    package, _, module = name.rpartition(".")
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / f"{module}.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(name)


def test_in_fake_mode_too_so_a_project_s_test_of_the_push_finds_it(tmp_path, monkeypatch):
    module = newcomer_module(tmp_path, monkeypatch, "newcomer_shop.jobs", """
        from django_cogworker import Job

        class Welcome(Job):
            def perform(self, user_id):
                pass
    """)
    with testing.fake() as jobs, pytest.raises(CogworkerError) as info:
        module.Welcome.perform_async(1)
    assert str(info.value) == (
        "job newcomer_shop.jobs.Welcome can't be pushed: workers never import its module newcomer_shop.jobs (it is "
        "in no installed app, and nothing imports it while Django starts), so each would fail it as unknown. "
        "Move it into the jobs.py of an installed app, or import it from one.")
    assert len(jobs) == 0


def test_a_task_no_worker_imports_is_refused_naming_where_tasks_go(tmp_path, monkeypatch, r):
    module = newcomer_module(tmp_path, monkeypatch, "newcomer_site.tasks", """
        from django_cogworker.tasks.api import task

        @task
        def welcome(user_id):
            pass
    """)
    with pytest.raises(CogworkerError) as info:
        module.welcome.enqueue(1)
    assert str(info.value) == (
        "task newcomer_site.tasks.welcome can't be pushed: workers never import its module newcomer_site.tasks (it "
        "is in no installed app, and nothing imports it while Django starts), so each would fail it as unknown. "
        "Move it into the tasks.py of an installed app, or list its module in the backend's OPTIONS[\"MODULES\"].")
    assert r.keys("*") == []  # (no result record either)
