"""``manage.py runcogworker``: options -> config -> launcher. Nothing else lives here."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from ... import __version__
from ...checks import task_option_problems
from ...engine.run.db import CloseOldConnections
from ...engine.run.factories import STANDARD_FEATURES
from ...errors import ConfigError
from ...push import runtime
from ...push.middleware import load
from ...push.periodic import build_entries


class Command(BaseCommand):
    help = "Run a cogworker process: processor threads, heartbeat, scheduled poller and periodic ticker."

    def add_arguments(self, parser):
        parser.add_argument("-c", "--concurrency", type=int, help="processor threads (CONCURRENCY)")
        parser.add_argument("--async-concurrency", type=int, metavar="N",
                            help="async jobs at once on the event loop; 0: on the threads (ASYNC_CONCURRENCY)")
        parser.add_argument("-q", "--queue", action="append", dest="queues", metavar="NAME[,WEIGHT]",
                            help="a queue to work, optionally weighted; repeat or comma-separate pairs (QUEUES)")
        parser.add_argument("--fetch", choices=["reliable", "basic"], help="fetch mode (FETCH)")
        parser.add_argument("--timeout", type=float, help="seconds to wait for jobs at shutdown (SHUTDOWN_TIMEOUT)")
        parser.add_argument("--tag", help="a label shown in the admin (TAG)")
        parser.add_argument("-p", "--processes", metavar="N|auto",
                            help="worker processes under one supervisor; auto: one per CPU (PROCESSES)")
        parser.add_argument("--strict", action="store_true", default=None, help="check queues in order (STRICT_QUEUES)")
        parser.add_argument("--max-memory-mb", type=int, metavar="MB",
                            help="replace a worker process whose resident memory passes MB (MAX_MEMORY_MB)")
        parser.add_argument("--max-jobs-per-process", type=int, metavar="N",
                            help="replace a worker process once it has started N jobs (MAX_JOBS_PER_PROCESS)")
        parser.add_argument("--rolling-timeout", type=float, metavar="SECONDS",
                            help="longest wait for a retired process's jobs in a rolling restart (ROLLING_TIMEOUT)")
        parser.add_argument("--health-port", type=int, metavar="PORT",
                            help="serve /healthz and /readyz on this port (HEALTH_PORT)")
        parser.add_argument("--health-host", metavar="ADDRESS", help="the health server's address (HEALTH_HOST)")
        # Added by a supervisor to the command line a fresh child runs (engine/process/children.py).
        parser.add_argument("--supervised", nargs=4, metavar=("SUPERVISOR", "INDEX", "GENERATION", "FD"),
                            help=argparse.SUPPRESS)

    def handle(self, *args, **options):
        from ...engine.process import affinity, confine
        from ...engine.process.caps import REPLACE_EXIT
        from ...engine.process.children import RETIRE, ChildSpec, die_with_parent
        from ...engine.process.health import HealthServer, bind
        from ...engine.process.launcher import Launcher
        from ...engine.process.report import Reporter

        _ensure_logging(options["verbosity"])
        overrides = {field: options[opt] for opt, field in (
            ("concurrency", "concurrency"), ("async_concurrency", "async_concurrency"), ("fetch", "fetch"),
            ("timeout", "shutdown_timeout"),
            ("tag", "tag"), ("strict", "strict_queues"), ("processes", "processes"),
            ("max_memory_mb", "max_memory_mb"), ("max_jobs_per_process", "max_jobs_per_process"),
            ("rolling_timeout", "rolling_timeout"), ("health_port", "health_port"), ("health_host", "health_host"),
        ) if options.get(opt) is not None}
        if options.get("queues"):
            overrides["queues"] = [q.strip() for q in options["queues"]]
        try:
            # (Also told by the system checks, cogworker.E005: this covers --skip-checks and call_command.)
            problems = task_option_problems(getattr(settings, "TASKS", None))
            if problems:
                raise ConfigError(problems)
            base = runtime.get_config()
            config = base.replace(**_normalise(overrides)) if overrides else base
            server_middleware = [CloseOldConnections, *_load("SERVER_MIDDLEWARE", config.server_middleware)]
            client_middleware = _load("CLIENT_MIDDLEWARE", config.client_middleware)
            death_handlers = _load("DEATH_HANDLERS", config.death_handlers)
            # (The package's features first: a project's own see the job after them, like a middleware within.)
            features = [_load("FEATURES", (STANDARD_FEATURES,))[0], *_load("FEATURES", config.features)]
            entries = build_entries(config.periodic, settings.TIME_ZONE or "UTC")
            clock = _load("CLOCK", (config.clock,))[0] if config.clock else time.time
            affinity.check(config.cpu_affinity)
        except ConfigError as exc:
            raise CommandError("invalid configuration:\n  " + "\n  ".join(exc.errors)) from None
        except ImportError as exc:
            raise CommandError(f"invalid configuration: {exc}") from None
        def run_worker_for(spec: ChildSpec | None, health: HealthServer | None = None) -> int:
            """Run one worker process: alone (``spec`` None), or a supervisor's child."""
            extra_info = ({"supervisor": spec.supervisor, "index": spec.index, "generation": spec.generation}
                          if spec else None)
            pinned = affinity.apply(config.cpu_affinity, spec.index if spec else None, processes)
            # (Left free by "auto": kept on one CPU while bound by its GIL; engine/process/confine.py.)
            confiner = confine.for_process(config.cpu_affinity, pinned)
            # Under a supervisor, a worker stops on its forwarded TERM only (see children.child_signals).
            stop_signals = (signal.SIGTERM,) if spec else (signal.SIGTERM, signal.SIGINT)
            redis = runtime.get_redis_when_up()
            companions = [*_companions(config, redis), *([confiner] if confiner else [])]
            launcher = Launcher(config, redis, server_middleware=server_middleware,
                                death_handlers=death_handlers, client_middleware=client_middleware,
                                periodic_entries=entries, clock=clock, version=__version__, extra_info=extra_info,
                                stop_signals=stop_signals, processor_context=runtime.own_connection,
                                companions=companions, retire_signal=RETIRE if spec else signal.SIGHUP,
                                reporter=Reporter(spec.report_fd) if spec else None, health=health,
                                features=features)
            return launcher.run()

        supervised = _supervised_spec(options.get("supervised"))
        processes = config.process_count
        health: HealthServer | None = None
        if config.health_port and supervised is None:  # (a supervisor's children: it answers for them)
            try:
                health = bind(config.health_host, config.health_port)
            except OSError as exc:
                raise CommandError(f"invalid configuration: {exc}") from None
        if supervised is not None:
            die_with_parent(int(supervised.supervisor.split(":")[-2]))
            code = _or_refuse(run_worker_for, supervised)
            sys.stdout.flush()
            sys.exit(code)
        self.stdout.write(banner(config, len(entries), processes))
        self.stdout.flush()
        _log_redis_url_source()  # (after the banner, the first line, whose "redis" it explains)

        if processes == 1:
            code = _or_refuse(run_worker_for, None, health)
        else:
            code = _or_refuse(_supervise, config, run_worker_for, health)
        sys.stdout.flush()
        if code == REPLACE_EXIT:  # (a cap, or a HUP: the process manager starts a fresh one; docs/deployment.md)
            sys.exit(REPLACE_EXIT)
        if code:
            raise CommandError(f"stopped with code {code}")


