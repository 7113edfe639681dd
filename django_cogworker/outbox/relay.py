"""The relay: every ``runcogworker`` process pushes the outbox rows still waiting, oldest first.

A row waits when Redis was away at its transaction's commit, or its process died between the
commit and the push. Each round takes up to BATCH rows of a database, pushes their jobs with their
marks (PUSH: a job whose mark is there was pushed before, and isn't again), and deletes the rows:

- PostgreSQL, MySQL/MariaDB (``SELECT ... FOR UPDATE SKIP LOCKED``): in one transaction, holding
  the rows' locks; relays take disjoint rows without waiting on each other. A relay killed -9 lets
  its locks go with its connection; the next one to take the rows finds their marks.
- A database without SKIP LOCKED (SQLite, which serializes writers anyway): the rows are claimed by
  one UPDATE (``claimed_by``, ``claimed_until``: CLAIM seconds), pushed, then deleted. A claim
  outlived (its relay died) is taken again; the marks (MARK_TTL, far longer than CLAIM) say so.

A row that can never be pushed (not a job's JSON, a destination of the wrong type) goes to the dead
set with the reason and is deleted: the rows behind it go on (a batch's unit as the steps it has
left, which the dead set's retry hands back to the outbox: retry.py). Redis away (or refusing writes): the
round stops, rows kept, and the watchdog backs off.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections, router, transaction
from django.db.models import Min, Sum

from ..broker.keys import Keys
from ..broker.types import RedisClient
from ..engine.loops import Watchdog
from ..errors import PayloadError, is_unavailable
from ..push import payload as payloads
from . import units
from .models import OutboxJob
from .store import CLAIM  # (seconds a claim on rows holds)

logger = logging.getLogger(__name__)

BATCH = 500  # jobs per round (one PUSH call, one DELETE; at least one row, however many jobs it holds)
IDLE = 1.0  # seconds between two looks at an empty outbox
# A row younger than this is its pusher's, handed over at its commit right now: a relay taking it
# too would only find its mark. (Redis away at that commit: the row waits this long at least.)
FRESH = 5.0
WAIT_WARNING = 60.0  # rows waiting longer than this are logged at WARNING (once a minute)


def outbox_aliases() -> list[str]:
    """The databases that hold an outbox table: those the routers let it migrate to."""
    return [alias for alias in connections if router.allow_migrate_model(alias, OutboxJob)]


def relay_once(alias: str, hand_over: Callable[[Sequence[dict[str, Any]]], Any], redis: RedisClient, keys: Keys,
               *, now: float, fresh: float = FRESH, limit: int = BATCH) -> int:
    """Relay the oldest rows of ``alias`` older than ``fresh`` seconds, up to about ``limit`` jobs
    (at least one row); return how many jobs were taken (pushed, found pushed before, or sent to
    dead), their rows all deleted."""
    manager = OutboxJob.objects.using(alias)
    # (Claimed rows are left alone: a relay's where rows can't be locked, a unit being run at its
    # commit by its pushing process, store.py.)
    waiting = manager.filter(created__lte=now - fresh, claimed_until__lt=now).order_by("id")
    if connections[alias].features.has_select_for_update_skip_locked:
        with transaction.atomic(using=alias):
            ids = _up_to(list(waiting.select_for_update(skip_locked=True).values_list("id", "jobs")[:limit]), limit)
            # (The rows past the cut stay locked until the commit: the next round takes them.)
            rows = list(manager.filter(pk__in=ids).order_by("id")) if ids else []
            taken = _push_rows(rows, hand_over, redis, keys, now)
            if rows:
                manager.filter(pk__in=ids).delete()
        return taken
    token = secrets.token_hex(8)
    ids = _up_to(list(waiting.values_list("id", "jobs")[:limit]), limit)
    # (One statement: SQLite runs it under its write lock, so two relays never claim one row; one
    # claimed by another relay since it was read is not claimed again.)
    if not ids or not manager.filter(pk__in=ids, claimed_until__lt=now).update(claimed_by=token,
                                                                                claimed_until=now + CLAIM):
        return 0
    rows = list(manager.filter(claimed_by=token).order_by("id"))
    try:
        taken = _push_rows(rows, hand_over, redis, keys, now)
    except BaseException:
        # (Let the claim go, or the rows would wait CLAIM more once Redis is back.)
        manager.filter(claimed_by=token).update(claimed_by="", claimed_until=0.0)
        raise
    manager.filter(claimed_by=token).delete()
    return taken


def _up_to(found: list[tuple[Any, int]], limit: int) -> list[Any]:
    """The ids of the first rows of ``found`` (id, jobs) holding up to ``limit`` jobs (one at least)."""
    ids: list[Any] = []
    jobs = 0
    for pk, count in found:
        if ids and jobs + count > limit:
            break
        ids.append(pk)
        jobs += count
    return ids


def row_jobs(row: OutboxJob) -> list[dict[str, Any]]:
    """The jobs of ``row``: one payload, or a JSON array of several. Raise PayloadError."""
    if row.jobs == 1:
        return [payloads.decode(row.payload)]
    try:
        found = json.loads(row.payload, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise PayloadError(f"unparseable payload: {exc}") from exc
    if not isinstance(found, list) or not all(map(_is_job, found)):
        raise PayloadError(f"a row of {row.jobs} jobs that is not a JSON array of jobs")
    return found


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _is_job(payload: Any) -> bool:
    """Whether ``payload`` passes payloads.decode's checks (a JSON object with a class, its arguments)."""
    return (isinstance(payload, dict) and isinstance(payload.get("class"), str)
            and isinstance(payload.get("args", []), list) and isinstance(payload.get("kwargs", {}), dict))


