"""Push jobs into Redis: one, in bulk, now or scheduled, through the client middleware.

A Client is built once per process from the config (``runtime.get_client()``)
and is thread-safe: it asks for its Redis client at each push (``runtime.get_redis``: the pool's,
or a worker's processor thread's own connection), never keeping one thread's. ``defer`` is injected by the Django edge:
it returns True when it has taken the push to run at transaction commit.

Every write is the PUSH script (broker/scripts/push.py), one round trip however many jobs: the jobs,
their unique locks, the queues listing and a scheduled job's wake-up message, in one step, and
answered from the pushing thread's receipt when redis-py sends it again. On a cluster, one call
per slot written to, pipelined: the home slot's and each queue's (``_calls``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import redis as redis_lib

from ..broker import scripts
from ..broker.keys import for_config
from ..broker.quarantine import quarantine_key
from ..broker.types import RedisClient
from ..conf import Config
from ..errors import WrongTypeError
from ..outbox.pushing import OutboxPushes
from . import payload as payloads
from . import scope as _scope
from . import unique
from .middleware import build_chain

logger = logging.getLogger(__name__)

# (push, the payloads it pushes) -> whether it waits for a commit (runtime.defer_to_commit).
Defer = Callable[[Callable[[], Any], Sequence[dict[str, Any]]], bool]

# A job as PUSH takes it: (payload, score or None, lock key or None, jid, lock TTL, mark key or None).
Job = tuple[str, str | None, str | None, str, int, str | None]


class _Group(NamedTuple):
    """The jobs of a push with one destination: a queue's list, or the schedule (queue "")."""

    destination: str
    queue: str
    items: list[dict[str, Any]]
    jobs: list[Job]


class _Call(NamedTuple):
    """One PUSH call (one slot): its KEYS and ARGV, and its groups in the order ARGV has them."""

    keys: list[str]
    args: list[Any]
    groups: list[_Group]


