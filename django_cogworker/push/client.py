"""Push jobs into Redis: one, in bulk, now or scheduled, through the client middleware.

A Client is built once per process from the config (``runtime.get_client()``)
and is thread-safe (redis-py's pool). ``defer`` is injected by the Django edge:
it returns True when it has taken the push to run at transaction commit.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import redis as redis_lib
from redis.cluster import RedisCluster

from ..broker import scripts
from ..broker.cluster import stacked_commands
from ..broker.keys import for_config
from ..broker.types import RedisClient
from ..conf import Config
from ..errors import WrongTypeError, error_code
from . import payload as payloads
from . import unique
from .middleware import build_chain

logger = logging.getLogger(__name__)

Defer = Callable[[Callable[[], Any]], bool]
# Unique locks of failed pushes kept for release at most (beyond, the oldest wait for their TTL).
UNRELEASED_MAX = 1000

# The plain-Redis push (Client._push_one). PUSH lists the queue in the same command as its LPUSH,
# but the Lua call is most of what the push costs Redis (about 9 us against LPUSH's 2) and its
# seven arguments cost redis-py twice LPUSH's packing: a tenth of a perform_async. A queue that
# holds jobs was listed by the push that made its list (LPUSH answered 1), and the listing is
# pruned only of empty queues (PRUNE_QUEUES, atomically), so a push onto a backlog needs no
# SADD: once this client's last push to a queue found BACKLOG jobs or more, it sends LPUSH alone,
# and SADD after it should the LPUSH answer 1 after all (drained, maybe pruned, since). The
# script, one round trip, stays the push of a short queue: where workers keep up, LPUSH would
# answer 1 every time and its SADD cost a second round trip. Every RELIST_EVERY seconds a push
# of each queue runs the script anyway, so a listing lost otherwise (a `queues` key moved to
# quarantine, a process killed between an LPUSH and its SADD) is restored within that time.
BACKLOG = 10
RELIST_EVERY = 60.0
# Queues whose last push a client remembers; past that it forgets them all (one queue per tenant).
PUSHED_MAX = 1000


class Client:
    def __init__(self, config: Config, redis: RedisClient, *, middleware: Sequence[Callable] = (),
                 defer: Defer | None = None, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic):
        self.config = config
        self.redis = redis
        self.keys = for_config(config)
        self.monotonic = monotonic
        # Per queue: (the length this client's last push found it at, when it last saw it listed).
        # (None on a cluster: the queue and the listing are in different slots there, and every
        # push is LPUSH and SADD, pipelined.)
        self._pushed: dict[str, tuple[int, float]] | None = (
            None if self.keys.spread or isinstance(redis, RedisCluster) else {})
        self.defer = defer
        self.clock = clock
        # Bulk pushes collect what the chain lets through here (per thread: the client is shared).
        self._bulk = threading.local()
        # Without middleware the chain is the write itself: a bulk push, the only thing
        # _terminal tells apart, doesn't run the chain then (it would let every item through).
        self._chain_is_terminal = not middleware
        self._chain = build_chain(middleware, self._write if self._chain_is_terminal else self._terminal)
        # Unique locks of failed pushes that Redis couldn't release then (see _release_unique).
        self._unreleased: collections.deque[dict[str, Any]] = collections.deque(maxlen=UNRELEASED_MAX)

    def push(self, payload: dict[str, Any], *, at: float | None = None, on_commit: bool | None = None) -> str | None:
        """Push one payload (already checked); return its jid, or None if a middleware stopped it.

        ``at``: epoch seconds to run at (scheduled) or None for now. Inside a
        transaction the push waits for commit (``on_commit``, default from
        ENQUEUE_ON_COMMIT); the jid is returned at once all the same.
        """
        if at is not None:
            payload["at"] = float(at)
        if on_commit is None:
            on_commit = self.config.enqueue_on_commit
        if on_commit and self.defer is not None and self.defer(lambda: self._chain(payload)):
            return payload["jid"]
        return self._chain(payload)

    def _write(self, payload: dict[str, Any]) -> str | None:
        _check_outgoing(payload)
        now = self.clock()
        if payload.get("unique_digest"):
            if self._unreleased:
                self._release_kept()
            if not unique.claim(self.redis, self.keys, payload, now, self.config.unique_lock_ttl):
                return None
        at = payload.pop("at", None)
        if at is None or at <= now:
            return self._enqueue(payload, now)
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(self.keys.schedule, {payloads.encode(payload): at})
        # Wakes the pollers for it (best-effort). (As a raw command: redis-py's cluster pipeline
        # refuses its publish method, though a PUBLISH reaches every node of a cluster.)
        pipe.execute_command("PUBLISH", self.keys.schedule_wake, repr(float(at)))
        try:
            _execute_push(pipe, self.keys.queues)
        except Exception as exc:
            self._release_unique(payload)
            if isinstance(exc, PushFailed):
                exc.reraise()
            raise
        return payload["jid"]

    def _enqueue(self, payload: dict[str, Any], now: float) -> str:
        """LPUSH one payload on its queue and see the queue listed (``_push_one``; on a cluster, where
        the two are in different slots, LPUSH and SADD pipelined)."""
        payload["enqueued_at"] = now
        queue = payload["queue"]
        key = self.keys.queue(queue)
        try:
            raw = payloads.encode(payload)
            if self._pushed is not None:
                self._push_one(self._pushed, queue, key, raw)
            elif self.keys.spread:
                self._listed(queue, _push_across_slots(self.redis, self.keys.queues, key, queue, raw))
            else:  # (a cluster client on an unspread prefix: every key in one slot, the script works)
                self._listed(queue, scripts.PUSH(self.redis, [self.keys.queues, key], [queue, raw]))
        except Exception as exc:
            self._release_unique(payload)
            if isinstance(exc, redis_lib.exceptions.ResponseError) and error_code(exc) == "WRONGTYPE":
                raise WrongTypeError(key, "list") from exc
            raise
        return payload["jid"]

    def _push_one(self, pushed: dict[str, tuple[int, float]], queue: str, key: str, raw: str) -> None:
        """LPUSH ``raw`` on a plain Redis and see ``queue`` listed: LPUSH alone onto a backlog,
        else the PUSH script (see BACKLOG). Raise only what refused the LPUSH."""
        now = self.monotonic()
        last = pushed.get(queue)
        if last is not None and last[0] >= BACKLOG and now - last[1] < RELIST_EVERY:
            length = self.redis.execute_command("LPUSH", key, raw)
            pushed[queue] = (length, last[1])
            if length == 1:  # emptied since, maybe pruned: listed as PUSH would have
                try:
                    self.redis.execute_command("SADD", self.keys.queues, queue)
                except redis_lib.RedisError as exc:  # (the job is queued: this push must not look failed)
                    self._listed(queue, str(exc))
            return
        length = scripts.PUSH(self.redis, [self.keys.queues, key], [queue, raw])
        if self._listed(queue, length):
            if len(pushed) >= PUSHED_MAX:
                pushed.clear()
            pushed[queue] = (length, now)

    def _listed(self, queue: str, pushed: Any) -> bool:
        """True if the push's answer says ``queue`` is listed; else log the listing's error (the
        job is queued all the same) and have the next push run the script again."""
        if isinstance(pushed, int):
            return True
        logger.error("pushed, but %s not updated: %s", self.keys.queues,
                     pushed.decode(errors="replace") if isinstance(pushed, bytes) else pushed)
        if self._pushed is not None:
            self._pushed.pop(queue, None)
        return False

    def _release_unique(self, payload: dict[str, Any]) -> None:
        """A write that failed after taking the unique lock: drop it (best-effort), or every
        retry of the push would be refused as a duplicate of a job that isn't there."""
        if payload.get("unique_digest"):
            try:
                unique.release(self.redis, self.keys, payload)
            except Exception as exc:
                # (Redis away: a failover, say) Kept, and released before this client's next unique
                # push: the application's retry of this push would be refused otherwise, for the
                # whole unique_for, as a duplicate of a job that was never pushed.
                logger.debug("unique lock of jid=%s not released: %s; kept to release later", payload.get("jid"), exc)
                self._unreleased.append(payload)

    def _release_kept(self) -> None:
        """Release the unique locks kept by failed pushes (each only if its jid still holds it)."""
        while self._unreleased:
            try:
                payload = self._unreleased.popleft()
            except IndexError:  # (another thread took the last one)
                return
            try:
                unique.release(self.redis, self.keys, payload)
            except Exception as exc:
                logger.debug("unique lock of jid=%s still not released: %s", payload.get("jid"), exc)
                self._unreleased.appendleft(payload)
                return

    def push_bulk(self, items: Sequence[dict[str, Any]], *, at: float | None = None,
                  on_commit: bool | None = None) -> list[str]:
        """Push many payloads in one pipelined round trip; return their jids.

        Each payload goes through the client middleware, as in Sidekiq's
        push_bulk: a middleware that stamps a tenant or drops a duplicate must
        not be bypassed by the bulk path. What it lets through is written in
        one pipeline; the jids returned are those pushed. Inside a transaction
        the push waits for commit as push does, and every jid is returned.
        """
        if on_commit is None:
            on_commit = self.config.enqueue_on_commit
        if on_commit and self.defer is not None and self.defer(lambda: self._push_bulk_now(items, at)):
            return [item["jid"] for item in items]
        return self._push_bulk_now(items, at)

    def _terminal(self, payload: dict[str, Any]) -> Any:
        """End of the middleware chain: write now, or collect for the bulk write under way."""
        batch = getattr(self._bulk, "batch", None)
        if batch is not None:
            batch.append(payload)
            return payload["jid"]
        return self._write(payload)

    def _push_bulk_now(self, items: Sequence[dict[str, Any]], at: float | None) -> list[str]:
        if at is not None:
            for item in items:
                item["at"] = float(at)
        if self._chain_is_terminal:
            return [item["jid"] for item in self._write_bulk(items)]
        previous = getattr(self._bulk, "batch", None)
        batch: list[dict[str, Any]] = []
        self._bulk.batch = batch
        try:
            for item in items:
                self._chain(item)
        finally:
            self._bulk.batch = previous
        return [item["jid"] for item in self._write_bulk(batch)]

    def _write_bulk(self, items: Sequence[dict[str, Any]]) -> Sequence[dict[str, Any]]:
        """Write ``items`` in one pipeline (unique ones first claim their locks); return those written."""
        if not items:
            return items
        for item in items:
            _check_outgoing(item)
        now = self.clock()
        if any(item.get("unique_digest") for item in items):
            if self._unreleased:
                self._release_kept()
            items = [item for item in items
                     if not item.get("unique_digest")
                     or unique.claim(self.redis, self.keys, item, now, self.config.unique_lock_ttl)]
        pipe = self.redis.pipeline(transaction=False)
        by_queue: dict[str, list[str]] = {}
        scheduled: dict[str, float] = {}
        scheduled_items: list[dict[str, Any]] = []
        by_queue_items: dict[str, list[dict[str, Any]]] = {}
        for item in items:
            at = item.pop("at", None)
            if at is not None and at > now:
                scheduled[payloads.encode(item)] = at
                scheduled_items.append(item)
            else:
                item["enqueued_at"] = now
                queued = by_queue_items.get(item["queue"])
                if queued is None:
                    queued = by_queue_items[item["queue"]] = []
                queued.append(item)
        # (Queue by queue: the jobs of one perform_bulk are copies of one payload, which
        # encode_many encodes once.)
        for queue, queued in by_queue_items.items():
            by_queue[queue] = payloads.encode_many(queued)
        # The items each command writes, so that a failed write releases its items' unique locks.
        written_by: list[Sequence[dict[str, Any]]] = []
        if scheduled:
            pipe.zadd(self.keys.schedule, scheduled)
            pipe.execute_command("PUBLISH", self.keys.schedule_wake, repr(float(min(scheduled.values()))))
            written_by += [scheduled_items, ()]
        for queue, raws in by_queue.items():
            pipe.sadd(self.keys.queues, queue)
            written_by.append(())
            queued = by_queue_items[queue]
            for start in range(0, len(raws), 1000):
                pipe.lpush(self.keys.queue(queue), *raws[start:start + 1000])
                written_by.append(queued[start:start + 1000])
        try:
            _execute_push(pipe, self.keys.queues)
        except PushFailed as exc:
            for index in exc.failed:
                for item in written_by[index]:
                    self._release_unique(item)
            exc.reraise()
        except Exception:
            for item in items:  # (no answer: as for one push, free the locks so the caller can retry)
                self._release_unique(item)
            raise
        return items