def banner(config, periodic_entries: int, processes: int) -> str:
    """The line a worker prints at startup: what it runs with, the password of its Redis URL masked.

    The outbox, the caps and the health port too: a worker started without the caps a deployment
    counts on (a typo in an environment variable) looked like any other."""
    caps = [f"max memory {config.max_memory_mb} MB" if config.max_memory_mb else "",
            f"max jobs {config.max_jobs_per_process} per process" if config.max_jobs_per_process else ""]
    return " | ".join(part for part in (
        f"cogworker {__version__} pid {_pid()}", f"redis {config.redacted_url}",
        f"queues {', '.join(f'{n}({w})' for n, w in config.queues)}", f"concurrency {config.concurrency}",
        f"async {config.async_concurrency}",
        f"fetch {config.fetch}", f"periodic entries {periodic_entries}",
        f"processes {processes}" if processes > 1 else "", f"outbox {'on' if config.outbox else 'off'}", *caps,
        f"health {config.health_host}:{config.health_port}" if config.health_port else "") if part)


def _log_redis_url_source() -> None:
    """Say which Redis URL the worker uses when another source names a different one (a WARNING: one
    of them is a mistake). A COGWORKER["REDIS_URL"] hard-coded in the settings silently beat a
    COGWORKER_REDIS_URL set for the deployment, and the worker served another Redis than the web."""
    import os

    from ...broker.urls import URL_SOURCES, redact_url, url_sources

    sources = url_sources(getattr(settings, "COGWORKER", None), os.environ)
    if not sources:
        return
    (used, url), *others = sources
    ignored = [f"{name} ({redact_url(str(other))})" for name, other in others if other != url]
    if ignored:
        logging.getLogger(__name__).warning(
            "Redis URL from %s: %s; also set, and ignored: %s (the first set of %s wins)", used, redact_url(str(url)),
            ", ".join(ignored), ", ".join(URL_SOURCES))


