"""The relay: every ``runcogworker`` process pushes the outbox rows still waiting, oldest first
(rows.py: reading a row; connect.py: its connections).

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
left, which the dead set's retry hands back to the outbox: retry.py). A row whose dates, count or
jids no pusher writes is relayed, dead-lettered or logged, never kept unseen (rows.py). Redis away
(or refusing writes): the round stops, rows kept, and the watchdog backs off.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections, router, transaction
from django.db.models import Max, Min, Q, Sum

from ...broker.keys import Keys
from ...broker.types import RedisClient
from ...engine.loops import Watchdog
from ...errors import PayloadError, is_unavailable
from ...push import payload as payloads
from .. import units
from ..models import OutboxJob
from ..store import CLAIM  # (seconds a claim on rows holds)
from . import connect, rows
from .rows import row_jobs

logger = logging.getLogger(__name__)

BATCH = 500  # jobs per round (one PUSH call, one DELETE; at least one row, however many jobs it holds)
IDLE = 1.0  # seconds between two looks at an empty outbox
# A row younger than this is its pusher's, handed over at its commit right now: a relay taking it
# too would only find its mark. (Redis away at that commit: the row waits this long at least.)
FRESH = 5.0
WAIT_WARNING = 60.0  # rows waiting longer than this are logged at WARNING (once a minute)
STOP_WAIT = 5.0  # seconds a relay's stop waits for its threads' rounds under way, all together


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
    # commit by its pushing process, store.py. A row dated further ahead than ``fresh``, or claimed
    # further ahead than FAR_CLAIM, is no pusher's of now: taken, and said (rows.py). On PostgreSQL
    # NaN compares above every number, so a NaN date or claim is taken with them.)
    free = Q(claimed_until__lt=now) | Q(claimed_until__gt=now + rows.FAR_CLAIM)
    waiting = manager.filter(Q(created__lte=now - fresh) | Q(created__gt=now + fresh), free).order_by("id")
    if connections[alias].features.has_select_for_update_skip_locked:
        with transaction.atomic(using=alias):
            ids = _up_to(list(waiting.select_for_update(skip_locked=True).values_list("id", "jobs")[:limit]), limit)
            # (The rows past the cut stay locked until the commit: the next round takes them.)
            found = list(manager.filter(pk__in=ids).order_by("id")) if ids else []
            taken = _push_rows(alias, found, hand_over, redis, keys, now, fresh)
            if found:
                manager.filter(pk__in=ids).delete()
        return taken
    token = secrets.token_hex(8)
    ids = _up_to(list(waiting.values_list("id", "jobs")[:limit]), limit)
    # (One statement: SQLite runs it under its write lock, so two relays never claim one row; one
    # claimed by another relay since it was read is not claimed again.)
    if not ids or not manager.filter(free, pk__in=ids).update(claimed_by=token, claimed_until=now + CLAIM):
        return 0
    found = list(manager.filter(claimed_by=token).order_by("id"))
    try:
        taken = _push_rows(alias, found, hand_over, redis, keys, now, fresh)
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
        count = max(1, count)  # (a hand-written count of 0 or less must not let a round take every row)
        if ids and jobs + count > limit:
            break
        ids.append(pk)
        jobs += count
    return ids


def _push_rows(alias: str, found: Sequence[OutboxJob], hand_over: Callable[[Sequence[dict[str, Any]]], Any],
               redis: RedisClient, keys: Keys, now: float, fresh: float) -> int:
    """Push the jobs of rows ``found`` (one call); a job (or a row) that can't be pushed goes to dead.
    Return how many jobs were taken. Raise an outage."""
    readable: list[tuple[OutboxJob, list[dict[str, Any]]]] = []
    taken = 0
    odd: list[str] = []
    jids = rows.Jids()
    for row in found:
        try:
            items = row_jobs(row)
        except PayloadError as exc:
            odd += [f"row {row.pk} {what}" for what in rows.oddities(row, None, now, fresh)]
            _to_dead(redis, keys, row, str(exc), now)
            taken += max(1, row.jobs)  # (its count is unreadable too, perhaps: it was one row's worth)
            continue
        odd += [f"row {row.pk} {what}" for what in rows.oddities(row, len(items), now, fresh)]
        kept = []
        for item in items:
            reason = rows.bad_at(item)
            seen = jids.check(row, item) if reason is None else None
            if seen is not None and seen[0] == "copy":
                logger.warning("outbox relay (%s): %s", alias, seen[1])
            elif reason is not None or seen is not None:
                _to_dead(redis, keys, row, reason or seen[1], now, item)  # type: ignore[index]
            else:
                kept.append(item)
        taken += len(items) - len(kept)
        if kept:
            readable.append((row, kept))
    if odd:
        logger.warning("outbox relay (%s): %d row(s) whose dates or count no pusher writes, relayed now: %s%s",
                       alias, len(odd), "; ".join(odd[:5]), f"; and {len(odd) - 5} more" if len(odd) > 5 else "")
    if not readable:
        return taken
    # (Copies: the push takes "at" out of each, and a refusal below pushes them again one by one.)
    copies = [(row, [dict(item) for item in items]) for row, items in readable]
    jobs = [item for _row, items in readable for item in items]
    try:
        written = hand_over(jobs)
    except Exception as exc:
        if is_unavailable(exc):
            raise
        logger.warning("outbox: %d job(s) refused together (%s: %s); pushing them one by one",
                       len(jobs), type(exc).__name__, exc)
    else:
        _say_pushed_before(alias, redis, keys, readable, jobs, written)
        return taken + len(jobs)
    for row, items in copies:  # (a deterministic refusal: find the jobs it was, and push the others)
        for item in items:
            try:
                hand_over([item])
            except Exception as exc:
                if is_unavailable(exc):
                    raise
                _to_dead(redis, keys, row, f"{type(exc).__name__}: {exc}", now, item)
            taken += 1
    return taken


def _say_pushed_before(alias: str, redis: RedisClient, keys: Keys,
                       readable: Sequence[tuple[OutboxJob, list[dict[str, Any]]]], jobs: Sequence[dict[str, Any]],
                       written: Any) -> None:
    """Say which rows held jobs not written because their mark was there: handed to Redis before.
    A row left after its push (its pusher or relay stopped before the delete), or a row holding a
    jid another row's job was pushed under since (MARK_TTL): either way not pushed again, and said
    once per round, the rows named (the client says each job at INFO). A unique job's duplicate
    isn't written either: its lock, not a mark, says so (the client's INFO line)."""
    if not isinstance(written, Sequence) or len(written) == len(jobs):
        return
    pushed = {id(item) for item in written}
    unwritten = [(row, item) for row, items in readable for item in items
                 if id(item) not in pushed and not units.is_unit(item)]
    marked = units._marked(redis, keys, [item for _row, item in unwritten]) if unwritten else set()
    before = [(row, item) for row, item in unwritten if item["jid"] in marked]
    if before:
        named = sorted({str(row.pk) for row, _item in before})
        logger.warning("outbox relay (%s): %d job(s) of row(s) %s%s were handed to Redis before (their marks): not "
                       "pushed again (a row left after its push, or one holding a jid already pushed)", alias,
                       len(before), ", ".join(named[:10]), f" and {len(named) - 10} more" if len(named) > 10 else "")


def _to_dead(redis: RedisClient, keys: Keys, row: OutboxJob, reason: str, now: float,
             item: dict[str, Any] | None = None) -> None:
    """File job ``item`` of ``row`` (None: the row, whole) in the dead set with ``reason`` (its
    payload kept as it is, or as text)."""
    why = f"outbox row {row.pk} (jid {row.jid if item is None else item.get('jid')}) can't be pushed: {reason}"
    if item is not None and units.is_unit(item):
        entry = units.left(redis, keys, item)  # (what it has left: a retry runs that, retry.py)
    elif item is not None:
        entry = dict(item)
        if rows.bad_at(entry):
            entry.pop("at")  # (said in the reason; infinity is no JSON: a retry from dead runs it now)
    else:
        try:
            entry = payloads.decode(row.payload)
        except PayloadError:
            entry = payloads.dead_letter(row.payload, why, now)
    entry.update(error_class="OutboxError", error_message=why, failed_at=now, dead_reason=why)
    redis.zadd(keys.dead, {payloads.encode(entry): now})
    logger.error("%s: sent to dead", why)


class Relay:
    """The outbox relay of one worker process: a thread per outbox database, relaying its rows.

    Built by ``runcogworker`` when OUTBOX is on, with a ``hand_over`` (the Client's) and the
    process's Redis client, and given to the Launcher, which calls ``start`` once the process is
    up and ``stop`` at shutdown, once the fetch has stopped: each thread finishes the round under
    way (one push and one delete), waited for STOP_WAIT at the most. Quiet doesn't stop it: it
    fetches nothing.

    A thread per database, each on a connection of its own that gives up connecting after
    connect.CONNECT_TIMEOUT: one database that doesn't answer (its host frozen) held the one
    relay thread, and the rows of every other database waited behind it; a database away is
    said once and tried again each idle pause, its end said with its length.
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
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for alias in self.aliases():
            thread = threading.Thread(target=self._run, args=(alias,), name=f"cogworker-outbox-relay-{alias}",
                                      daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        deadline = time.monotonic() + STOP_WAIT
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():  # (a daemon: it ends with the process; its round's rows stay for a relay)
                logger.warning("%s still in a round at shutdown (its database not answering?): not waited for; "
                               "its rows stay in the outbox for the next relay", thread.name)

    def _run(self, alias: str) -> None:
        dog = Watchdog(f"outbox relay ({alias})", self.stop_event)
        down: list[float] = []  # (since when, monotonic, its database is away)
        next_look = [0.0]
        with connect.bounded(alias):
            while not self.stop_event.is_set():
                taken: list[int] = []
                dog.run_step(lambda taken=taken: taken.append(self._round(alias, down, next_look)))  # type: ignore[misc]
                if not (taken and taken[0]):
                    self.stop_event.wait(self.idle)

    def _round(self, alias: str, down: list[float], next_look: list[float]) -> int:
        """One round on ``alias`` (and, once a minute, the warning about rows waiting too long)."""
        try:
            if time.monotonic() >= next_look[0]:
                next_look[0] = time.monotonic() + WAIT_WARNING
                self._warn_when_late(alias)
            taken = relay_once(alias, self.hand_over, self.redis, self.keys, now=self.clock(), fresh=self.fresh)
        except (OperationalError, InterfaceError) as exc:
            # The database away: said once, as the watchdog says a Redis outage, then tried again
            # each idle pause; its end said with its length. (Other errors: the watchdog's traceback.)
            connections[alias].close()  # (a connection broken by a database restart: a fresh one next round)
            next_look[0] = 0.0
            if not down:
                down.append(time.monotonic())
                logger.error("outbox relay (%s): the database is unreachable (%s: %s); its rows wait, the other "
                             "databases' are relayed; trying again every %gs", alias, type(exc).__name__,
                             str(exc).strip(), self.idle)
            return 0
        except DatabaseError:
            connections[alias].close()
            raise
        if down:
            logger.warning("outbox relay (%s): the database is back after %.1fs", alias, time.monotonic() - down.pop())
        return taken

    def _warn_when_late(self, alias: str) -> None:
        count, oldest, _newest = waiting(alias)
        age = self.clock() - oldest if oldest is not None else 0.0
        if age > WAIT_WARNING:
            logger.warning("outbox of database %r: %d job(s) waiting, the oldest for %.0fs (is Redis reachable?)",
                           alias, count, age)


def waiting(alias: str) -> tuple[int, float | None, float | None]:
    """How many jobs wait in ``alias``'s outbox (as their rows count them), and when the oldest and
    the newest row were written (None: none)."""
    found = OutboxJob.objects.using(alias).aggregate(count=Sum("jobs"), oldest=Min("created"), newest=Max("created"))
    return found["count"] or 0, found["oldest"], found["newest"]