class PushFailed(Exception):
    """Commands of a push pipeline were refused: ``failed`` their indexes, ``error`` the first error,
    ``command`` the command it answered (name, key, ...)."""

    def __init__(self, failed: list[int], error: Exception, command: tuple[Any, ...]):
        super().__init__(str(error))
        self.failed = failed
        self.error = error
        self.command = command

    def reraise(self) -> NoReturn:
        """Raise the error for the caller: a WrongTypeError naming the key, else Redis's own."""
        name, key = self.command[0], self.command[1]
        if error_code(self.error) == "WRONGTYPE":
            raise WrongTypeError(key, "sorted set" if name == "ZADD" else "list") from self.error
        raise self.error from None


def _check_outgoing(payload: dict[str, Any]) -> None:
    """What the client middleware let through must still name a queue and a jid.

    A middleware that set ``queue`` to 5 had the job pushed to ``queue:5`` now but sent to dead
    when scheduled; one that set ``jid`` to None made the push look stopped though it was written.
    """
    for field in ("queue", "jid"):
        value = payload.get(field)
        if not isinstance(value, str) or not value:
            raise TypeError(f"payload {field} must be a non-empty string, got {value!r} "
                            f"(set by a client middleware?)")


def _push_across_slots(redis: Any, listing: str, key: str, queue: str, raw: str) -> Any:
    """PUSH on a cluster, where the queue (its own slot) and the listing (the home slot) can't
    share a script: LPUSH then SADD in one pipeline, one round trip per node. The job is
    queued once the LPUSH is; the listing is best-effort, as in PUSH (its error returned)."""
    pipe = redis.pipeline(transaction=False)
    pipe.lpush(key, raw)
    pipe.sadd(listing, queue)
    pushed, listed = pipe.execute(raise_on_error=False)
    if isinstance(pushed, Exception):
        raise pushed
    return str(listed) if isinstance(listed, Exception) else pushed


