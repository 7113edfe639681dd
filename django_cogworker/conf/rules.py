"""What each setting must be: every check of a :class:`~django_cogworker.conf.Config`'s values.

``problems(cfg)`` returns one line per bad setting, each as ``COGWORKER["NAME"] must be ...,
got <value>`` (a secret's value is never echoed); ``conf.validate`` raises them together, so one
start names them all. A setting's name is its field's, upper-cased (``conf.SETTINGS``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..bounds import MAX_SECONDS, MAX_SECONDS_TEXT
from ..broker.cluster import has_hash_tag, is_cluster_url
from ..broker.urls import options_problem, redact_url, url_problem
from ..features.encryption import keys as encryption_keys

FETCH_MODES = ("reliable", "basic")
HEARTBEAT_INTERVAL_MAX = 3600.0
METRICS_TOKEN_MIN = 16  # characters: a token a scrape config carries, not a password anyone types


def _positive_number(v: Any) -> bool:
    # (Compared, never converted: math.isfinite(10**400) raises OverflowError.)
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _cpu_number(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _dotted_paths(v: Any) -> bool:
    return isinstance(v, tuple) and all(isinstance(p, str) and "." in p for p in v)


def problems(cfg: Any) -> list[str]:
    """Each bad value of ``cfg`` (a Config as built: typed Any, its fields hold what the user wrote
    until this passes), named by its setting."""
    errors: list[str] = []

    def bad(field: str, what: str) -> None:
        value = getattr(cfg, field)
        if field == "redis_url" and isinstance(value, str):
            shown = repr(redact_url(value))
        else:  # (lists are kept as tuples: shown as the list the user wrote)
            shown = repr(list(value) if isinstance(value, tuple) and field != "queues" else value)
        errors.append(f'COGWORKER["{field.upper()}"] must be {what}, got {shown}')

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
    for field in ("strict_queues", "periodic_catch_up", "enqueue_on_commit", "outbox", "metrics_history", "tracing"):
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
    for field in ("max_retries", "prefetch", "over_limit_max", "async_concurrency"):
        value = getattr(cfg, field)
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            bad(field, "an integer >= 0")
    if cfg.fetch not in FETCH_MODES:
        bad("fetch", 'one of "reliable", "basic"')
    for field in ("shutdown_timeout", "dead_timeout", "poll_interval_average", "orphan_threshold",
                  "unique_lock_ttl", "batch_ttl", "fetch_idle_max_interval", "heartbeat_interval", "key_guard_interval",
                  "periodic_tick_interval", "timeout_grace", "iteration_checkpoint"):
        if not _positive_number(getattr(cfg, field)):
            bad(field, "a positive number of seconds")
        elif getattr(cfg, field) > MAX_SECONDS:  # (BATCH_TTL=1e16: every batch failed in its opening script)
            bad(field, f"at most {MAX_SECONDS_TEXT}")
    if not (_positive_number(cfg.priority_aging) or cfg.priority_aging == 0) or cfg.priority_aging > MAX_SECONDS \
            or isinstance(cfg.priority_aging, bool):
        bad("priority_aging", f"a number of seconds from 0 (no aging) to {MAX_SECONDS_TEXT}")
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
    return errors