def _or_refuse(run, *args) -> int:
    """Run a worker (or a supervisor's); a setting it found it can't honour as it started (MAX_MEMORY_MB
    below its size) is the command's error, with EX_CONFIG: a process manager restarting it would
    only see it refuse again (caps.REFUSE_EXIT)."""
    from ...engine.process.caps import REFUSE_EXIT

    try:
        return run(*args)
    except ConfigError as exc:
        raise CommandError("invalid configuration:\n  " + "\n  ".join(exc.errors), returncode=REFUSE_EXIT) from None


def _companions(config, redis) -> list:
    """The threads a worker runs beside the engine's: the outbox relay when OUTBOX is on."""
    if not config.outbox:
        return []
    from ...broker.keys import for_config
    from ...outbox.relay import Relay
    from ...push.client import Client

    return [Relay(Client(config, redis).hand_over, redis, for_config(config))]


def _supervised_spec(values: list[str] | None):
    """The ChildSpec of ``--supervised SUPERVISOR INDEX GENERATION FD`` (a supervisor wrote it)."""
    if values is None:
        return None
    from ...engine.process.children import ChildSpec

    try:
        return ChildSpec(values[0], int(values[1]), int(values[2]), int(values[3]))
    except ValueError:
        raise CommandError(f"--supervised is for a supervisor's own use, got {' '.join(values)!r}") from None


def _supervise(config, run_worker, health) -> int:
    """Fork the workers under a Supervisor (Django set up and the jobs imported: once, here)."""
    from django.db import connections

    from ...engine.process.children import fresh_command
    from ...engine.process.launcher import new_identity
    from ...engine.process.supervisor import Supervisor

    # A connection opened here (a system check, a jobs module) would be shared by every child.
    connections.close_all()
    runtime.reset()  # (and no Redis client: redis-py's pools are not fork-safe)
    supervisor_identity = new_identity()

    return Supervisor(config.process_count, run_worker, shutdown_timeout=config.shutdown_timeout,
                      identity=supervisor_identity, command=fresh_command(),
                      heartbeat_interval=config.heartbeat_interval, health=health).run()


def _load(setting: str, paths: tuple[str, ...]) -> list:
    try:
        return load(paths)
    except ImportError as exc:
        raise ImportError(f'COGWORKER["{setting}"]: {exc}') from None


