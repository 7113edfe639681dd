"""Which job classes workers know: a push of one that no worker defines is refused at the push.

A payload names its job class, and a worker looks the name up in its own registry (push/job.py):
it knows the classes its process defined. Those are:

- what Django's startup defines: the settings, each installed app and its ``ready()``, then this
  app's autodiscovery of each app's ``jobs.py`` (and ``tasks.py``), and all they import;
- what the worker's system checks import: the root URLconf, the URLconfs it includes and the views
  they import (``runcogworker`` runs the checks before it starts, as every management command);
- the modules named by ``COGWORKER`` paths (client and server middleware, death handlers, clock).

A class defined elsewhere (``shop/jobs.py`` in the project package of ``startproject shop``,
imported by a shell or a view only) was pushed all the same, and every worker failed it as an
unknown job, over its 25 retries, before anyone looked. The push refuses it now. Whether a class
was defined while Django started or while the URLconf was imported is noted when it is defined
(:func:`defined_with_worker_imports`); the rest is decided at its first push, once per class.

Test code is let through: a test suite's own job classes (in a ``tests`` folder, or a module
named ``test_*``, ``*_test(s)``, ``tests`` or ``conftest``) run in fake or inline mode, or in the
test's own process.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ..errors import CogworkerError

TEST_FOLDERS = frozenset({"tests", "test"})


def defined_with_worker_imports() -> bool:
    """Whether a class defined now is one every worker defines too: Django is starting (the app
    registry isn't ready: settings, apps, ``ready()``, autodiscovery), or the root URLconf is being
    imported (a worker's system checks import it). Called as a job class is defined."""
    from django.apps import apps
    from django.conf import settings

    if not apps.ready:
        return True
    urlconf = getattr(settings, "ROOT_URLCONF", None)
    frame = sys._getframe(1)
    while frame is not None:
        # (The URLconf's body on the stack: the views it imports, and the URLconfs it includes.)
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == urlconf:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def check(job_class: Any) -> None:
    """Raise CogworkerError naming ``job_class``, its module and the fix, if no worker defines it."""
    if getattr(job_class, "_cogworker_startup", True):
        return
    module = job_class.__module__
    if _in_an_app(module) or _named_by_settings(module) or _test_code(module):
        return
    task = getattr(job_class, "task", None)  # (a @task function's Job: django_cogworker/tasks/)
    if task is not None:
        what, fix = (f"task {task.module_path}", "Move it into the tasks.py of an installed app, or list "
                     "its module in the backend's OPTIONS[\"MODULES\"].")
    else:
        what, fix = f"job {job_class.name}", "Move it into the jobs.py of an installed app, or import it from one."
    raise CogworkerError(f"{what} can't be pushed: workers never import its module {module} (it is in no "
                         f"installed app, and nothing imports it while Django starts), so each would fail it "
                         f"as unknown. {fix}")


def _in_an_app(module: str) -> bool:
    from django.apps import apps

    if not apps.apps_ready:  # (a push while the apps load: its class was defined at startup)
        return True
    return apps.get_containing_app_config(module) is not None


def _named_by_settings(module: str) -> bool:
    """Whether a worker imports ``module`` by a COGWORKER path (middleware, death handlers, clock)."""
    from ..errors import ConfigError
    from . import runtime

    try:
        config = runtime.get_config()
    except ConfigError:
        return False  # (the push fails on it next, with its own message)
    paths = (*config.client_middleware, *config.server_middleware, *config.death_handlers, config.clock)
    return any(isinstance(path, str) and path.rpartition(".")[0] == module for path in paths)


def _test_code(module: str) -> bool:
    """Whether ``module`` is a test suite's: in a ``tests`` folder or package, or named as test
    runners find tests (``test_*``, ``*_test(s)``, ``tests``) or ``conftest``."""
    parts = module.split(".")
    folders = set(parts[:-1])
    file = getattr(sys.modules.get(module), "__file__", None)
    if file:
        # (The folders of its package, and the one it was found in: pytest puts a tests/ folder on
        # sys.path, and imports tests/helpers.py as the module "helpers".)
        folders.update(Path(file).parts[-(len(parts) + 1):-1])
    name = parts[-1]
    return bool(folders & TEST_FOLDERS) or name in TEST_FOLDERS or name == "conftest" or name.startswith(
        "test_") or name.endswith(("_test", "_tests"))


def stray_job_modules(stems: tuple[str, ...]) -> list[tuple[str, Path, list[str]]]:
    """Each module of the project package named in ``stems`` (``jobs``, and ``tasks`` with the
    tasks backend: what apps.py autodiscovers in each installed app) that defines jobs or tasks,
    yet is in no installed app and not imported while Django starts: ``(module, file, names)``.

    No worker imports such a module, so a push of its jobs is refused (:func:`check`); ``manage.py
    check`` says so before the first push (cogworker.W004). The project package is the one
    ``startproject`` made, holding the settings and the root URLconf. Its files are read, never
    imported (importing them would make the checking process, a worker, define their classes);
    the root URLconf is imported first, as a worker's own checks do, so a module it imports counts
    as imported.
    """
    from django.apps import apps
    from django.conf import settings
    from django.urls import get_resolver

    try:
        get_resolver().url_patterns  # noqa: B018 - imports the URLconfs
    except Exception:  # noqa: BLE001 - (the urls check reports it; what it would import unknown, say nothing)
        return []
    packages = {name.partition(".")[0] for name in (settings.SETTINGS_MODULE, getattr(settings, "ROOT_URLCONF", None))
                if isinstance(name, str) and "." in name}
    found = []
    for package in sorted(packages):
        folders = getattr(sys.modules.get(package), "__path__", None) or ()
        for stem in stems:
            module = f"{package}.{stem}"
            if module in sys.modules or apps.get_containing_app_config(module) is not None:
                continue
            for folder in folders:
                file = Path(folder) / f"{stem}.py"
                names = _declared_jobs(file) if file.is_file() else []
                if names:
                    found.append((module, file, names))
    return found


def _declared_jobs(file: Path) -> list[str]:
    """The job classes and ``@task`` functions ``file`` defines at its top level, read from its
    source: a class with a ``perform`` method, or a base named ``...Job`` or found here before it;
    a function decorated with ``task`` (or ``something.task``, called or not)."""
    import ast

    try:
        tree = ast.parse(file.read_bytes(), filename=str(file))
    except (SyntaxError, ValueError, OSError):
        return []  # (importing it would fail too: not this check's to say)

    def name_of(node: ast.expr) -> str:
        node = node.func if isinstance(node, ast.Call) else node
        return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""

    names = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and (
                any(name_of(base).endswith("Job") or name_of(base) in names for base in node.bases)
                or any(isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "perform"
                       for item in node.body)):
            names.append(node.name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                name_of(decorator) == "task" for decorator in node.decorator_list):
            names.append(node.name)
    return names
