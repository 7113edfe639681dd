"""The one validated, frozen configuration object, built at the edge.

``build_config(settings_dict, environ)`` reads ``settings.COGWORKER`` (uppercase
keys, like ``CACHES``) plus the environment for the Redis URL, checks every value
and returns a :class:`Config`. Every problem is collected, so one start names all
of them, each as ``COGWORKER["NAME"] must be ..., got <value>``. Nothing in the
engine reads Django settings or the environment; it is handed this object.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from .bounds import MAX_SECONDS, MAX_SECONDS_TEXT
from .broker.cluster import has_hash_tag, is_cluster_url, tagged_prefix
from .broker.urls import URL_SCHEMES, options_problem, redact_url, url_problem, url_sources
from .errors import ConfigError
from .features.encryption import keys as encryption_keys

__all__ = ["URL_SCHEMES", "Config", "build_config", "redact_url", "validate"]  # (redact_url: its old home)

DAY = 24 * 60 * 60
FETCH_MODES = ("reliable", "basic")
HEARTBEAT_INTERVAL_MAX = 3600.0
METRICS_TOKEN_MIN = 16  # characters: a token a scrape config carries, not a password anyone types


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
    tag: str = ""
    # The bearer token the metrics view accepts (``Authorization: Bearer <token>``); "" accepts
    # none, so only a logged-in user with the view permission can read it. Never shown in repr.
    metrics_token: str = dataclasses.field(default="", repr=False)
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


# setting name -> Config field
SETTINGS = {
    "REDIS_URL": "redis_url",
    "REDIS_OPTIONS": "redis_options",
    "KEY_PREFIX": "key_prefix",
    "QUEUES": "queues",
    "STRICT_QUEUES": "strict_queues",
    "CONCURRENCY": "concurrency",
    "PROCESSES": "processes",
    "CPU_AFFINITY": "cpu_affinity",
    "FETCH": "fetch",
    "SHUTDOWN_TIMEOUT": "shutdown_timeout",
    "MAX_RETRIES": "max_retries",
    "DEAD_MAX_JOBS": "dead_max_jobs",
    "DEAD_TIMEOUT": "dead_timeout",
    "POLL_INTERVAL_AVERAGE": "poll_interval_average",
    "ORPHAN_THRESHOLD": "orphan_threshold",
    "MAX_ORPHANINGS": "max_orphanings",
    "OVER_LIMIT_MAX": "over_limit_max",
    "PERIODIC": "periodic",
    "PERIODIC_CATCH_UP": "periodic_catch_up",
    "PERIODIC_CATCH_UP_MAX": "periodic_catch_up_max",
    "PERIODIC_TICK_INTERVAL": "periodic_tick_interval",
    "CLOCK": "clock",
    "UNIQUE_LOCK_TTL": "unique_lock_ttl",
    "BATCH_TTL": "batch_ttl",
    "CLIENT_MIDDLEWARE": "client_middleware",
    "SERVER_MIDDLEWARE": "server_middleware",
    "DEATH_HANDLERS": "death_handlers",
    "FEATURES": "features",
    "ENQUEUE_ON_COMMIT": "enqueue_on_commit",
    "OUTBOX": "outbox",
    "FETCH_IDLE_MAX_INTERVAL": "fetch_idle_max_interval",
    "PREFETCH": "prefetch",
    "HEARTBEAT_INTERVAL": "heartbeat_interval",
    "KEY_GUARD_INTERVAL": "key_guard_interval",
    "TIMEOUT_GRACE": "timeout_grace",
    "MAX_MEMORY_MB": "max_memory_mb",
    "MAX_JOBS_PER_PROCESS": "max_jobs_per_process",
    "ROLLING_TIMEOUT": "rolling_timeout",
    "HEALTH_PORT": "health_port",
    "HEALTH_HOST": "health_host",
    "TAG": "tag",
    "METRICS_TOKEN": "metrics_token",
    "ENCRYPTION_KEYS": "encryption_keys",
}
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


def _positive_number(v: Any) -> bool:
    # (Compared, never converted: math.isfinite(10**400) raises OverflowError.)
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _cpu_number(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _dotted_paths(v: Any) -> bool:
    return isinstance(v, tuple) and all(isinstance(p, str) and "." in p for p in v)


def validate(cfg: Config) -> Config:
    """Check every field of ``cfg``; raise ConfigError naming each bad setting."""
    errors: list[str] = []

    def bad(field: str, what: str) -> None:
        value = getattr(cfg, field)
        if field == "redis_url" and isinstance(value, str):
            shown = repr(redact_url(value))
        else:  # (lists are kept as tuples: shown as the list the user wrote)
            shown = repr(list(value) if isinstance(value, tuple) and field != "queues" else value)
        errors.append(f'COGWORKER["{FIELD_TO_SETTING[field]}"] must be {what}, got {shown}')

    url_wrong = url_problem(cfg.redis_url)
    if url_wrong:
        bad("redis_url", url_wrong)
    if not isinstance(cfg.redis_options, Mapping):
        # (the value itself isn't echoed: it may hold a password)
        errors.append(f'COGWORKER["REDIS_OPTIONS"] must be a dict of redis-py connection options, '
                      f'got a {type(cfg.redis_options).__name__}')
    elif url_wrong is None:
        options_wrong = options_problem(cfg.redis_url, cfg.redis_options)
        if options_wrong:
            errors.append(f'COGWORKER["REDIS_OPTIONS"] is refused by redis-py: {options_wrong}')
    if isinstance(cfg.redis_options, Mapping) and cfg.redis_options.get("decode_responses"):
        errors.append('COGWORKER["REDIS_OPTIONS"] must not set decode_responses: payloads are kept as the exact '
                      'bytes pushed')
    if not isinstance(cfg.key_prefix, str) or not cfg.key_prefix:
        bad("key_prefix", "a non-empty string")
    elif is_cluster_url(cfg.redis_url) and "{" in cfg.key_prefix and not has_hash_tag(cfg.key_prefix):
        # An unclosed or empty "{" would let the rest of each key pick its slot: scripts fail.
        bad("key_prefix", 'on a cluster, a prefix whose "{" opens a hash tag it closes ("{name}:"), or none')
    if not cfg.queues:
        bad("queues", "a non-empty list of queue names")
    for name, weight in cfg.queues:
        if not isinstance(name, str) or not name or any(c.isspace() for c in name):
            errors.append(f'COGWORKER["QUEUES"] queue names must be non-empty strings without spaces, got {name!r}')
        if not _positive_int(weight):
            errors.append(f'COGWORKER["QUEUES"] weight of {name!r} must be a positive integer, got {weight!r}')
    names = [n for n, _ in cfg.queues]
    if len(set(names)) != len(names):
        twice = ", ".join(map(repr, sorted({n for n in names if names.count(n) > 1}, key=str)))
        errors.append(f'COGWORKER["QUEUES"] must list each queue once, got {twice} more than once')
    for field in ("strict_queues", "periodic_catch_up", "enqueue_on_commit", "outbox"):
        if not isinstance(getattr(cfg, field), bool):
            bad(field, "True or False")
    for field in ("concurrency", "dead_max_jobs", "max_orphanings", "periodic_catch_up_max"):
        if not _positive_int(getattr(cfg, field)):
            bad(field, "a positive integer")
    if cfg.processes != "auto" and not _positive_int(cfg.processes):
        bad("processes", 'a positive integer or "auto"')
    if cfg.cpu_affinity not in ("auto", "none") and not (
            isinstance(cfg.cpu_affinity, tuple) and cfg.cpu_affinity and all(_cpu_number(c) for c in cfg.cpu_affinity)):
        bad("cpu_affinity", '"auto", "none" or a non-empty list of CPU numbers')
    for field in ("max_retries", "prefetch", "over_limit_max"):
        value = getattr(cfg, field)
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            bad(field, "an integer >= 0")
    if cfg.fetch not in FETCH_MODES:
        bad("fetch", 'one of "reliable", "basic"')
    for field in ("shutdown_timeout", "dead_timeout", "poll_interval_average", "orphan_threshold",
                  "unique_lock_ttl", "batch_ttl", "fetch_idle_max_interval", "heartbeat_interval", "key_guard_interval",
                  "periodic_tick_interval", "timeout_grace"):
        if not _positive_number(getattr(cfg, field)):
            bad(field, "a positive number of seconds")
        elif getattr(cfg, field) > MAX_SECONDS:  # (BATCH_TTL=1e16: every batch failed in its opening script)
            bad(field, f"at most {MAX_SECONDS_TEXT}")
    if _positive_number(cfg.heartbeat_interval) and cfg.heartbeat_interval > HEARTBEAT_INTERVAL_MAX:
        # Paused queues, remote signals and retried acks ride on the beat: an hour is already
        # longer than anyone waits for a pause to take; beyond it, a typo (minutes for seconds).
        bad("heartbeat_interval", f"at most {HEARTBEAT_INTERVAL_MAX:.0f} seconds")
    if _positive_number(cfg.orphan_threshold) and _positive_number(cfg.heartbeat_interval) \
            and cfg.orphan_threshold <= 2 * cfg.heartbeat_interval:
        bad("orphan_threshold", f"more than twice HEARTBEAT_INTERVAL ({cfg.heartbeat_interval!r}) so live "
                                "processes are never taken for dead")
    for field in ("client_middleware", "server_middleware", "death_handlers", "features"):
        if not _dotted_paths(getattr(cfg, field)):
            bad(field, "a list of dotted import paths")
    if not isinstance(cfg.periodic, tuple) or not all(isinstance(e, Mapping) for e in cfg.periodic):
        bad("periodic", "a list of dicts")
    if not isinstance(cfg.clock, str) or (cfg.clock and "." not in cfg.clock):
        bad("clock", 'a dotted import path or ""')
    for field in ("max_memory_mb", "max_jobs_per_process"):
        if getattr(cfg, field) is not None and not _positive_int(getattr(cfg, field)):
            bad(field, "a positive integer or None (no cap)")
    if cfg.rolling_timeout is not None and not (_positive_number(cfg.rolling_timeout)
                                                and cfg.rolling_timeout <= MAX_SECONDS):
        bad("rolling_timeout", f"a positive number of seconds up to {MAX_SECONDS_TEXT}, or None (no limit)")
    if cfg.health_port is not None and not (_positive_int(cfg.health_port) and cfg.health_port <= 65535):
        bad("health_port", "a TCP port (1-65535) or None (no health server)")
    if not isinstance(cfg.health_host, str) or not cfg.health_host:
        bad("health_host", 'an address to listen on ("127.0.0.1", "0.0.0.0", "::")')
    if not isinstance(cfg.tag, str):
        bad("tag", "a string")
    if not isinstance(cfg.metrics_token, str) or (cfg.metrics_token and (
            len(cfg.metrics_token) < METRICS_TOKEN_MIN or not cfg.metrics_token.isprintable()
            or any(c.isspace() for c in cfg.metrics_token))):
        # (the value itself isn't echoed: it is a secret)
        errors.append(f'COGWORKER["METRICS_TOKEN"] must be "" or a string of at least {METRICS_TOKEN_MIN} printable '
                      'characters without spaces (e.g. secrets.token_urlsafe()), got '
                      + (f"a {type(cfg.metrics_token).__name__}" if not isinstance(cfg.metrics_token, str)
                         else f"{len(cfg.metrics_token)} characters"))
    if cfg.encryption_keys != ():  # (each problem names the entry's position, never a key)
        errors.extend(encryption_keys.problems(cfg.encryption_keys))
    if errors:
        raise ConfigError(errors)
    if is_cluster_url(cfg.redis_url) and not has_hash_tag(cfg.key_prefix):
        # The home slot, and the tag the queues' slots are built from (cluster.py, keys.py):
        # "cogworker:" becomes "{cogworker}:".
        return dataclasses.replace(cfg, key_prefix=tagged_prefix(cfg.key_prefix))
    return cfg
