"""The one validated, frozen configuration object, built at the edge.

``build_config(settings_dict, environ)`` reads ``settings.COGWORKER`` (uppercase
keys, like ``CACHES``) plus the environment for the Redis URL, checks every value
(``rules.py``: what each setting must be) and returns a :class:`Config`. Every problem
is collected, so one start names all of them, each as ``COGWORKER["NAME"] must be ...,
got <value>``. Nothing in the engine reads Django settings or the environment; it is
handed this object.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from ..broker.cluster import has_hash_tag, is_cluster_url, tagged_prefix
from ..broker.urls import URL_SCHEMES, redact_url, url_sources
from ..errors import ConfigError
from . import rules
from .rules import FETCH_MODES, HEARTBEAT_INTERVAL_MAX, METRICS_TOKEN_MIN

__all__ = ["FETCH_MODES", "HEARTBEAT_INTERVAL_MAX", "METRICS_TOKEN_MIN", "URL_SCHEMES", "Config", "build_config",
           "redact_url", "validate"]  # (redact_url and the rules' bounds: their old home)

DAY = 24 * 60 * 60


# REDIS_OPTIONS whose values repr(Config) doesn't show (redis-py's password, ssl_password...).
_SECRET_OPTION = re.compile(r"pass|secret|token|credential", re.IGNORECASE)


@dataclasses.dataclass(frozen=True, repr=False)
class Config:
    redis_url: str = "redis://localhost:6379/0"
    redis_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    key_prefix: str = "cogworker:"
    # (name, weight) pairs, in the order given.
    queues: tuple[tuple[str, int], ...] = (("default", 1),)
    strict_queues: bool = False
    concurrency: int = 5
    # Jobs whose perform is ``async def`` run at once on the process's event loop (engine/loop/runner.py),
    # beside the CONCURRENCY threads; 0: no loop, they run on the threads (async_to_sync).
    async_concurrency: int = 100
    # Worker processes of one ``runcogworker``: 1 runs in the command's own process (no
    # supervisor, no fork); more, or "auto" (one per usable CPU), fork them under a supervisor.
    processes: int | str = 1
    # "auto": each worker of a supervisor pinned to a CPU of its own; "none"; or CPU numbers
    # (engine/process/affinity.py says why, and what it costs).
    cpu_affinity: str | tuple[int, ...] = "auto"
    fetch: str = "reliable"
    shutdown_timeout: float = 25.0
    max_retries: int = 25
    dead_max_jobs: int = 10_000
    dead_timeout: float = 180.0 * DAY
    # Cluster-wide average seconds between two polls of the schedule and
    # retry sets: each process polls every average * live processes, randomised.
    poll_interval_average: float = 5.0
    # A process whose last beat is older than this is dead to the others and
    # its in-progress list is requeued. Lower: a crashed process's jobs come
    # back sooner. Higher: fewer false orphanings (a long stall, a failover),
    # each of which runs that process's jobs twice.
    orphan_threshold: float = 300.0
    # How many times a job may be found orphaned (its process died while it
    # ran) before it goes to dead instead of back to its queue. Every job
    # running in a crashed process is counted, not only the culprit: keep it
    # above the number of crashes an innocent job might sit through.
    max_orphanings: int = 3
    # How many times a job refused by one of its limits goes back to the schedule before its next
    # refusal counts as a failure (retry, then dead): features/limits/gate.py.
    over_limit_max: int = 20
    periodic: tuple[Mapping[str, Any], ...] = ()
    periodic_catch_up: bool = False
    # Most missed slots of one entry enqueued on return, with catch-up on.
    periodic_catch_up_max: int = 100
    periodic_tick_interval: float = 5.0
    # Dotted path of a callable returning epoch seconds, read by the periodic
    # ticker instead of time.time (tests drive cron slots with it); "" = time.time.
    clock: str = ""
    unique_lock_ttl: float = 3600.0
    # Seconds of waiting worth one step of priority (docs/fairness.md): a prioritized job waiting
    # that long ranks as one a step higher pushed now, so a stream of urgent work never starves the
    # rest. 0: no aging, strictly by priority.
    priority_aging: float = 60.0
    # Seconds a batch's data lives after its last step (success included): batches/.
    batch_ttl: float = 30.0 * DAY
    client_middleware: tuple[str, ...] = ()
    server_middleware: tuple[str, ...] = ()
    death_handlers: tuple[str, ...] = ()
    # A project's own features (docs/extending.md): dotted paths of callables taking the worker's
    # parts (engine/run/hooks.py's WorkerParts) and returning a Feature or several; run after the
    # package's own, in the order listed.
    features: tuple[str, ...] = ()
    enqueue_on_commit: bool = True
    # Pushes go through the transactional outbox (django_cogworker/outbox/): inside a transaction
    # the job is a row of that transaction, handed to Redis at commit or by a worker's relay.
    outbox: bool = False
    # Longest pause between two fetch polls of an idle process (multi-queue
    # reliable fetch polls; a single queue blocks and wakes at once).
    fetch_idle_max_interval: float = 1.0
    # Jobs per processor a process may take ahead while its jobs run short (engine/fetch/fetcher.py);
    # 0: never more than its idle processors. Reliable fetch only.
    prefetch: int = 1
    heartbeat_interval: float = 5.0
    key_guard_interval: float = 60.0
    # Seconds a job may run on after its timeout's JobTimeout was raised before it counts as
    # stuck (engine/run/timeouts.py: under --processes, its process is replaced).
    timeout_grace: float = 10.0
    # Seconds between two saves of an iterable job's cursor while it runs (features/iteration/): after
    # a kill -9 it resumes from its last save. A class may set its own (``iteration_checkpoint``).
    iteration_checkpoint: float = 1.0
    # Caps on one worker process's life (engine/process/caps.py): over either, it takes nothing new,
    # finishes what runs within SHUTDOWN_TIMEOUT and exits to be replaced. None: no cap.
    max_memory_mb: int | None = None  # its resident memory now (RSS), not its peak
    max_jobs_per_process: int | None = None
    # Seconds a process retired by a rolling restart (SIGHUP to a supervisor) may take to finish its
    # running jobs before it hands the rest back; None: as long as they take.
    rolling_timeout: float | None = None
    # The HTTP port of /healthz and /readyz (engine/process/health.py); None: no health server.
    health_port: int | None = None
    health_host: str = "127.0.0.1"
    # Per-class metrics history (features/history/): runs, failures and run times by the minute (72 h)
    # and the hour (30 days) in Redis, written by each heartbeat; False: not counted.
    metrics_history: bool = True
    tag: str = ""
    # The bearer token the metrics view accepts (``Authorization: Bearer <token>``); "" accepts
    # none, so only a logged-in user with the view permission can read it. Never shown in repr.
    metrics_token: str = dataclasses.field(default="", repr=False)
    # OpenTelemetry traces of pushes and runs (features/tracing/), when opentelemetry-api is
    # importable (the ``otel`` extra); False: none, nothing of OpenTelemetry imported.
    tracing: bool = True
    # Keys of encrypted arguments (features/encryption/): the first seals, every one opens. Never shown.
    encryption_keys: tuple[str, ...] = dataclasses.field(default=(), repr=False)

    @property
    def queue_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.queues)

    @property
    def process_count(self) -> int:
        """PROCESSES as a number: "auto" is the CPUs this process may run on."""
        if self.processes == "auto":
            return cpu_count()
        return int(self.processes)

    @property
    def redacted_url(self) -> str:
        return redact_url(self.redis_url)

    def __repr__(self) -> str:
        """Every field, the password of the Redis URL and of REDIS_OPTIONS masked.

        What records locals (an error tracker, a debugger's dump) captured the password whole.
        """
        shown = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "redis_url" and isinstance(value, str):
                value = redact_url(value)
            elif field.name == "metrics_token":
                value = "***" if value else ""
            elif field.name == "encryption_keys":
                count = len(value) if isinstance(value, tuple) else "?"
                shown.append(f"encryption_keys=<{count} key{'' if count == 1 else 's'}>")
                continue
            elif field.name == "redis_options" and isinstance(value, Mapping):
                value = {k: "***" if isinstance(k, str) and _SECRET_OPTION.search(k) else v for k, v in value.items()}
            shown.append(f"{field.name}={value!r}")
        return f"{type(self).__name__}({', '.join(shown)})"

    def replace(self, **changes: Any) -> Config:
        """Return a copy with ``changes`` applied and validated again."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        values.update(changes)
        return validate(Config(**values))


# setting name -> Config field: the field upper-cased, as rules.py names it
SETTINGS = {field.name.upper(): field.name for field in dataclasses.fields(Config)}
FIELD_TO_SETTING = {v: k for k, v in SETTINGS.items()}


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask, which a container's cpuset narrows), at least 1."""
    import os

    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def build_config(raw: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None,
                 **overrides: Any) -> Config:
    """Build and validate the config from ``settings.COGWORKER`` and the environment.

    ``overrides`` are Config field names (from command-line options); they win.
    """
    environ = environ if environ is not None else {}
    errors: list[str] = []
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError([f"COGWORKER must be a dict, got {raw!r}"])
    values: dict[str, Any] = {}
    for name, value in raw.items():
        field = SETTINGS.get(name)
        if field is None:
            hint = _close_match(str(name))
            errors.append(f'COGWORKER["{name}"] is not a setting' + (f' (did you mean "{hint}"?)' if hint else ""))
            continue
        values[field] = value
    if "redis_url" not in values:
        from_environment = url_sources(None, environ)  # (the setting, when given, won: broker/urls.py)
        if from_environment:
            values["redis_url"] = from_environment[0][1]
    values.update(overrides)
    if "queues" in values:
        values["queues"] = _normalise_queues(values["queues"], errors)
    for name in ("client_middleware", "server_middleware", "death_handlers", "features", "periodic", "cpu_affinity",
                 "encryption_keys"):
        if name in values and isinstance(values[name], list):
            values[name] = tuple(values[name])
    if errors:
        # Report bad keys together with bad values below.
        try:
            validate(Config(**values))
        except ConfigError as exc:
            errors.extend(exc.errors)
        raise ConfigError(errors)
    return validate(Config(**values))


def _close_match(name: str) -> str | None:
    import difflib

    matches = difflib.get_close_matches(name.upper(), list(SETTINGS), n=1)
    return matches[0] if matches else None


def _normalise_queues(value: Any, errors: list[str]) -> Any:
    """Accept ``["a", "b"]``, ``[("a", 3), ["b", 1]]`` or ``["a,3"]``; return (name, weight) pairs."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        errors.append(f'COGWORKER["QUEUES"] must be a list of queue names or (name, weight) pairs, got {value!r}')
        return (("default", 1),)
    pairs = []
    for item in value:
        if isinstance(item, str):
            name, _, weight = item.partition(",")
            weight = weight.strip() or "1"
            try:
                pairs.append((name.strip(), int(weight)))
                continue
            except ValueError:
                pass
        elif isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str):
            pairs.append((item[0], item[1]))
            continue
        errors.append(f'COGWORKER["QUEUES"] entries must be "name", "name,weight" or (name, weight), got {item!r}')
    if not pairs and value:
        return (("default", 1),)  # (every entry was bad, each reported: not also "empty")
    return tuple(pairs)


def validate(cfg: Config) -> Config:
    """Check every field of ``cfg`` (conf/rules.py); raise ConfigError naming each bad setting."""
    errors = rules.problems(cfg)
    if errors:
        raise ConfigError(errors)
    if is_cluster_url(cfg.redis_url) and not has_hash_tag(cfg.key_prefix):
        # The home slot, and the tag the queues' slots are built from (broker/cluster.py, broker/keys/):
        # "cogworker:" becomes "{cogworker}:".
        return dataclasses.replace(cfg, key_prefix=tagged_prefix(cfg.key_prefix))
    return cfg