def _normalise(overrides: dict) -> dict:
    if isinstance(overrides.get("processes"), str) and overrides["processes"].isdigit():
        overrides["processes"] = int(overrides["processes"])  # ("auto", or a mistake: validation names it)
    if "queues" in overrides:
        errors: list[str] = []
        pairs = []
        for item in overrides["queues"]:
            pairs.extend(_split_queue_option(item, errors))
        from ...conf import _normalise_queues

        if not pairs and not errors:
            errors.append(f'COGWORKER["QUEUES"] needs a queue name, got {", ".join(overrides["queues"])!r}')
        overrides["queues"] = _normalise_queues(pairs, errors)
        if errors:
            raise ConfigError([e.replace('COGWORKER["QUEUES"]', "-q/--queue") for e in errors])
    return overrides


def _split_queue_option(item: str, errors: list[str]) -> list[str]:
    """``-q mail,3`` is one weighted queue; ``-q a,b`` two; ``-q a,3,b,1`` two weighted (a weight is a number).

    A number that follows no queue name (``-q 3``, ``-q mail,3,4``) is an error: it used to
    become a queue named "4".
    """
    out: list[str] = []
    for part in (p.strip() for p in item.split(",")):
        if not part:
            continue
        if part.lstrip("-").isdigit():
            if not out or "," in out[-1]:
                errors.append(f'COGWORKER["QUEUES"] weight {part} in {item!r} follows no queue name')
                continue
            out[-1] = f"{out[-1]},{part}"  # a weight of the queue before it (a bad one fails validation)
        else:
            out.append(part)
    return out


def _pid() -> int:
    import os

    return os.getpid()


def _ensure_logging(verbosity: int) -> None:
    """Show what the worker and its jobs log, each record once, with the running job's class and jid.

    Every handler of the project's logging gets the job's context (its format may use ``jid``,
    ``job_class``, ``job_context``). A root logger with no handler (no LOGGING, or one that
    routes some loggers only) gets one: stderr, INFO (DEBUG with -v 2), with time, level and,
    logged while a job runs, its class and jid. A job logging on a logger of its own printed
    nothing then, or a bare WARNING through Python's last resort: the handler went on
    ``django_cogworker`` alone when LOGGING was set.

    That handler prints only what no console handler nearer the record's logger printed, and
    Django's default console handler (DEFAULT_LOGGING's, on the ``django`` logger, bare
    messages, active with DEBUG) is taken off for it: with both, each ``django.tasks`` line,
    traceback and all, was printed twice, bare and then with the job's context.
    """
    from ... import joblog

    joblog.add_context(joblog.configured_handlers())
    root = logging.getLogger()
    if root.handlers:
        return
    django = logging.getLogger("django")
    for default in [h for h in django.handlers if _is_djangos_default_console(h)]:
        django.removeHandler(default)  # (ours prints all it printed, and with DEBUG off too)
    for console in joblog.configured_handlers():
        if joblog.is_console(console):
            console.addFilter(joblog.MarkPrinted())
    level = logging.DEBUG if verbosity > 1 else logging.INFO
    handler = logging.StreamHandler()
    handler.setLevel(level)
    handler.addFilter(joblog.JobContextFilter())
    handler.addFilter(joblog.NotPrinted())
    handler.setFormatter(logging.Formatter(
        "%(asctime)s %(process)d %(threadName)s %(levelname)s%(job_context)s %(name)s: %(message)s"))
    handler.addFilter(joblog.JobShown())  # (last: its format shows the job, which a line then names once)
    root.addHandler(handler)
    if root.level > level:  # (a lower one the project set stays: the handler's level applies)
        root.setLevel(level)


def _is_djangos_default_console(handler: logging.Handler) -> bool:
    """Whether ``handler`` is Django's DEFAULT_LOGGING "console": a StreamHandler with no format,
    printing only when DEBUG is on (a project's own "console" has a format, or other filters)."""
    from django.utils.log import RequireDebugTrue

    return (type(handler) is logging.StreamHandler and handler.get_name() == "console" and handler.formatter is None
            and any(isinstance(f, RequireDebugTrue) for f in handler.filters))