def _push_rows(rows: Sequence[OutboxJob], hand_over: Callable[[Sequence[dict[str, Any]]], Any],
               redis: RedisClient, keys: Keys, now: float) -> int:
    """Push the jobs of ``rows`` (one call); a job (or a row) that can't be pushed goes to dead.
    Return how many jobs were taken. Raise an outage."""
    readable: list[tuple[OutboxJob, list[dict[str, Any]]]] = []
    taken = 0
    for row in rows:
        try:
            readable.append((row, row_jobs(row)))
        except PayloadError as exc:
            _to_dead(redis, keys, row, str(exc), now)
            taken += row.jobs
    if not readable:
        return taken
    try:
        hand_over([item for _row, items in readable for item in items])
        return taken + sum(len(items) for _row, items in readable)
    except Exception as exc:
        if is_unavailable(exc):
            raise
        logger.warning("outbox: %d job(s) refused together (%s: %s); pushing them one by one",
                       sum(len(items) for _row, items in readable), type(exc).__name__, exc)
    for row, _items in readable:  # (a deterministic refusal: find the jobs it was, and push the others)
        for item in row_jobs(row):  # (read again: the push took "at" out of each)
            try:
                hand_over([item])
            except Exception as exc:
                if is_unavailable(exc):
                    raise
                _to_dead(redis, keys, row, f"{type(exc).__name__}: {exc}", now, item)
            taken += 1
    return taken


def _to_dead(redis: RedisClient, keys: Keys, row: OutboxJob, reason: str, now: float,
             item: dict[str, Any] | None = None) -> None:
    """File job ``item`` of ``row`` (None: the row, whole) in the dead set with ``reason`` (its
    payload kept as it is, or as text)."""
    why = f"outbox row {row.pk} (jid {row.jid if item is None else item.get('jid')}) can't be pushed: {reason}"
    if item is not None and units.is_unit(item):
        entry = units.left(redis, keys, item)  # (what it has left: a retry runs that, retry.py)
    elif item is not None:
        entry = dict(item)
    else:
        try:
            entry = payloads.decode(row.payload)
        except PayloadError:
            entry = payloads.dead_letter(row.payload, why, now)
    entry.update(error_class="OutboxError", error_message=why, failed_at=now, dead_reason=why)
    redis.zadd(keys.dead, {payloads.encode(entry): now})
    logger.error("%s: sent to dead", why)


