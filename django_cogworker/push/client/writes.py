"""The Client's writes: what a push sends to Redis, in one round trip however many jobs.

Every write is the PUSH script (broker/scripts/push.py): the jobs, their unique locks, the queues
listing and a scheduled job's wake-up message, in one step, and answered from the pushing thread's
receipt when redis-py sends it again (``_pusher``, ``_call``). On a cluster, one call per slot
written to, pipelined: the home slot's and each queue's (``_calls``). A lock or outbox mark key of
the wrong type is quarantined and its jobs pushed again; what Redis refused is raised after the
rest is written (``_push``).

A mixin of :class:`~django_cogworker.push.client.Client`, which chooses when and what to write
(middleware, a commit, a batch, the outbox); this module only writes.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import redis as redis_lib

from ...broker import scripts
from ...broker.keys import Keys
from ...broker.quarantine import quarantine_key
from ...broker.scripts.lanes import BULK_TIE_STEP, lane_of
from ...broker.types import RedisClient
from ...conf import Config
from ...errors import WrongTypeError
from .. import payload as payloads
from .. import unique

# (A child of the client's logger: what a project's LOGGING sets for the client applies here too.)
logger = logging.getLogger(__name__)

# A job as PUSH takes it: (payload, score or None, lock key or None, jid, lock TTL, mark key or None).
Job = tuple[str, str | None, str | None, str, int, str | None]


SINGLE_CALLS_MAX = 1000  # cached single-push calls a thread keeps (one per queue and group pushed to)


class _Group(NamedTuple):
    """The jobs of a push with one destination: a queue's list, or the schedule (queue "")."""

    destination: str
    queue: str
    items: list[dict[str, Any]]
    jobs: list[Job]
    # (for a queue's prioritized jobs, written to its lane's set: the queue list and the doorbell
    # written there when it is empty, broker/scripts/lanes.py)
    lane: tuple[str, ...] | None = None


class _Call(NamedTuple):
    """One PUSH call (one slot): its KEYS and ARGV, and its groups in the order ARGV has them."""

    keys: list[str]
    args: list[Any]
    groups: list[_Group]


