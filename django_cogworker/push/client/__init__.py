"""Push jobs into Redis: one, in bulk, now or scheduled, through the client middleware.

A Client is built once per process from the config (``runtime.get_client()``)
and is thread-safe: it asks for its Redis client at each push (``runtime.get_redis``: the pool's,
or a worker's processor thread's own connection), never keeping one thread's. ``defer`` is injected by the Django edge:
it returns True when it has taken the push to run at transaction commit.

Every write is the PUSH script (broker/scripts/push.py), one round trip however many jobs; how
a push is written (grouped by destination, one call per slot on a cluster, receipts, repairs) is
``client/writes.py``'s ``PushWrites``, a mixin of the Client, as the outbox's part is (outbox/pushing.py).
A payload carrying a feature's writer field (declarations.py ``Writer``: a push that debounces or
throttles) is that writer's to write instead, in one script of its own (with OUTBOX on, a row of the
transaction like any push, handed to the writer at commit or by a relay: outbox/pushing.py), never
in a batch (refused); what it came to is kept per thread for ``JobSetter.push`` (``outcome``).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ...broker import scripts
from ...broker.keys import for_config
from ...broker.scripts.lanes import LANE_FIELDS
from ...broker.types import RedisClient
from ...conf import Config
from ...declarations import PushOutcome, Writer, declared
from ...errors import CogworkerError
from ...outbox.pushing import OutboxPushes
from .. import payload as payloads
from .. import scope as _scope
from ..middleware import build_chain
from .writes import PushWrites

logger = logging.getLogger(__name__)

# (push, the payloads it pushes) -> whether it waits for a commit (runtime.defer_to_commit).
Defer = Callable[[Callable[[], Any], Sequence[dict[str, Any]]], bool]


class Client(OutboxPushes, PushWrites):
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
        self._writers = tuple((w.field, w) for w in declared().writers)  # (the features' own writes)

    def push(self, payload: dict[str, Any], *, at: float | None = None, on_commit: bool | None = None) -> str | None:
        """Push one payload (already checked); return its jid, or None if a middleware stopped it
        or it is a unique job's duplicate.

        ``at``: epoch seconds to run at (scheduled) or None for now. Inside a
        transaction the push waits for commit (``on_commit``, default from
        ENQUEUE_ON_COMMIT); the jid is returned at once all the same.
        """
        if at is not None:
            payload["at"] = float(at)
        writer = self._writer_of(payload) if self._writers else None
        scope = _scope.batch.get()
        if scope is not None:
            if writer is not None:
                raise CogworkerError(writer.batch_refusal)
            return next(iter(self._push_in_batch(scope, [payload], lambda: [self._chain(payload)])), None)
        if on_commit is None:
            on_commit = self.config.enqueue_on_commit
        if (alias := self._outbox_alias(on_commit)) is not None:
            if writer is not None:  # (a row of the transaction: what it comes to is known at the hand-over)
                self._bulk.outcome = PushOutcome("deferred", payload["jid"])
            return next(iter(self._stash(alias, [payload])), None)
        if on_commit and self.defer is not None and self.defer(lambda: self._chain(payload), [payload]):
            self._bulk.outcome = PushOutcome("deferred", payload["jid"])
            return payload["jid"]
        return self._chain(payload)

    def forget_outcome(self) -> None:
        """Forget this thread's last push's outcome (JobSetter.push, before it pushes)."""
        self._bulk.outcome = None

    def outcome(self, jid: str | None) -> PushOutcome:
        """What this thread's last push came to: its writer's or the defer's word, else ``jid``'s
        (None: a middleware stopped it, or a unique job's duplicate)."""
        said = getattr(self._bulk, "outcome", None)
        return said if said is not None else PushOutcome("pushed" if jid else "dropped", jid)

    def _writer_of(self, payload: dict[str, Any]) -> Writer | None:
        for field, writer in self._writers:
            if field in payload:
                return writer
        return None

    def _write_own(self, writer: Writer, payload: dict[str, Any], marked: bool = False) -> PushOutcome:
        """Write ``payload`` through its feature's ``writer`` (``marked``: an outbox job, with its mark);
        keep what it came to for this thread."""
        payloads.check_outgoing(payload)
        written = self._bulk.outcome = writer.write(self.redis, self.keys, self.config, payload, self.clock(),
                                                    marked=marked)
        return written

    def _write_now(self, writer: Writer, payload: dict[str, Any]) -> PushOutcome:
        """Write ``payload`` through its ``writer`` now: with OUTBOX on, marked, or saved to the outbox
        for a relay while Redis is away (then "deferred"), as a plain push outside a transaction is."""
        if self.outbox is None:
            return self._write_own(writer, payload)
        self._bulk.outcome = None
        self._write_or_save([payload])
        if self._bulk.outcome is None:
            self._bulk.outcome = PushOutcome("deferred", payload["jid"])
        written: PushOutcome = self._bulk.outcome
        return written

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
        if self._writers and (writer := self._writer_of(payload)) is not None:
            return self._write_now(writer, payload).jid  # (dropped: the jid of the job standing for it)
        if self.outbox is not None:
            return payload["jid"] if self._write_or_save([payload]) else None
        jid, queue = payload.get("jid"), payload.get("queue")
        if (not self.keys.spread and "at" not in payload and not payload.get("unique_digest")
                and isinstance(queue, str) and queue and isinstance(jid, str) and jid):
            # The common push, one job for now to a lone Redis, without the general path's grouping
            # (a third of a perform_async): the PUSH call of its queue (or its lane: a group's, the
            # priorities') is made once per thread. Any reply but "written" goes through the general
            # path, which sends the same push again: the receipt answers it with this reply, and
            # nothing is written twice.
            now = payload["enqueued_at"] = self.clock()
            keys, layout = (self._single_call(queue) if next(iter(payload)) not in LANE_FIELDS
                            else self._single_lane_call(queue, payload, now))
            if keys and scripts.PUSH(self.redis, keys, [jid, layout, payloads.encode(payload)]) == 1:
                return jid
        return payload["jid"] if self._write_bulk([payload]) else None

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
        own = next((w for item in items if (w := self._writer_of(item)) is not None), None) if self._writers else None
        scope = _scope.batch.get()
        if scope is not None:
            if own is not None:
                raise CogworkerError(own.batch_refusal)
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
        collected = self._collect(items)
        if self._writers and any(self._writer_of(item) for item in collected):
            # (Each of the feature's own in turn, as so many pushes: a drop is left out, as a duplicate is.)
            plain = [item for item in collected if self._writer_of(item) is None]
            own = {id(item): written for item in collected if (writer := self._writer_of(item)) is not None
                   and (written := self._write_now(writer, item)).status != "dropped"}
            done = {id(item) for item in self._write_plain(plain)} if plain else set()
            # A "replaced" outcome names a job that won't run (an earlier item's, two equal debounced
            # items): that item's jid is the one that took its place, the one that runs for both.
            successor = {w.other: w.jid for w in own.values() if w.status == "replaced" and w.other and w.jid}
            return [_last(successor, own[id(item)].jid or item["jid"]) if id(item) in own else item["jid"]
                    for item in collected if id(item) in own or id(item) in done]
        return [item["jid"] for item in self._write_plain(collected)]

    def _write_plain(self, items: Sequence[dict[str, Any]]) -> Sequence[dict[str, Any]]:
        return (self._write_bulk if self.outbox is None else self._write_or_save)(items)

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



def _last(successor: dict[str, str], jid: str) -> str:
    """The jid that took ``jid``'s place, and so on to the last (the one that runs)."""
    seen = {jid}
    while (jid := successor.get(jid, jid)) not in seen:
        seen.add(jid)
    return jid
