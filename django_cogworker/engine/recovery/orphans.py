"""Orphan recovery: requeue the in-progress lists of processes that died.

Run by every live process's poller thread (``check``), continuously, not only at startup. A
process is dead to the others when its last beat (Redis's clock) is older than ORPHAN_THRESHOLD,
or when it has had no last beat and no process hash for ORPHAN_THRESHOLD, counted from when this
process first saw it so. Its list is requeued one atomic script per batch; each job's
``orphan_count`` goes up: a job is requeued at most MAX_ORPHANINGS times, and at the orphaning
after that it goes to dead with the reason instead (recorded in ``repeat_orphans``): a job that
kills its process every time must not take the fleet down forever. An entry that can't be written
back (a lone surrogate, a number too big for JSON) goes to dead with the reason; the rest of the
list is requeued. An NX lock per dead identity keeps two live processes from recovering the same
list at once, and every move re-checks that the job is still there, so nothing is requeued twice.
Under the lock the beat is read again: a process that woke meanwhile keeps its list.

On a cluster a process has one list per queue, each in its queue's slot (broker/keys/): each list
goes back to its own queue in one script; one sent to dead crosses to the home slot in two
steps (crossings.py), and the identity is forgotten once every list of it has been seen empty.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any, cast

import redis as redis_lib

from ... import declarations
from ...broker import crossings, locks, scripts
from ...broker.cluster import scan_page
from ...broker.keys import Keys
from ...broker.types import RedisClient
from ...conf import Config
from ...errors import is_unavailable
from ...push import payload as payloads
from ...push import unique
from ..loops import redis_time
from ..settle.retry import RetryPolicy
from .registry import beats_again, parse_beats, readable

logger = logging.getLogger(__name__)

BATCH = 100
# Lists missing from the registry are looked for every DISCOVER_INTERVAL seconds, with at most
# DISCOVER_CALLS SCAN calls of SCAN_COUNT keys each: a keyspace of millions is covered over a
# few rounds, the cursor kept between them, never in one burst.
DISCOVER_INTERVAL = 60.0
DISCOVER_CALLS = 50
SCAN_COUNT = 1000


def steady_grace(config: Config) -> float:
    """How long this process's own beats must have gone through before it judges others'
    silence: once Redis serves again, a live process beats within about two intervals (its
    heartbeat backs off no longer than one), plus a second for connecting."""
    return 3 * config.heartbeat_interval + 1.0


class OrphanRecovery:
    """Judge which other processes are dead, and requeue their in-progress lists.

    Created by the Launcher (``steady_since``: the heartbeat's record of this
    process's own beats); ``check`` runs on the poller's thread
    (cogworker-poller), in each timed round of its housekeeping. No thread of
    its own, nothing to start or stop; ``settled`` and ``deferred_for`` tell
    the poller, after each check, whether the ticker may start and when to
    come back.
    """

    def __init__(self, config: Config, redis: RedisClient, keys: Keys, identity: str, retry: RetryPolicy,
                 steady_since: Callable[[float], float | None] = lambda now: -math.inf):
        self.config = config
        self.redis = redis
        self.keys = keys
        self.identity = identity
        self.retry = retry
        # Given Redis's time now: since when this process's own beats have gone through on time
        # (None: they fail, or are late, now).
        self.steady_since = steady_since
        # Seconds until a verdict put off only for the grace can be given (the poller comes back then).
        self.deferred_for: float | None = None
        self.settled = False  # see check()
        # identity -> Redis's time when this process first saw it with neither a last beat nor a
        # process hash. That alone is no verdict: the stamp can be lost (quarantined, a failover)
        # while the process lives, stalled a minute; judged at once, its running jobs ran twice.
        self._beatless_since: dict[str, float] = {}
        self._scan_cursor: Any = 0  # (a dict of node -> cursor on a cluster)
        # identity -> queues whose in-progress list of it discovery found (a cluster: one list per
        # queue), each named as in ``queues``: bytes, which may not be UTF-8
        self._found_queues: dict[str, set[bytes]] = {}
        self._next_discovery = 0.0  # (monotonic) the first check looks at once
        self._unreadable: set[bytes] = set()  # identities not UTF-8, logged once each

    def check(self) -> int:
        """Recover every orphaned list found now; return how many jobs were handled.

        ``settled`` tells afterwards whether the check left no dead process's
        list being recovered by another process at the same time: until one
        has, the periodic ticker must not start (a process starting beside
        the one recovering an interrupted ``until_executed`` run could
        otherwise fire its next slot before the run's lock is taken again).
        """
        self.settled = False
        r, k = self.redis, self.keys
        now = redis_time(r)
        try:
            # (an identity not UTF-8 is none a process took: skipped, said once; it failed every
            # check, and no dead process's jobs were recovered any more, anywhere)
            identities = {name for name in (readable(m, k.in_progress_identities, self._unreadable)
                                            for m in r.smembers(k.in_progress_identities)) if name is not None}
            identities |= self._discover(identities)
            beats = parse_beats(cast(dict[bytes, bytes], r.hgetall(k.last_beat)))  # (a bytes client)
        except redis_lib.exceptions.ResponseError as exc:
            if is_unavailable(exc):
                raise
            # A registry of the wrong type: no information, so no verdicts this
            # round (the key guard moves it aside).
            logger.error("orphan check skipped: %s", exc)
            return 0
        handled = 0
        settled = True
        since = self.steady_since(now)
        steady = since is not None and now - since >= steady_grace(self.config)
        self.deferred_for = None
        others = identities - {self.identity}
        for gone in self._beatless_since.keys() - others:
            del self._beatless_since[gone]
        for identity in sorted(others):
            beat = beats.get(identity)
            if beat is not None:
                self._beatless_since.pop(identity, None)
                if now - beat < self.config.orphan_threshold:
                    continue
            elif r.exists(k.process(identity)):
                self._beatless_since.pop(identity, None)
                continue  # alive, its stamp just not written (yet)
            else:
                first_seen = self._beatless_since.setdefault(identity, now)
                if now - first_seen < self.config.orphan_threshold:
                    continue
            if not steady:
                # Everyone's beats are stale after Redis was away, out of memory or read-only
                # for longer than ORPHAN_THRESHOLD: judged now, live processes would have their
                # running jobs requeued and run twice. Judged once this process's own beats have
                # gone through long enough for every live process to have beaten again.
                settled = False
                if since is not None:
                    self.deferred_for = max(since + steady_grace(self.config) - now, 0.0)
                continue
            try:
                silent_for = now - (self._beatless_since[identity] if beat is None else beat)
                recovered = self.recover(identity, silent_for, beat is None)
                if recovered is None:
                    settled = False  # another process is recovering it now
                else:
                    handled += recovered
                    self._beatless_since.pop(identity, None)
            except redis_lib.exceptions.ResponseError as exc:
                if is_unavailable(exc):
                    raise  # (Redis refusing writes: no list can be recovered; the round fails)
                # One list that can't be recovered now (a key of the wrong type:
                # the key guard moves it aside) must not hold up the others'.
                logger.error("recovering %s failed, retried next round: %s", identity, exc)
        self.settled = settled
        return handled

    def _discover(self, listed: set[str]) -> set[str]:
        """In-progress lists whose identity the registry doesn't list, listed again.

        The registry can lose a member: quarantined for holding the wrong type,
        lost in a failover, or never written (the beat's SADD is best-effort).
        Such a list was never recovered. A slice of the keyspace is SCANned each
        DISCOVER_INTERVAL; what it finds is judged like any other identity.
        """
        if time.monotonic() < self._next_discovery:
            return set()
        self._next_discovery = time.monotonic() + DISCOVER_INTERVAL
        found: set[str] = set()
        for _ in range(DISCOVER_CALLS):
            self._scan_cursor, names = scan_page(self.redis, self._scan_cursor, self.keys.in_progress_match,
                                                 SCAN_COUNT)
            for name in names:
                identity, queue = self.keys.in_progress_parts(name)  # (any queue name: bytes, exact)
                try:
                    identity.encode()
                except UnicodeEncodeError:  # (it couldn't be registered, nor its beat read)
                    logger.warning("in-progress list %r names a process that isn't UTF-8: not one of ours, "
                                   "left alone", name)
                    continue
                found.add(identity)
                if queue is not None:
                    self._found_queues.setdefault(identity, set()).add(queue)
            if not self._scan_cursor:
                break
        unlisted = found - listed - {self.identity}
        if unlisted:
            self.redis.sadd(self.keys.in_progress_identities, *unlisted)
            logger.warning("in-progress list(s) of %s missing from %s: listed again", ", ".join(sorted(unlisted)),
                           self.keys.in_progress_identities)
        return unlisted

    def recover(self, identity: str, silent_for: float, beatless: bool = False) -> int | None:
        """Requeue the list of dead process ``identity``; return how many jobs were handled, or
        None when another process holds its recovery lock.

        ``silent_for``: seconds since its last beat (``beatless``: since this process first saw
        it with no beat and no process hash), for the log."""
        r, k = self.redis, self.keys
        lock_ttl = max(int(self.config.orphan_threshold), 60)
        lock = k.orphan_lock(identity)
        if not locks.take(r, k, lock, self.identity, lock_ttl)[0]:
            return None
        handled = 0
        try:
            if beats_again(r, k, identity, self.config.orphan_threshold):
                return 0  # (it woke, and may start what it holds: fetch/stall.py)
            sources = self._lists_of(identity)
            lengths = self._lengths([source for source, _queue in sources]) if k.spread else [1]
            for (source, queue), length in zip(sources, lengths, strict=True):
                if length:  # (a cluster: only the lists that hold something, found in one pipeline)
                    handled += self._recover_list(identity, source, queue)
            if not k.spread:
                scripts.FORGET_IDENTITY(r, [sources[0][0], k.in_progress_identities, k.last_beat, lock], [identity])
            elif not any(self._lengths([source for source, _queue in sources])):
                # (the lists are in their queues' slots: seen empty, then the registry forgets)
                scripts.FORGET_IDENTITY(r, [k.in_progress_identities, k.last_beat, lock], [identity])
                self._found_queues.pop(identity, None)
        finally:
            # Only while it is ours: had it expired mid-recovery, it may be another's now.
            locks.release(r, lock, self.identity)
        if handled:
            since = f"no beat seen for {silent_for:.0f}s" if beatless else f"last beat {silent_for:.0f}s ago"
            logger.warning("recovered %d job(s) from dead process %s (%s)", handled, identity, since)
        return handled

    def _lists_of(self, identity: str) -> list[tuple[str | bytes, bytes | None]]:
        """The in-progress lists of ``identity``, with their queue (None without a cluster).

        On a cluster, one per queue it may have fetched from: every queue listed (``queues``,
        ``paused_queues``), this process's, and those discovery found a list of it for (a
        queue whose name the listing lost). Queues are named by their bytes as stored: read as
        text, a name that isn't UTF-8 became another (U+FFFD), whose list is always empty, and
        the identity was forgotten with its real list still full.
        """
        k = self.keys
        if not k.spread:
            return [(k.in_progress(identity), None)]
        queues = {q.encode() for q in self.config.queue_names} | self._found_queues.get(identity, set())
        for listing in (k.queues, k.paused_queues):
            queues |= set(cast(set[bytes], self.redis.smembers(listing)))  # (a bytes client)
        return [(k.in_progress_member_key(identity, q), q) for q in sorted(queues)]

    def _lengths(self, sources: list[str | bytes]) -> list[int]:
        pipe = self.redis.pipeline(transaction=False)
        for source in sources:
            pipe.llen(source)
        return [int(n) for n in pipe.execute()]

    def _recover_list(self, identity: str, source: str | bytes, queue: bytes | None) -> int:
        """Recover one list, BATCH at a time; return how many jobs were handled."""
        r = self.redis
        handled = 0
        left = 0  # entries that stay on the list (their queue can't be pushed to): read past them
        while True:
            batch = r.lrange(source, left, left + BATCH - 1)
            if not batch:
                break
            before = r.llen(source)
            handled += self._recover_batch(identity, source, cast(list[bytes], batch), queue)
            left += len(batch) - (before - r.llen(source))
            if len(batch) < BATCH:
                break
        if left:
            logger.error("%d job(s) left on %s: their queue can't be pushed to (a key of the wrong type?); "
                         "retried next round", left, source)
        return handled

    def _recover_batch(self, identity: str, source: str | bytes, batch: list[bytes], home: bytes | None = None) -> int:
        """``home``: on a cluster, the list's queue (as stored in ``queues``), where its jobs go back
        (the one slot), whatever queue their payloads name."""
        k = self.keys
        drops: list[bytes] = []  # discarded (dead=False): just dropped from the list
        moves: list[tuple[bytes, str, str, str]] = []  # (raw, payload to push, queue key, queue)
        handled = 0
        discarded: list[dict] = []
        below, cap = self.retry.dead_trim()
        for raw in batch:
            try:
                payload = payloads.decode(raw)
            except payloads.PayloadError as exc:
                dead = payloads.dead_letter(raw, f"orphaned, and {exc}", time.time())
                handled += self._to_dead(source, raw, dead, below, cap)
                continue
            count = payload.get("orphan_count")
            payload["orphan_count"] = (count if isinstance(count, int) else 0) + 1
            payload["orphaned_from"] = identity
            if payload["orphan_count"] > self.config.max_orphanings:
                # Requeued MAX_ORPHANINGS times already (the seed: "at most max_orphanings times").
                reason = (f"orphaned {payload['orphan_count']} times (its process died while running it "
                          f"each time; MAX_ORPHANINGS is {self.config.max_orphanings})")
                payload["error_class"] = "Orphaned"
                payload["error_message"] = reason
                filing = self.retry.exhausted(payload, None, reason)
                if filing is not None:
                    stored: str | bytes | None = _writable(filing.payload)
                    if stored is None:
                        stored = _as_stored(raw, filing.payload, reason)
                    handled += self._to_dead(source, raw, filing.payload, below, cap, stored)
                    self._release_locks(payload)
                else:
                    drops.append(raw)
                    discarded.append(payload)
                continue
            named = payload.get("queue")
            queue = named if isinstance(named, str) else "default"
            # (with a home, that list's own queue is where it goes: the payload's isn't sent)
            new_raw = _writable(payload, queue if home is None else "")
            if new_raw is None:
                # Read, but can't be written back (1e309 reads as inf; a queue name Redis can't be
                # sent): requeued with the others, it failed the whole batch's script, every
                # round, and no job of the list ever came back.
                reason = "orphaned, and its payload can't be written back (a number JSON can't hold, or a queue " \
                         "name that isn't UTF-8)"
                handled += self._to_dead(source, raw, payload, below, cap, _as_stored(raw, payload, reason))
                self._release_locks(payload)
                continue
            moves.append((raw, new_raw, k.queue(queue), queue))
        if (drops or moves) and home is not None:
            handled += crossings.requeue_in_slot(self.redis, k, source, home, drops,
                                                 [(raw, new_raw) for raw, new_raw, _key, _queue in moves])
        elif drops or moves:
            # (no cluster: the one list of the identity, named by text)
            args = scripts.requeue_args(cast(str, source), k.queues, drops, moves)
            handled += int(scripts.REQUEUE(self.redis, *args))
            for _raw, new_raw, _key, _queue in moves:
                locks.retake_running(self.redis, self.keys, payloads.decode(new_raw))
        for payload in discarded:  # (won't run again, not dead: told as a deleted job is, a follow-up written)
            self._release_locks(payload)
            declarations.removed(self.redis, self.keys, payload)
        return handled

    def _release_locks(self, payload: dict) -> None:
        """A job that won't run again frees its unique and periodic locks now, not at their TTL.

        Best effort: the job has left the list already; a lock that can't be
        released (logged) still expires.
        """
        try:
            unique.release_at(self.redis, self.keys, payload, "dead")
            locks.release_running(self.redis, self.keys, payload)
        except redis_lib.exceptions.ResponseError as exc:
            logger.error("could not release the locks of jid=%s: %s (they expire)",
                         payloads.printable(payload.get("jid")), exc)

    def _to_dead(self, source: str | bytes, raw: bytes, payload: dict, below: float, cap: int,
                 stored: str | bytes | None = None) -> int:
        """Move ``raw`` to dead as ``payload`` (or as ``stored``, its text already made), recorded
        in ``repeat_orphans``."""
        record = payloads.encode({"jid": payloads.safe_string(payload.get("jid"), 200),
                                  "class": payloads.safe_string(payload.get("class"), 200),
                                  "orphan_count": payload.get("orphan_count"), "at": time.time(),
                                  "from": payload.get("orphaned_from")})
        logger.error("jid=%s class=%s: %s; moved to dead", payloads.printable(payload.get("jid")),
                     payloads.printable(payload.get("class")),
                     payloads.printable(payload.get("dead_reason") or payload.get("error_message")))
        dead = payloads.encode(payload) if stored is None else stored
        declarations.died(self.redis, self.keys, payload, "Orphaned", "orphaned too many times", self.config.batch_ttl)
        if self.keys.spread:
            # Dead (home slot) first, then off the list (its queue's slot): under the orphan lock,
            # a crash between the two leaves it on the list, to be judged again. The record is best-effort.
            if self.redis.lpos(source, raw) is None:  # type: ignore[arg-type]
                return 0
            pipe = self.redis.pipeline(transaction=False)
            pipe.lpush(self.keys.repeat_orphans, record)
            pipe.ltrim(self.keys.repeat_orphans, 0, 999)
            pipe.execute(raise_on_error=False)
            crossings.file_from_list(self.redis, source, self.keys.dead, raw, time.time(), dead, below, cap)
            return 1
        return int(scripts.ORPHAN_TO_DEAD(self.redis, [source, self.keys.dead, self.keys.repeat_orphans],
                                          [raw, time.time(), dead, record, below, cap]))


def _writable(payload: dict, queue: str = "") -> str | None:
    """The payload's JSON if Redis can be sent it (finite numbers, a UTF-8 queue name), else None."""
    try:
        queue.encode()
        return payloads.encode(payload)
    except (ValueError, RecursionError):  # (UnicodeEncodeError is a ValueError)
        return None


def _as_stored(raw: bytes, payload: dict, reason: str) -> bytes:
    """The dead entry of a payload that reads but can't be written back: its bytes as stored,
    with what dead entries say appended (later keys win in every JSON reader)."""
    return payloads.append_fields(raw, {
        "error_class": "Orphaned" if payload.get("error_class") == "Orphaned" else "PayloadError",
        "error_message": reason, "dead_reason": reason, "failed_at": time.time(),
        "orphan_count": payload.get("orphan_count"), "orphaned_from": payload.get("orphaned_from")})
