"""The periodic ticker: every process ticks, each slot runs once fleet-wide.

Created by the Launcher when entries exist; ``start`` publishes the schedule
(for the admin; again every PUBLISH_INTERVAL) and starts the thread, which
first waits for ``ready`` (the poller's first orphan check that really
completed: after the whole fleet was down, an interrupted ``until_executed``
run must be requeued, and its lock retaken, before its next slot can fire),
then ticks every PERIODIC_TICK_INTERVAL until ``stop``.

A tick, per entry: the latest due slot (and with catch-up, the missed ones
since ``last_slot``, bounded) is claimed in one script (per-slot NX lock plus
``last_slot``, plus the running lock for ``until_executed``) and pushed. A push
that fails rolls the claim back in one script; a rollback that fails is kept
and retried before that entry's slot is looked at again. One entry failing
never stops the others: it backs off 5 s, 10 s, 20 s... up to 300 s, reset by a
success. Redis unavailable (away, or refusing writes: a replica, OOM) is not
the entry failing: it backs nothing off, so the first slot after it runs at
the next tick, and it is logged once when it starts and once when a tick gets
through again, with its length.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import redis as redis_lib

from ...broker.keys import Keys
from ...broker.locks import hold_queued, release_running
from ...broker.types import RedisClient
from ...errors import is_unavailable
from ...push import payload as payloads
from ...push.job import JobSetter, registered
from ...push.periodic import Entry
from ..loops import LoopThread, Watchdog
from .periodic_claims import CLAIM_TTL, ROLLBACK, claim_slot

logger = logging.getLogger(__name__)

BACKOFF_MAX = 300.0
# Seconds between two publications of this process's entries to ``periodic:schedule`` (for the admin).
PUBLISH_INTERVAL = 60.0


class Ticker(LoopThread):
    """Claim and push the due slots of this process's periodic entries, on thread cogworker-ticker.

    Created by the Launcher only when entries exist. ``start`` publishes the
    schedule (for the admin) and starts the thread, which waits for ``ready``
    (the poller's first settled orphan check), then calls ``tick`` every
    ``tick_interval`` under a :class:`Watchdog`. ``stop`` sets the stop event
    and joins the thread (up to 5 s); a tick under way finishes its entry.
    Tests call ``tick(now=...)`` directly, without the thread.
    """

    def __init__(self, redis: RedisClient, keys: Keys, entries: Sequence[Entry], push: Callable[[dict], Any], *,
                 ready: Callable[[], bool], catch_up: bool, catch_up_max: int, tick_interval: float = 5.0,
                 publish_interval: float = PUBLISH_INTERVAL, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic, claim_ttl: int = CLAIM_TTL):
        self.redis = redis
        self.keys = keys
        self.entries = list(entries)
        self.push = push
        self.ready = ready
        self.catch_up = catch_up
        self.catch_up_max = catch_up_max
        self.tick_interval = tick_interval
        self.claim_ttl = claim_ttl
        self.publish_interval = publish_interval
        self._next_publish = -float("inf")
        self.clock = clock
        self.monotonic = monotonic
        self._init_thread("cogworker-ticker")
        self._last_checked: dict[str, int] = {}
        self._pending_rollbacks: list[tuple[Entry, int, str, str]] = []
        # (pjid, jid) of until_executed runs pushed whose lock couldn't be extended to QUEUED_TTL yet.
        self._pending_holds: list[tuple[str, str]] = []
        self._failures: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}
        # pjid -> the latest slot seen due while the entry was disabled: catch-up
        # never goes back past it, so re-enabling doesn't burst.
        self._disabled_through: dict[str, int] = {}
        # Since a tick was refused for Redis being unavailable (monotonic); None: not refused.
        self._outage_since: float | None = None
        # Since the last _note_availability: the first refusal, and whether anything got through.
        self._refused: BaseException | None = None
        self._served = False

    def start(self) -> None:
        self._publish_if_due()
        self._note_availability()
        super().start()

    def _publish_if_due(self) -> None:
        """Publish the schedule at start and every PUBLISH_INTERVAL after.

        Publishing is only for the admin: its failure (Redis down at boot, the
        key holding the wrong type) is logged, never fatal, and tried again at
        the next interval. Publishing again keeps ``published_at`` fresh, which
        tells the admin which entries no live process declares any more.
        """
        if self.monotonic() < self._next_publish:
            return
        self._next_publish = self.monotonic() + self.publish_interval
        try:
            self.publish_schedule()
        except Exception as exc:
            if not self._unavailable(exc):
                logger.error("periodic schedule not published: %s: %s", type(exc).__name__, exc)
        else:
            self._served = True

    def publish_schedule(self) -> None:
        if not self.entries:
            return
        published_at = time.time()  # (the wall clock, for the admin, even under an injected clock)
        self.redis.hset(self.keys.periodic_schedule, mapping={e.pjid: json.dumps({
            "cron": e.cron, "job": e.job, "queue": e.queue, "tz": e.tz, "args": list(e.args),
            "kwargs": dict(e.kwargs), "until_executed": e.until_executed, "published_at": published_at})
            for e in self.entries})

    def _run(self) -> None:
        while not self.ready():
            if self.stop_event.wait(0.1):
                return
        # tick() handles an entry's failures and Redis outages itself (per entry, logged once);
        # the watchdog catches what escapes it (a bug), logs it and backs off before the next tick.
        watchdog = Watchdog("periodic ticker", self.stop_event)
        while not self.stop_event.is_set():
            watchdog.run_step(self.tick)
            self.stop_event.wait(self.tick_interval)

    def tick(self, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        self._publish_if_due()
        self.retry_pending_rollbacks()
        self.retry_pending_holds()
        pending = {e.pjid for e, *_ in self._pending_rollbacks}
        for entry in self.entries:
            if entry.pjid in pending or self._backing_off(entry.pjid):
                continue
            try:
                self._served |= self.tick_entry(entry, now)
                self._failures.pop(entry.pjid, None)
                self._retry_at.pop(entry.pjid, None)
            except Exception as exc:
                # Per entry: one failing entry used to skip every entry after it.
                if self._unavailable(exc):
                    continue
                delay = self._back_off(entry.pjid)
                logger.error("periodic tick failed for %s (next try in %.0fs): %s: %s", entry.pjid, delay,
                             type(exc).__name__, exc)
        self._note_availability()

    def _unavailable(self, exc: BaseException) -> bool:
        """Note ``exc`` if it is Redis being unavailable (not the entry's fault: nothing backs off)."""
        if not is_unavailable(exc):
            return False
        self._refused = self._refused or exc
        return True

    def _note_availability(self) -> None:
        """Log an outage once when a tick is first refused, and once when one gets through again.

        A line per entry per tick flooded the log. "Through" is a tick that
        asked Redis and was refused nothing: under READONLY, reading a disabled
        entry still works while the others' claims are refused.
        """
        refused, served = self._refused, self._served
        self._refused, self._served = None, False
        if refused is not None:
            if self._outage_since is None:
                self._outage_since = self.monotonic()
                logger.warning("periodic ticker: Redis is unavailable (%s: %s); slots wait for it, "
                               "nothing backed off", type(refused).__name__, refused)
        elif served and self._outage_since is not None:
            logger.warning("periodic ticker: Redis is back after %.1fs", self.monotonic() - self._outage_since)
            self._outage_since = None

    def tick_entry(self, entry: Entry, now: float) -> bool:
        """Claim and push what is due of ``entry``; return whether Redis was asked (not: seen already)."""
        slot = entry.latest_slot(now)
        if self._last_checked.get(entry.pjid) == slot:
            return False
        if self.disabled(entry):
            self._disabled_through[entry.pjid] = slot
        else:
            for candidate in self._candidates(entry, slot, now):
                jid = payloads.new_jid()
                claimed, previous = claim_slot(self.redis, self.keys, entry, candidate, jid, self.claim_ttl)
                if claimed:
                    self.enqueue(entry, candidate, jid, previous)
        self._last_checked[entry.pjid] = slot
        return True

    def _candidates(self, entry: Entry, slot: int, now: float) -> list[int]:
        raw, floor = self._read_state(entry)
        if raw is None:
            # First sight of this entry: prime last_slot to the slot now due
            # instead of running it (a new "0 3 * * *" deployed at 14:00 must
            # not run at 14:00). It first runs at its next slot.
            self.redis.set(self.keys.periodic_last_slot(entry.pjid), slot, nx=True)
            return []
        try:
            last = int(raw)
        except ValueError:
            # Not a slot (a manual write): it failed every tick of the entry for good. Taken
            # as no record: the slot due now runs (the claim writes a good last_slot), no catch-up.
            logger.error("%s holds %r, not a slot: taken as none", self.keys.periodic_last_slot(entry.pjid), raw)
            return [slot] if slot > floor else []
        if slot <= last or slot <= floor:
            return []
        catch_up = self.catch_up if entry.catch_up is None else entry.catch_up
        # Slots that fell due while it was disabled aren't "missed": re-enabling doesn't burst.
        # (floor is a whole number or -inf, and last an int: the max is a whole number)
        slots = entry.slots_after(int(max(last, floor)), now, self.catch_up_max) if catch_up else [slot]
        # Daylight saving: when clocks go back, one wall-clock time comes twice;
        # cron names it once, so it runs once (also when catch-up spans both).
        seen = {entry.wall_clock(last)}
        candidates = []
        for s in slots:
            wall = entry.wall_clock(s)
            if wall not in seen:
                seen.add(wall)
                candidates.append(s)
        return candidates

    def _read_state(self, entry: Entry) -> tuple[bytes | None, float]:
        """Return ``last_slot`` as stored, and the floor: the latest slot that fell due while the
        entry was disabled, as this process saw it or as ``periodic:enabled_at`` records it (a
        process started while it was disabled never saw it so: it caught up every skipped slot).
        -inf when neither says; an unreadable record (logged) says nothing."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(self.keys.periodic_last_slot(entry.pjid))
        pipe.hget(self.keys.periodic_enabled_at, entry.pjid)
        raw, enabled_at = pipe.execute(raise_on_error=False)
        if isinstance(raw, Exception):
            raise raw
        floor = float(self._disabled_through.get(entry.pjid, -math.inf))
        if isinstance(enabled_at, Exception):
            if is_unavailable(enabled_at):
                raise enabled_at
            logger.error("can't read %s (%s): slots of %s skipped while disabled may be caught up",
                         self.keys.periodic_enabled_at, enabled_at, entry.pjid)
        elif enabled_at is not None:
            try:
                floor = max(floor, entry.latest_slot(float(enabled_at)))
            except (ValueError, OverflowError, OSError):
                logger.error("%s holds %r for %s, not a time: ignored", self.keys.periodic_enabled_at,
                             enabled_at, entry.pjid)
        return raw, floor

    def disabled(self, entry: Entry) -> bool:
        """Switched off from the admin? An unreadable set counts as "not disabled", logged.

        Skipping before the claim means neither ``last_slot`` nor the slot lock
        advance while disabled, so re-enabling doesn't burst.
        """
        try:
            return bool(self.redis.sismember(self.keys.periodic_disabled, entry.pjid))
        except redis_lib.exceptions.ResponseError as exc:
            if is_unavailable(exc):  # (MASTERDOWN refuses reads too) not the set's fault
                raise
            logger.error("can't read %s (%s); treating %s as enabled", self.keys.periodic_disabled, exc, entry.pjid)
            return False

    def enqueue(self, entry: Entry, slot: int, jid: str, previous: str) -> None:
        job_class = registered(entry.job)
        options = {k: v for k, v in (("queue", entry.queue), ("retry", entry.retry)) if v is not None}
        try:
            # Built inside the try: a payload that can't be built must roll the
            # claim back too, or the slot (and an until_executed lock) is lost.
            # (job_class None, a job no longer registered, fails here too: rolled back, logged per entry)
            payload = JobSetter(job_class, options).build(  # type: ignore[arg-type]
                list(entry.args), dict(entry.kwargs))
            payload.update(jid=jid, periodic_pjid=entry.pjid, periodic_slot=slot)
            pushed = self.push(payload)
        except Exception:
            self.rollback(entry, slot, previous, jid)
            raise
        if pushed is None:
            # Stopped by a client middleware, or a unique job's duplicate: no run
            # will ever release the running lock the claim took, which would
            # skip every slot until its 24 h TTL.
            logger.info("periodic %s: slot %s not enqueued (stopped by a client middleware or a unique lock)",
                        entry.pjid, entry.slot_text(slot))
            if entry.until_executed:
                release_running(self.redis, self.keys, payload)
            return
        logger.info("periodic %s: slot %s enqueued as jid=%s", entry.pjid, entry.slot_text(slot), jid)
        if entry.until_executed:
            self._hold(entry.pjid, jid)

    def _hold(self, pjid: str, jid: str) -> None:
        """Extend the running lock of a pushed run to QUEUED_TTL; on failure keep it to retry."""
        try:
            hold_queued(self.redis, self.keys, pjid, jid)
        except Exception as exc:
            if not self._unavailable(exc):
                logger.error("periodic %s: couldn't extend the running lock of jid=%s (will retry): %s: %s", pjid,
                             jid, type(exc).__name__, exc)
            self._pending_holds.append((pjid, jid))

    def retry_pending_holds(self) -> None:
        pending, self._pending_holds = self._pending_holds, []
        for pjid, jid in pending:
            self._hold(pjid, jid)

    def rollback(self, entry: Entry, slot: int, previous: str, jid: str) -> Literal[True] | BaseException:
        """Undo a won claim whose push failed; on failure keep it to retry. Return True or the error."""
        keys = [self.keys.periodic_last_slot(entry.pjid), self.keys.periodic_lock(entry.pjid, slot),
                self.keys.periodic_running(entry.pjid)]
        try:
            ROLLBACK(self.redis, keys, [slot, previous, jid])
        except Exception as exc:
            if not self._unavailable(exc):
                logger.error("periodic %s: couldn't roll back slot %s (will retry): %s: %s", entry.pjid,
                             entry.slot_text(slot), type(exc).__name__, exc)
            self._pending_rollbacks.append((entry, slot, previous, jid))
            return exc
        self._served = True
        return True

    def retry_pending_rollbacks(self) -> None:
        pending, self._pending_rollbacks = self._pending_rollbacks, []
        for args in pending:
            key = f"rollback:{args[0].pjid}:{args[1]}"
            if self._backing_off(key):
                self._pending_rollbacks.append(args)
                continue
            result = self.rollback(*args)
            if result is True:
                self._failures.pop(key, None)
                self._retry_at.pop(key, None)
            elif not is_unavailable(result):
                self._back_off(key)  # only a rollback failing on its own backs off

    def _backing_off(self, key: str) -> bool:
        at = self._retry_at.get(key)
        return at is not None and self.monotonic() < at

    def _back_off(self, key: str) -> float:
        """5 s, 10 s, 20 s... up to BACKOFF_MAX; reset by the next success."""
        self._failures[key] = self._failures.get(key, 0) + 1
        delay = min(self.tick_interval * 2 ** (self._failures[key] - 1), BACKOFF_MAX)
        self._retry_at[key] = self.monotonic() + delay
        return delay