class Relay:
    """The outbox relay of one worker process: a thread relaying every outbox database's rows.

    Built by ``runcogworker`` when OUTBOX is on, with a ``hand_over`` (the Client's) and the
    process's Redis client, and given to the Launcher, which calls ``start`` once the process is
    up and ``stop`` first at shutdown (it finishes the round under way: a round is one push and
    one delete). Quiet doesn't stop it: it fetches nothing. Each database has its own watchdog:
    one away doesn't stop the others' rows.
    """

    def __init__(self, hand_over: Callable[[Sequence[dict[str, Any]]], Any], redis: RedisClient, keys: Keys, *,
                 aliases: Callable[[], list[str]] = outbox_aliases, clock: Callable[[], float] = time.time,
                 idle: float = IDLE, fresh: float = FRESH):
        self.hand_over = hand_over
        self.redis = redis
        self.keys = keys
        self.aliases = aliases
        self.clock = clock
        self.idle = idle
        self.fresh = fresh
        self.stop_event = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cogworker-outbox-relay", daemon=True)
        self._next_look: dict[str, float] = {}
        self._db_down: dict[str, float] = {}  # alias -> since when (monotonic) its database is away

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        if self._thread.ident is not None:
            self._thread.join(30)

    def _run(self) -> None:
        aliases = self.aliases()
        dogs = {alias: Watchdog(f"outbox relay ({alias})", self.stop_event) for alias in aliases}
        try:
            while not self.stop_event.is_set():
                busy = False
                for alias in aliases:
                    taken: list[int] = []

                    def step(alias: str = alias, taken: list[int] = taken) -> None:
                        taken.append(self._round(alias))

                    dogs[alias].run_step(step)
                    busy = busy or bool(taken and taken[0])
                if not busy:
                    self.stop_event.wait(self.idle)
        finally:
            connections.close_all()  # (this thread's own)

    def _round(self, alias: str) -> int:
        """One round on ``alias`` (and, once a minute, the warning about rows waiting too long)."""
        try:
            self._warn_when_late(alias)
            taken = relay_once(alias, self.hand_over, self.redis, self.keys, now=self.clock(), fresh=self.fresh)
        except (OperationalError, InterfaceError) as exc:
            # The database away: said once, as the watchdog says a Redis outage, then tried again
            # each idle pause; its end said with its length. (Other errors: the watchdog's traceback.)
            connections[alias].close()  # (a connection broken by a database restart: a fresh one next round)
            if alias not in self._db_down:
                self._db_down[alias] = time.monotonic()
                logger.error("outbox relay (%s): the database is unreachable (%s: %s); trying again every %gs",
                             alias, type(exc).__name__, exc, self.idle)
            return 0
        except DatabaseError:
            connections[alias].close()
            raise
        since = self._db_down.pop(alias, None)
        if since is not None:
            logger.warning("outbox relay (%s): the database is back after %.1fs", alias, time.monotonic() - since)
        return taken

    def _warn_when_late(self, alias: str) -> None:
        now = time.monotonic()
        if now < self._next_look.get(alias, 0.0):
            return
        self._next_look[alias] = now + WAIT_WARNING
        count, oldest = waiting(alias)
        age = self.clock() - oldest if oldest is not None else 0.0
        if age > WAIT_WARNING:
            logger.warning("outbox of database %r: %d job(s) waiting, the oldest for %.0fs (is Redis reachable?)",
                           alias, count, age)


def waiting(alias: str) -> tuple[int, float | None]:
    """How many rows wait in ``alias``'s outbox, and when the oldest was written (None: none)."""
    found = OutboxJob.objects.using(alias).aggregate(count=Sum("jobs"), oldest=Min("created"))
    return found["count"] or 0, found["oldest"]
