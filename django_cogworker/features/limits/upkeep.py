"""What a worker's heartbeat does for limiters, and what startup checks of them.

Each beat (:func:`beat`), in one pipeline, and only when there is something to write:

* the leases of the concurrency places this process holds are renewed (LIMIT_RENEW): a place
  stays held while its job runs, however long, and is freed ``lease`` seconds after the last
  renewal when the process dies;
* the limiter keys used since the last beat go into the ``limits`` index, with their specs, for
  the admin, the CLI and the metrics: no write on a job's path for them.

A key of the wrong type among them is moved to quarantine at once (broker/quarantine.py) and its
write made again: a ``holders`` of the wrong type failed every beat, for ever (no key guard round
knows the keys of each limiter).

:func:`problems` names what can't work with the config: a lease shorter than two heartbeat
intervals would lapse between two renewals of a job that runs on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from ...broker.keys import Keys, Want
from ...broker.quarantine import is_wrong_type, quarantine_wrong, run_script
from ...broker.types import RedisClient
from . import scripts
from .limiter import HELD, SEEN, defined

logger = logging.getLogger(__name__)


def beat(redis: RedisClient, keys: Keys) -> None:
    """Renew the leases held here, and index the keys used since the last beat."""
    held = HELD.by_key()
    seen = SEEN.take()
    if not held and not seen:
        return
    pipe = redis.pipeline(transaction=False)
    for key, (lease, tokens) in held.items():
        scripts.LIMIT_RENEW.in_pipeline(pipe, [keys.limit(key).holders], [repr(lease), *tokens])
    now = time.time()
    if seen:
        pipe.zadd(keys.limits, dict.fromkeys(seen, now))
        pipe.hset(keys.limit_specs, mapping=dict(seen))  # type: ignore[arg-type]
    replies = pipe.execute(raise_on_error=False)
    for i, (key, (lease, tokens)) in enumerate(held.items()):
        if is_wrong_type(replies[i]):
            replies[i] = _hold_again(redis, keys, key, lease, tokens)
    if seen and any(is_wrong_type(reply) for reply in replies[len(held):]):
        index = {keys.limits: Want("zset"), keys.limit_specs: Want("hash")}
        quarantine_wrong(redis, keys, index)
        again = redis.pipeline(transaction=False)
        again.zadd(keys.limits, dict.fromkeys(seen, now))
        again.hset(keys.limit_specs, mapping=dict(seen))  # type: ignore[arg-type]
        replies[len(held):] = again.execute(raise_on_error=False)
    failed = [reply for reply in replies if isinstance(reply, Exception)]
    if failed:
        for key, spec in seen.items():  # (written with a later beat instead)
            SEEN.put(key, spec)
        raise failed[0]
    for (key, (_lease, tokens)), renewed in zip(held.items(), replies, strict=False):
        if int(renewed) < len(tokens):
            logger.warning("limiter %r: %d lease(s) of this process lapsed before their renewal (a beat came late); "
                           "their jobs run on without a place", key, len(tokens) - int(renewed))


def _hold_again(redis: RedisClient, keys: Keys, key: str, lease: float, tokens: list[str]) -> int:
    """Renew the places held here on ``key`` whose holders is of the wrong type: moved aside, and
    this process's places written into the fresh one (they run: lost with the key, the limit let
    in as many more), for ``lease`` seconds from now (Redis's clock). Return how many are held."""
    lk = keys.limit(key)
    if not quarantine_wrong(redis, keys, lk.expected()):
        return run_script(scripts.LIMIT_RENEW, redis, keys, [lk.holders], [repr(lease), *tokens], lk.expected)
    seconds, micros = redis.time()
    until = int(seconds) + int(micros) / 1_000_000 + lease
    redis.zadd(lk.holders, dict.fromkeys(tokens, until), nx=True)
    return len(tokens)


def problems(heartbeat_interval: float, jobs: Mapping[str, Any] | None = None) -> list[str]:
    """What is wrong with the limiters defined so far, given the config: one sentence each, naming
    the job classes among ``jobs`` (name -> class) whose ``limits`` hold the limiter."""
    found = []
    for limiter in defined():
        if limiter.lease is not None and limiter.lease < 2 * heartbeat_interval:
            users = sorted(name for name, cls in (jobs or {}).items()
                           if any(entry.family == limiter.family and entry.spec() == limiter.spec()
                                  for entry in getattr(cls, "limits", ())))
            used = f" (in the limits of {', '.join(users)})" if users else ""
            found.append(f"{limiter!r}{used}: its lease ({limiter.lease:g}s) must be at least twice "
                         f'COGWORKER["HEARTBEAT_INTERVAL"] ({heartbeat_interval:g}s): the heartbeat renews '
                         f"it, and a lease that lapses between two beats frees the place of a job still running")
    return found