class PushWrites:
    """How the Client writes (see the module's docstring)."""

    # (The Client's own.)
    config: Config
    keys: Keys
    clock: Callable[[], float]
    _source: Callable[[], RedisClient] | None
    _fixed: RedisClient | None
    _bulk: threading.local  # (per thread: the calls of _single_call)
    _name: str  # this client's part of its pushers' receipt keys

    @property
    def redis(self) -> RedisClient:
        """The client this thread pushes through now."""
        source = self._source
        return self._fixed if source is None else source()  # type: ignore[return-value]

    def _thread_calls(self) -> dict[Any, Any]:
        """This thread's cached PUSH calls (KEYS and layouts) of single pushes."""
        local = self._bulk
        calls = getattr(local, "calls", None)
        if calls is None or local.pid != os.getpid():  # (a forked child pushes under its own name)
            calls = local.calls = {}
            local.pid = os.getpid()
        return calls

    def _single_call(self, queue: str) -> tuple[list[str], str]:
        """KEYS and the layout of PUSH for one job for now to ``queue`` from this thread (cached)."""
        calls = self._thread_calls()
        call = calls.get(queue)
        if call is None:
            payloads.check_outgoing({"queue": queue, "jid": "-"})  # (a name with a space: refused)
            keys, args = scripts.push_args(self.keys.push_receipt(self._pusher()), "", self.keys.queues, "",
                                           [(self.keys.queue(queue), queue, [("", None, None, "", 0, None)])])
            call = calls[queue] = (keys, args[1])
        return call

    def _single_lane_call(self, queue: str, payload: dict[str, Any], now: float) -> tuple[list[str], str]:
        """As :meth:`_single_call`, for one grouped or prioritized job (its group's list, or the
        priority set with its score; cached per queue and group, SINGLE_CALLS_MAX at most); ([], "")
        for a payload whose lane field isn't valid (the general path writes it as an ordinary job)."""
        lane = lane_of(payload)
        if lane is None:
            return [], ""
        calls = self._thread_calls()
        key = (queue, lane, payload["group"] if lane == "g" else "")
        call = calls.get(key)
        if call is None:
            payloads.check_outgoing({"queue": queue, "jid": "-"})
            if len(calls) >= SINGLE_CALLS_MAX:
                calls.clear()
            lanes, bell = self.keys.lanes(queue), payloads.encode({"lane": "bell", "queue": queue})
            lane_key = (self.keys.queue(queue), bell, *(("g", key[2]) if lane == "g" else ("p",)))
            keys, args = scripts.push_args(
                self.keys.push_receipt(self._pusher()), "", self.keys.queues, "",
                [(lanes.group(key[2]) if lane == "g" else lanes.prio, queue,
                  [("", None if lane == "g" else "\0", None, "", 0, None)], lane_key)])
            head, _, tail = args[1].partition('"\\u0000"')  # (the score's place in the layout)
            call = calls[key] = (keys, head, tail)
        if lane == "g":
            return call[0], call[1]
        step = self.config.priority_aging or scripts.STRICT_STEP
        return call[0], f'{call[1]}"{now - int(payload["priority"]) * step!r}"{call[2]}'

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
        laned: dict[tuple[str, str, Any], list[tuple[dict[str, Any], int]]] = {}
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
                if (lane := lane_of(item)) is None:
                    by_queue.setdefault(item["queue"], []).append((item, unique_ttl))
                else:
                    laned.setdefault((item["queue"], lane, item["group"] if lane == "g" else None), []).append(
                        (item, unique_ttl))
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
        for (queue, lane, group), queued in laned.items():
            groups.append(self._laned(queue, lane, group, queued, now, marked))
        unwritten = self._push(groups)
        return [item for item in items if id(item) not in unwritten] if unwritten else items

    def _laned(self, queue: str, lane: str, group_id: str | None, queued: list[tuple[dict[str, Any], int]],
               now: float, marked: bool) -> _Group:
        """The group of ``queue``'s jobs for one lane (broker/scripts/lanes.py): its prioritized jobs
        (``lane`` "p"), written to its set, each scored ``now - priority * step`` (one ``step``,
        PRIORITY_AGING, of waiting is worth a step of priority), or group ``group_id``'s ("g"),
        written to that group's list (the group joining the ring): written where they wait, not
        routed there by a fetch, so that a new group's job doesn't wait for the ungrouped jobs
        ahead of it to be fetched."""
        items = [item for item, _ttl in queued]
        raws = payloads.encode_many(items)
        bell = payloads.encode({"lane": "bell", "queue": queue})
        lanes = self.keys.lanes(queue)
        if lane == "g":
            group = self._group(lanes.group(str(group_id)), queue, items,
                                [(raw, None, ttl) for (_item, ttl), raw in zip(queued, raws, strict=True)], marked)
            return group._replace(lane=(self.keys.queue(queue), bell, "g", str(group_id)))
        step = self.config.priority_aging or scripts.STRICT_STEP
        group = self._group(lanes.prio, queue, items, [
            (raw, repr(now - int(item["priority"]) * step + i * BULK_TIE_STEP), ttl)
            for i, ((item, ttl), raw) in enumerate(zip(queued, raws, strict=True))], marked)
        return group._replace(lane=(self.keys.queue(queue), bell, "p"))

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
                    retried = again.setdefault(group.destination,
                                               _Group(group.destination, group.queue, [], [], group.lane))
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
        # (One call per slot, every destination of it in one: a queue's list and its lanes (its
        # priorities, its groups' lists) share its slot and its receipt key, which holds one call's
        # token: a call each, redis-py's resending of one after a lost reply found another's token
        # there and wrote its jobs twice.)
        by_slot: dict[str, list[_Group]] = {}
        for group in groups:
            by_slot.setdefault(group.queue, []).append(group)
        return ([self._call(self.keys.push_receipt(pusher, queue or None), None, slot_groups)
                 for queue, slot_groups in by_slot.items()],
                [queue for queue in by_slot if queue])

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
                                       [(group.destination, group.queue, group.jobs, group.lane) for group in groups])
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
