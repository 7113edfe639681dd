"""Django system checks: ``manage.py check`` reports every config problem, naming the setting."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core import checks

from .errors import ConfigError


@checks.register("cogworker")
def check_config(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every problem at once: a bad value doesn't hide an import that fails or a bad entry."""
    import os

    from django.conf import settings

    from .conf import build_config
    from .push.middleware import import_string

    raw = getattr(settings, "COGWORKER", None)
    errors: list[checks.CheckMessage] = []
    try:
        # Built afresh (not the shared runtime config, whose Redis pool stays in use).
        config = build_config(raw, os.environ)
    except ConfigError as exc:
        errors.extend(checks.Error(message, id="cogworker.E001") for message in exc.errors)
        config = None

    def setting(name: str, field: str, default: Any) -> Any:
        """The validated value, or (the config being invalid) the raw one, for the checks below."""
        if config is not None:
            return getattr(config, field)
        return raw.get(name, default) if isinstance(raw, Mapping) else default

    for name, field in (("CLIENT_MIDDLEWARE", "client_middleware"), ("SERVER_MIDDLEWARE", "server_middleware"),
                        ("DEATH_HANDLERS", "death_handlers"), ("FEATURES", "features")):
        paths = setting(name, field, ())
        for path in paths if isinstance(paths, (list, tuple)) else ():
            if not isinstance(path, str) or "." not in path:
                continue  # (reported above)
            try:
                imported = import_string(path)
            except ImportError as exc:
                errors.append(checks.Error(f'COGWORKER["{name}"] entry {path!r} cannot be imported: {exc}',
                                           id="cogworker.E002"))
                continue
            if name == "FEATURES":  # (a Feature class given for its factory; one returning None: at startup)
                from .engine.run.factories import factory_problem

                problem = factory_problem(path, imported)
                if problem:
                    errors.append(checks.Error(problem, id="cogworker.E007"))
    from .push.periodic import build_entries

    periodic = setting("PERIODIC", "periodic", ())
    entries: list = []
    if isinstance(periodic, (list, tuple)) and all(isinstance(e, Mapping) for e in periodic):
        try:
            entries = build_entries(tuple(periodic), settings.TIME_ZONE or "UTC")
        except ConfigError as exc:
            errors.extend(checks.Error(message, id="cogworker.E003") for message in exc.errors)
    if config is not None:
        errors.extend(_unread_queues(config.queue_names, entries))
    errors.extend(_entry_arguments(entries))
    if config is not None:
        from .features.limits.upkeep import problems
        from .push.job import registry

        errors.extend(checks.Error(message, id="cogworker.E004")
                      for message in problems(config.heartbeat_interval, registry()))
        from .features.encryption import checks as encryption_checks

        errors.extend(checks.Error(message, id="cogworker.E020")
                      for message in encryption_checks.problems(registry(), config.encryption_keys))
    errors.extend(checks.Error(message, id="cogworker.E005")
                  for message in task_option_problems(getattr(settings, "TASKS", None)))
    clock = setting("CLOCK", "clock", "")
    if isinstance(clock, str) and "." in clock:
        try:
            import_string(clock)
        except ImportError as exc:
            errors.append(checks.Error(f'COGWORKER["CLOCK"] {clock!r} cannot be imported: {exc}',
                                       id="cogworker.E002"))
    return errors