class Client(OutboxPushes):
    """Pushes jobs through ``redis``: a client, or a function returning the client to push through
    now (``runtime.get_redis``), asked at each push."""

    def __init__(self, config: Config, redis: RedisClient | Callable[[], RedisClient], *,
                 middleware: Sequence[Callable] = (), defer: Defer | None = None,
                 clock: Callable[[], float] = time.time, outbox: Any = None):
        self.config = config
        # The process-wide client is shared by every thread, so it keeps no thread's connection
        # (STYLE.md 20): it asks runtime.get_redis per push, which in a worker's processor thread
        # is that thread's own. Built once on what the first pusher's get_redis returned, it had
        # every thread push over one processor thread's connection, and a command checking that
        # connection dropped it under another thread's command in flight: jobs failed with
        # "Connection closed by server" after pushing, ran again and pushed their children twice.
        self._source: Callable[[], RedisClient] | None = redis if callable(redis) else None
        self._fixed = None if callable(redis) else redis
        self.keys = for_config(config)
        self.defer = defer
        self.outbox = outbox  # (OUTBOX on: outbox/store.py's Outbox, see outbox/pushing.py; off: None)
        self.clock = clock
        # Bulk pushes collect what the chain lets through here (per thread: the client is shared).
        self._bulk = threading.local()
        # Without middleware the chain is the write itself: a bulk push, the only thing
        # _terminal tells apart, doesn't run the chain then (it would let every item through).
        self._chain_is_terminal = not middleware
        self._chain = build_chain(middleware, self._write if self._chain_is_terminal else self._terminal)
        # This client's part of its pushers' receipt keys (see _pusher).
        self._name = secrets.token_hex(6)

    @property
    def redis(self) -> RedisClient:
        """The client this thread pushes through now."""
        source = self._source
        return self._fixed if source is None else source()  # type: ignore[return-value]

    def push(self, payload: dict[str, Any], *, at: float | None = None, on_commit: bool | None = None) -> str | None:
        """Push one payload (already checked); return its jid, or None if a middleware stopped it
        or it is a unique job's duplicate.

        ``at``: epoch seconds to run at (scheduled) or None for now. Inside a
        transaction the push waits for commit (``on_commit``, default from
        ENQUEUE_ON_COMMIT); the jid is returned at once all the same.
        """
        if at is not None:
            payload["at"] = float(at)
        scope = _scope.batch.get()
        if scope is not None:
            return next(iter(self._push_in_batch(scope, [payload], lambda: [self._chain(payload)])), None)
        if on_commit is None:
            on_commit = self.config.enqueue_on_commit
        if (alias := self._outbox_alias(on_commit)) is not None:
            return next(iter(self._stash(alias, [payload])), None)
        if on_commit and self.defer is not None and self.defer(lambda: self._chain(payload), [payload]):
            return payload["jid"]
        return self._chain(payload)

    def _push_in_batch(self, scope: _scope.BatchScope, items: Sequence[dict[str, Any]],
                       push: Callable[[], list[Any]], at: float | None = None) -> list[Any]:
        """Push ``items`` as jobs of the batch whose ``jobs()`` block is open: counted by the batch
        before they are written, and no longer once a push fails or writes fewer. Not deferred to a
        commit on its own: pushed after the block's end, a job could come after the batch's
        callbacks (with OUTBOX on the whole block is: outbox/units.py)."""
        jids = scope.next_jids(len(items))
        for item, jid in zip(items, jids, strict=True):
            item["jid"] = jid
            item["bid"] = scope.bid
        if getattr(scope, "unit", None) is not None:
            return self._record_in_batch(scope, items, at)
        scope.add(jids)
        try:
            pushed = push()
        except BaseException:
            try:
                scope.remove(jids)
            except Exception as exc:
                logger.error("batch %s: jobs whose push failed could not be uncounted (%s: %s); the batch "
                             "waits for them until it expires", scope.bid, type(exc).__name__, exc)
            raise
        written = set(pushed)
        if unwritten := [jid for jid in jids if jid not in written]:
            scope.remove(unwritten)
        return pushed

    def _write(self, payload: dict[str, Any]) -> str | None:
        if self.outbox is not None:
            return payload["jid"] if self._write_or_save([payload]) else None
        jid, queue = payload.get("jid"), payload.get("queue")
        if (not self.keys.spread and "at" not in payload and not payload.get("unique_digest")
                and isinstance(queue, str) and queue and isinstance(jid, str) and jid):
            # The common push, one job for now to a lone Redis, without the general path's grouping
            # (a third of a perform_async): the PUSH call of its queue is made once per thread. Any
            # reply but "written" goes through the general path, which sends the same push again:
            # the receipt answers it with this reply, and nothing is written twice.
            payload["enqueued_at"] = self.clock()
            keys, layout = self._single_call(queue)
            if scripts.PUSH(self.redis, keys, [jid, layout, payloads.encode(payload)]) == 1:
                return jid
        return payload["jid"] if self._write_bulk([payload]) else None

    def _single_call(self, queue: str) -> tuple[list[str], str]:
        """KEYS and the layout of PUSH for one job for now to ``queue`` from this thread (cached)."""
        local = self._bulk
        calls = getattr(local, "calls", None)
        if calls is None or local.pid != os.getpid():  # (a forked child pushes under its own name)
            calls = local.calls = {}
            local.pid = os.getpid()
        call = calls.get(queue)
        if call is None:
            keys, args = scripts.push_args(self.keys.push_receipt(self._pusher()), "", self.keys.queues, "",
                                           [(self.keys.queue(queue), queue, [("", None, None, "", 0, None)])])
            call = calls[queue] = (keys, args[1])
        return call

    def push_bulk(self, items: Sequence[dict[str, Any]], *, at: float | None = None,
                  on_commit: bool | None = None) -> list[str]:
        """Push many payloads in one round trip; return their jids.

        Each payload goes through the client middleware, as in Sidekiq's
        push_bulk: a middleware that stamps a tenant or drops a duplicate must
        not be bypassed by the bulk path. What it lets through is written in
        one PUSH call (a cluster: one per slot, pipelined); the jids returned
        are those pushed. Inside a transaction the push waits for commit as
        push does, and every jid is returned.
        """
        scope = _scope.batch.get()
        if scope is not None:
            return self._push_in_batch(scope, items, lambda: self._push_bulk_now(items, at), at)
        if on_commit is None:
            on_commit = self.config.enqueue_on_commit
        if (alias := self._outbox_alias(on_commit)) is not None:
            return self._stash(alias, items, at)
        if on_commit and self.defer is not None and self.defer(lambda: self._push_bulk_now(items, at), items):
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
        return [item["jid"] for item in (self._write_bulk if self.outbox is None else self._write_or_save)(
            self._collect(items))]

    def _collect(self, items: Sequence[dict[str, Any]]) -> Sequence[dict[str, Any]]:
        """Run ``items`` through the client middleware; return what it let through (unwritten)."""
        if self._chain_is_terminal:
            return items
        previous = getattr(self._bulk, "batch", None)
        batch: list[dict[str, Any]] = []
        self._bulk.batch = batch
        try:
            for item in items:
                self._chain(item)
        finally:
            self._bulk.batch = previous
        return batch

    def _write_bulk(self, items: Sequence[dict[str, Any]], marked: bool = False) -> Sequence[dict[str, Any]]:
        """Write ``items``, each now or at its ``at``, in one round trip; return those written (not
        the duplicates of unique jobs). Raise what Redis refused, after the rest is written. ``marked``:
        outbox jobs, each written with its mark (PUSH), or not at all if it is there."""
        if not items:
            return items
        for item in items:
            payloads.check_outgoing(item)
        now = self.clock()
        scheduled: list[tuple[dict[str, Any], float, int]] = []
        by_queue: dict[str, list[tuple[dict[str, Any], int]]] = {}
        for item in items:
            unique_ttl = unique.lock_ttl(item, now, self.config.unique_lock_ttl) if item.get("unique_digest") else 0
            at = item.pop("at", None)
            if at is not None and at > now:
                scheduled.append((item, at, unique_ttl))
            elif unique_ttl and self.keys.spread:
                # On a cluster the lock (home slot) and the queue (its own slot) can't share a
                # script: a unique job for now is scheduled due now, with its lock in one step,
                # and a poller (woken by the message PUSH sends) moves it to its queue a moment
                # later. A lock taken in one call and the job pushed in another could be left
                # with no job behind it again, whatever the order or TTL of the two.
                scheduled.append((item, now, unique_ttl))
            else:
                item["enqueued_at"] = now
                by_queue.setdefault(item["queue"], []).append((item, unique_ttl))
        groups: list[_Group] = []
        if scheduled:
            raws = payloads.encode_many([item for item, _at, _ttl in scheduled])
            groups.append(self._group(self.keys.schedule, "", [item for item, _at, _ttl in scheduled], [
                (raw, repr(float(at)), ttl) for (_item, at, ttl), raw in zip(scheduled, raws, strict=True)], marked))
        for queue, queued in by_queue.items():
            # (Queue by queue: the jobs of one perform_bulk are copies of one payload, which
            # encode_many encodes once.)
            queued_items = [item for item, _ttl in queued]
            raws = payloads.encode_many(queued_items)
            groups.append(self._group(self.keys.queue(queue), queue, queued_items, [
                (raw, None, ttl) for (_item, ttl), raw in zip(queued, raws, strict=True)], marked))
        unwritten = self._push(groups)
        return [item for item in items if id(item) not in unwritten] if unwritten else items

    def _group(self, destination: str, queue: str, items: list[dict[str, Any]],
               encoded: list[tuple[str, str | None, int]], marked: bool = False) -> _Group:
        """The group of ``items`` (encoded: payload, score, lock TTL) to ``destination``; marked if ``marked``."""
        unique_key = self.keys.unique
        slot = queue if self.keys.spread and queue else None
        marks = self.keys.outbox_marks(slot)
        return _Group(destination, queue, items, [
            (raw, score, unique_key(item["unique_digest"]) if ttl else None, item["jid"], ttl,
             marks if marked else None)
            for item, (raw, score, ttl) in zip(items, encoded, strict=True)])

    def _push(self, groups: list[_Group], *, repaired: bool = False) -> set[int]:
        """Write ``groups``; return the ids of the items not written (duplicates). A lock key of the
        wrong type is quarantined and its jobs pushed again (``repaired``: they were)."""
        calls, listed = self._calls(groups)
        if len(calls) == 1 and not listed:
            replies = [scripts.PUSH(self.redis, calls[0].keys, calls[0].args)]
        else:
            replies = self._pipelined(calls, listed)
        unwritten: set[int] = set()
        again: dict[str, _Group] = {}
        failed: list[tuple[str, Any]] = []
        for call, reply in zip(calls, replies, strict=True):
            if isinstance(reply, Exception):
                failed.append(("", reply))
                unwritten.update(id(item) for group in call.groups for item in group.items)
                continue
            if reply == 1:  # (all written)
                continue
            listing_error, wake_error, *refused = reply
            if listing_error:
                logger.error("pushed, but %s not updated: %s", self.keys.queues, _text(listing_error))
            if wake_error:
                _wake_not_published(self.keys.schedule_wake, _text(wake_error))
            numbered = [(group, item, job) for group in call.groups
                        for item, job in zip(group.items, group.jobs, strict=True)]
            for number, code, detail in zip(refused[::3], refused[1::3], refused[2::3], strict=True):
                group, item, job = numbered[number - 1]
                lock, key = job[2] or "", {-2: job[2], -3: job[5]}.get(code) or ""
                unwritten.add(id(item))
                if code in (-2, -3) and not repaired:
                    quarantine_key(self.redis, self.keys, key, "string" if code == -2 else "zset",
                                   f"is no {'lock' if code == -2 else 'outbox mark'} (the wrong type)")
                    retried = again.setdefault(group.destination, _Group(group.destination, group.queue, [], []))
                    retried.items.append(item)
                    retried.jobs.append(job)
                elif code < 0:
                    failed.append((key or group.destination, _text(detail)))
                elif code == 1:
                    logger.info("outbox job jid=%s was handed to Redis before: not pushed again", item["jid"])
                else:
                    if code == 2:
                        logger.error("%s held no expiry (a lock can't hold for ever): given %ds", lock, job[4])
                    logger.info("duplicate of unique job %s not pushed: jid=%s holds the lock", item["class"],
                                _text(detail))
        if again:
            retried_ids = {id(item) for group in again.values() for item in group.items}
            unwritten -= retried_ids - self._push(list(again.values()), repaired=True)
        if failed:
            self._raise(*failed[0])
        return unwritten

    def _calls(self, groups: list[_Group]) -> tuple[list[_Call], list[str]]:
        """The PUSH calls that write ``groups``, and the queues the caller lists: one call, or on a
        cluster one per slot (the home slot's for the schedule, each queue's for its list), the
        queues listed beside them (the listing is in the home slot)."""
        pusher = self._pusher()
        if not self.keys.spread:
            return [self._call(self.keys.push_receipt(pusher), self.keys.queues, groups)], []
        return ([self._call(self.keys.push_receipt(pusher, group.queue or None), None, [group]) for group in groups],
                [group.queue for group in groups if group.queue])

    def _call(self, receipt: str, queues: str | None, groups: list[_Group]) -> _Call:
        jids = [job[3] for group in groups for job in group.jobs]
        # (What tells this push from the pusher's last one: a retry of it sends the same.)
        token = jids[0] if len(jids) == 1 else hashlib.sha1("\n".join(jids).encode()).hexdigest()
        if any(job[5] for group in groups for job in group.jobs):
            # Outbox jobs: a jid may come again in another call (a second row holding it), which
            # the receipt took for a retry of the last and answered "written": the row was deleted,
            # its job never pushed, nothing said. Their marks make such a push write nothing
            # twice, and say so; the receipt answers only redis-py's resending of this very call.
            token += ":" + secrets.token_hex(6)
        wake = self.keys.schedule_wake if any(not group.queue for group in groups) else ""
        keys, args = scripts.push_args(receipt, token, queues, wake,
                                       [(group.destination, group.queue, group.jobs) for group in groups])
        return _Call(keys, args, groups)

    def _pusher(self) -> str:
        """Who pushes, for the receipt: this client, in this process and thread. A thread pushes one
        thing at a time, so its receipt holds its last push: what a retry of it would find (a
        process forked from one that pushed keeps the client's name, not the pid)."""
        return f"{self._name}:{os.getpid()}:{threading.get_ident()}"

    def _pipelined(self, calls: Sequence[_Call], listed: Sequence[str]) -> list[Any]:
        """Run ``calls`` in one pipeline (a cluster: a round trip per node), with the listing of
        ``listed`` beside them (best-effort, in another slot); return their replies or errors."""
        pipe = self.redis.pipeline(transaction=False)
        for call in calls:
            pipe.execute_command("EVALSHA", scripts.PUSH.sha, len(call.keys), *call.keys, *call.args)
        if listed:
            pipe.execute_command("SADD", self.keys.queues, *listed)
        replies = pipe.execute(raise_on_error=False)
        if listed and isinstance(replies[-1], Exception):
            logger.error("pushed, but %s not updated: %s", self.keys.queues, replies[-1])
        return [scripts.PUSH(self.redis, call.keys, call.args)  # (not run: sent again with its source)
                if isinstance(reply, redis_lib.exceptions.NoScriptError) else reply
                for call, reply in zip(calls, replies, strict=False)]

    def _raise(self, key: str, error: Any) -> None:
        """Raise what refused a write: a WrongTypeError naming ``key``, else Redis's own error."""
        if isinstance(error, Exception):
            raise error
        cause = redis_lib.exceptions.ResponseError(error)
        if error.startswith("WRONGTYPE"):
            kind = "sorted set" if key == self.keys.schedule else "string" if key.startswith(
                self.keys.unique("")) else "sorted set" if key.endswith("outbox_marks") else "list"
            raise WrongTypeError(key, kind) from cause
        raise cause


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


_wake_warned = False


def _wake_not_published(channel: str, error: object) -> None:
    """A scheduled push's wake-up message was refused (an ACL without the channel, say): the job is
    scheduled all the same and the pollers' timed rounds find it, later. Said once per process."""
    global _wake_warned
    if _wake_warned:
        logger.debug("scheduled, but not announced on %s: %s", channel, error)
        return
    _wake_warned = True
    logger.warning("scheduled, but not announced on %s: %s; scheduled jobs will start up to a poll "
                   "interval late (allow the channel to this Redis user)", channel, error)