def _execute_push(pipe: Any, listing: str) -> None:
    """Run a push pipeline; raise PushFailed if a write was refused (not merely ``listing``'s update).

    The queues listing is best-effort: a ``queues`` key of the wrong type (until the key guard
    moves it aside) used to make a push that had gone through look failed, so the caller
    retried it and the job ran twice.
    """
    commands = stacked_commands(pipe)
    failed: list[int] = []
    first: Exception | None = None
    first_command: tuple[Any, ...] = ()
    for index, (args, result) in enumerate(zip(commands, pipe.execute(raise_on_error=False), strict=True)):
        if not isinstance(result, Exception):
            continue
        if args[0] == "SADD" and args[1] == listing:
            logger.error("pushed, but %s not updated: %s", listing, result)
            continue
        if args[0] == "PUBLISH":
            _wake_not_published(args[1], result)
            continue
        failed.append(index)
        if first is None:
            first, first_command = result, tuple(args)
    if first is not None:
        raise PushFailed(failed, first, first_command)


_wake_warned = False


def _wake_not_published(channel: str, error: Exception) -> None:
    """A scheduled push's wake-up message was refused (an ACL without the channel, say): the job is
    scheduled all the same and the pollers' timed rounds find it, later. Said once per process."""
    global _wake_warned
    if _wake_warned:
        logger.debug("scheduled, but not announced on %s: %s", channel, error)
        return
    _wake_warned = True
    logger.warning("scheduled, but not announced on %s: %s; scheduled jobs will start up to a poll "
                   "interval late (allow the channel to this Redis user)", channel, error)