@checks.register("cogworker")
def check_outbox(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """With OUTBOX on, every outbox database has its table (cogworker.W010, E010: outbox/checks.py)."""
    import os

    from django.conf import settings

    from .conf import build_config

    try:
        config = build_config(getattr(settings, "COGWORKER", None), os.environ)
    except ConfigError:
        return []  # (cogworker.E001 says what is wrong first)
    if not config.outbox:
        return []
    from .outbox.checks import table_problems

    return table_problems()


@checks.register("cogworker", deploy=True)
def check_outbox_off(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``check --deploy`` only, as Django's deploy checks warn of insecure settings: pushes inside a
    transaction wait for its commit (ENQUEUE_ON_COMMIT) but the outbox is off, so a commit that
    finds Redis away loses its jobs (cogworker.W012)."""
    import os

    from django.conf import settings

    from .conf import build_config

    try:
        config = build_config(getattr(settings, "COGWORKER", None), os.environ)
    except ConfigError:
        return []  # (cogworker.E001 says what is wrong first)
    if config.outbox or not config.enqueue_on_commit:
        return []
    return [checks.Warning(
        'COGWORKER["OUTBOX"] is off while pushes inside a transaction wait for its commit (ENQUEUE_ON_COMMIT): a '
        "commit that finds Redis away is kept and its jobs are lost (PushLostAtCommit raised out of atomic())",
        hint='set COGWORKER["OUTBOX"] = True and run manage.py migrate (docs/outbox.md); or, if losing them is '
             'acceptable, add "cogworker.W012" to SILENCED_SYSTEM_CHECKS', id="cogworker.W012")]


@checks.register("cogworker")
def check_job_modules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A ``jobs.py`` or ``tasks.py`` of the project package, in no installed app, that defines jobs:
    no worker imports it, and each push of its jobs is refused (cogworker.W004; push/discovery.py)."""
    from django.conf import settings

    from .push.discovery import stray_job_modules

    # (A tasks.py is this package's only with its tasks backend: another's, Celery's, is none of its business.)
    stems = ("jobs", "tasks") if cogworker_backends(getattr(settings, "TASKS", None)) else ("jobs",)
    return [checks.Warning(
        f"{file} defines {', '.join(names)} but is in no installed app and nothing imports it while Django "
        f"starts: workers never import it, so each push of {'its tasks' if module.endswith('.tasks') else 'its jobs'} "
        "is refused",
        hint=("move it into an installed app (manage.py startapp; every worker imports the jobs.py and tasks.py of "
              "each app in INSTALLED_APPS)"
              + (', or list it in the backend\'s OPTIONS["MODULES"]' if module.endswith(".tasks") else "")),
        obj=module, id="cogworker.W004") for module, file, names in stray_job_modules(stems)]


BACKEND_PATH = "django_cogworker.tasks.CogworkerBackend"


def cogworker_backends(tasks_setting: object) -> dict[str, Mapping[str, Any]]:
    """The entries of ``settings.TASKS`` whose backend is this package's, by alias."""
    if not isinstance(tasks_setting, Mapping):
        return {}
    return {str(alias): params for alias, params in tasks_setting.items()
            if isinstance(params, Mapping) and params.get("BACKEND") == BACKEND_PATH}


def task_option_problems(tasks_setting: object) -> list[str]:
    """Every problem of the ``TASKS`` entries of CogworkerBackend (tasks/options.py), in alias order:
    what ``manage.py check`` reports (cogworker.E005) and ``runcogworker`` refuses to start with."""
    ours = cogworker_backends(tasks_setting)
    if not ours:
        return []
    from .tasks import options

    return [problem for alias in sorted(ours) for problem in options.read(alias, ours[alias]).problems]


REDIS_CHECK_TIMEOUT = 2.0  # seconds ``check --deploy`` waits for Redis to connect and to answer


@checks.register("cogworker", deploy=True)
def check_redis(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``check --deploy`` only (plain ``check`` stays offline): the configured Redis answers a PING
    within REDIS_CHECK_TIMEOUT; if not, say so, naming its URL without the password."""
    import os
    import types

    import redis
    from django.conf import settings

    from .broker.connection import make_redis
    from .conf import build_config

    try:
        config = build_config(getattr(settings, "COGWORKER", None), os.environ)
    except ConfigError:
        return []  # (cogworker.E001 says what is wrong first)
    # (A client of its own with short timeouts: the runtime's waits 5 s to connect, 10 s for a reply.)
    target = types.SimpleNamespace(redis_url=config.redis_url, key_prefix=config.key_prefix, redis_options={
        **config.redis_options, "socket_connect_timeout": REDIS_CHECK_TIMEOUT, "socket_timeout": REDIS_CHECK_TIMEOUT})
    client = None
    try:
        client = make_redis(target)
        client.ping()
    except (redis.RedisError, redis.exceptions.RedisClusterException, OSError) as exc:
        reason = f"{type(exc).__name__}: {exc}"
        secret = _password(config.redis_url)
        if secret:
            reason = reason.replace(secret, "***")
        return [checks.Error(f"Redis at {config.redacted_url} did not answer within {REDIS_CHECK_TIMEOUT:g}s "
                             f"({reason}): workers can't start, and pushes fail, until it does",
                             id="cogworker.E006")]
    finally:
        if client is not None:
            client.close()
    return []


def _password(url: str) -> str:
    """The password of a Redis URL, or "" (to mask it in an error's text, should one show it)."""
    from urllib.parse import urlsplit

    try:
        return urlsplit(url).password or ""
    except ValueError:
        return ""


def _unread_queues(queues: tuple[str, ...], entries: list) -> list[checks.CheckMessage]:
    """A warning for each job class of an installed app, and each periodic entry, whose queue QUEUES
    doesn't list: its jobs would wait forever, unless some worker runs with ``-q`` naming it."""
    from django.apps import apps

    from .push.job import registered, registry

    read = set(queues)

    def unread(what: str, queue: str) -> str:
        return (f"{what} is pushed to queue {queue!r}, which COGWORKER[\"QUEUES\"] ({', '.join(queues)}) doesn't "
                f"list: its jobs wait until a worker reads it (add it to QUEUES, or start one with -q {queue})")

    apps_modules = tuple(app.name for app in apps.get_app_configs() if app.name != "django_cogworker")
    warnings = []
    # (Only the classes of the user's installed apps: those a worker imports; a test module's aren't
    # deployed, and this package's own, a batch's hand-overs, go where its callbacks go: features/batches/batch.py.)
    for name, job_class in sorted(registry().items()):
        module = job_class.__module__
        if job_class.queue not in read and any(module == m or module.startswith(m + ".") for m in apps_modules):
            kind = "task" if getattr(job_class, "task", None) is not None else "job"  # (a @task function's Job)
            warnings.append(checks.Warning(unread(f"{kind} {name}", job_class.queue), obj=name, id="cogworker.W001"))
    for entry in entries:
        entry_class = registered(entry.job)
        queue = entry.queue or (entry_class.queue if entry_class is not None else None)
        if queue is not None and queue not in read:
            warnings.append(checks.Warning(unread(f"periodic entry {entry.name!r}", queue), obj=entry.name,
                                           id="cogworker.W002"))
    return warnings


def _entry_arguments(entries: list) -> list[checks.CheckMessage]:
    """A warning for each periodic entry whose args and kwargs its job's ``perform`` can't take: each
    of its runs would fail (a push checks them; an entry's payload is built without a push's check)."""
    from .push.arguments import check_call
    from .push.job import registered

    warnings = []
    for entry in entries:
        job_class = registered(entry.job)
        try:
            if job_class is not None:
                check_call(job_class, list(entry.args), dict(entry.kwargs))
        except TypeError as exc:
            warnings.append(checks.Warning(f"periodic entry {entry.name!r}: {exc}", obj=entry.name,
                                           id="cogworker.W003"))
    return warnings
