"""A batch: jobs pushed together, with callbacks when they have all run (complete), all succeeded
(success), or the first of them died (death).

The batch's counters live in Redis (broker/keys/ ``batch:<bid>:*``) and move only in the scripts
of features/batches/scripts.py: when a block of pushes opens and closes (here), when a job is added
before its push (push/client/ through :class:`_Scope`), and when a job of the batch settles
(steps.py, in the worker). docs/batches.md gives the API and why each callback is pushed once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ...bounds import check_queue, check_seconds, check_text
from ...broker.keys import BatchKeys, Keys
from ...broker.quarantine import is_wrong_type, run_script
from ...errors import BatchError, BatchNotFound, InvalidArgument
from ...outbox import units
from ...push import payload as payloads
from ...push import scope as _scope
from ...push.arguments import check_call, check_json_native
from ...push.job import Job, JobSetter
from ..encryption.codec import BATCH_STATUS
from . import delivery, scripts

logger = logging.getLogger(__name__)

EVENTS = ("complete", "success", "death")
FAILED_SHOWN = 100  # failing jobs a status names at most (a batch of 100,000 failing would be 30 MB)
# The callback's first argument in its stored payload, replaced by the batch's status when it fires
# (the Lua of features/batches/scripts.py finds it by its JSON form).
STATUS_PLACEHOLDER = "\x00cogworker-batch-status\x00"


def _process_client() -> Any:
    from ...push import runtime

    return runtime.get_client()


def _context() -> tuple[Any, Keys, float]:
    """The shared Redis client, the keys and the batch TTL of this process's config."""
    from ...broker.keys import for_config
    from ...push import runtime

    config = runtime.get_config()
    return runtime.get_redis(), for_config(config), config.batch_ttl


def handover_queue() -> str:
    """The queue of a batch's own hand-over jobs (a child's news to its parent, a chain's next step)
    when it has no ``callback_queue``: the queue of the job running here (a worker reads it: it
    runs this job), else the first of ``COGWORKER["QUEUES"]``. Their class's "default" was read by
    no worker with ``QUEUES = ["mail"]``: a chain stopped after its first step."""
    running = _scope.running.get()
    queue = running.payload.get("queue") if running is not None else None
    if isinstance(queue, str) and queue:
        return queue
    from ...push import runtime

    return runtime.get_config().queue_names[0]


class Batch:
    """Jobs pushed inside ``with batch.jobs():`` belong to the batch; see docs/batches.md.

    ``description``: shown in the admin. ``bid``: open an existing batch (to add jobs to it);
    without it a new one is made at the first ``jobs()``. ``ttl``: seconds its data lives after its
    last step (BATCH_TTL by default). ``callback_queue``: the queue of its callbacks (by default
    each callback class's own) and of its hand-over jobs (by default :func:`handover_queue`).
    """

    def __init__(self, description: str = "", *, bid: str | None = None, ttl: float | None = None,
                 callback_queue: str | None = None):
        # (All checked here, before jobs() writes a key: a ttl of 1e16 failed inside the opening
        # script, after it had written the batch's keys without an expiry.)
        if not isinstance(description, str):
            raise InvalidArgument(f"a batch's description must be a string, got {description!r}")
        if description:
            check_text(description, "a batch's description")
        if bid is not None:
            check_text(bid, "bid")
        check_seconds(ttl, "a batch's ttl")
        if callback_queue is not None:
            check_queue(callback_queue, "callback_queue")
        self.bid: str | None = bid
        self.description = description
        self.callback_queue = callback_queue
        self.ttl = ttl
        self._existing = bid is not None  # (opened by bid: never created here)
        self._opened = False
        self._recorded = False  # (its first block made it as an outbox unit: outbox/units.py)
        self._callbacks: dict[str, list[list[str]]] = {}
        # A chain's step (workflows.py): its success is told to the chain by ChainNext, not here.
        self.chain_step = False

    # -- callbacks -----------------------------------------------------------

    def on(self, event: str, job_class: type[Job], **options: Any) -> Batch:
        """Push ``job_class`` with ``perform(status, **options)`` once, when ``event`` happens:
        "complete" (every job ran at least once), "success" (every job succeeded), "death" (the
        first job went to dead). Set before the first ``jobs()``."""
        if not isinstance(event, str) or event not in EVENTS:
            raise BatchError(f"unknown batch event {event!r}: one of {', '.join(EVENTS)}")
        if not (isinstance(job_class, type) and issubclass(job_class, Job)) or job_class is Job:
            raise BatchError(f"a batch callback must be a Job class (a subclass of Job), got {job_class!r}")
        if self._opened or self._existing:
            raise BatchError(f"batch {self.bid}: callbacks are set before its first jobs() block")
        try:
            check_json_native(options, "options")
        except TypeError as exc:  # (of the same class: a nesting too deep is an InvalidArgument)
            raise type(exc)(f"batch callback {job_class.name} on {event!r}: {exc}") from None
        check_call(job_class, [{}], options, f"batch callback {job_class.name} on {event!r}: ")
        # (Its status stays clear beside a sealed payload, the seal naming it: codec.open_arguments.)
        head = ((BATCH_STATUS, event),)
        self._add_callback(event, self._setter(job_class).build([STATUS_PLACEHOLDER], options, head=head))
        return self

    def _setter(self, job_class: type[Job]) -> JobSetter:
        queue = self.callback_queue
        if queue is None and getattr(job_class, "_cogworker_handover", False):
            queue = handover_queue()
        return JobSetter(job_class, {"queue": queue} if queue else {})

    def _add_callback(self, event: str, payload: dict[str, Any]) -> None:
        self._callbacks.setdefault(event, []).append([payload["queue"], payload["jid"], payloads.encode(payload)])

    # -- adding jobs ---------------------------------------------------------

    @contextmanager
    def jobs(self) -> Iterator[Batch]:
        """Every job pushed inside the block (``perform_async``, ``perform_in``, ``perform_at``,
        ``perform_bulk``) belongs to the batch; a batch made inside is its child. The batch's
        events can fire once the block ends (an empty batch completes then)."""
        redis, keys, default_ttl = _context()
        ttl = self.ttl or default_ttl
        outer = _scope.batch.get()
        if self._recorded and outer is None and units.begin(_process_client()) is not None:
            raise BatchError(f"batch {self.bid} is made by this transaction through the outbox, and reaches Redis at "
                             f"its commit: push all its jobs in its first jobs() block, or add more after the commit")
        running = _scope.running.get()
        bid, owner, deterministic = self._owner(outer, running)
        inside = running is not None and running.payload.get("bid") == bid
        bk = keys.batch(bid)
        fields: list[Any] = []
        creating = not self._existing and not self._opened
        if creating:
            parent = outer.bid if outer is not None else ""
            if parent:
                self._link(parent)
            fields = ["description", self.description, "created_at", repr(time.time()), "ttl", repr(ttl),
                      "parent", parent]
            for event, callbacks in self._callbacks.items():
                fields += [f"cb:{event}", payloads.encode(callbacks)]
            if parent:
                outer.add([f"b:{bid}"])  # type: ignore[union-attr]
        args = [bid, repr(time.time()), _ttl(ttl), owner, "1" if inside or (creating and deterministic) else "0",
                "1" if creating else "0", *fields]
        # OUTBOX on, inside a transaction: the block making a batch (and those inside it) only
        # records its Redis writes, written as one outbox row at its end and run at commit
        # (outbox/units.py). A block inside one that pushes at once pushes at once too (its link and
        # jobs must reach Redis before its parent's close), and so does one adding to a batch that
        # exists (which could finish, and fire its callbacks, before a deferred add reached it).
        unit = (getattr(outer, "unit", None) if outer is not None
                else units.begin(_process_client()) if creating else None)
        if unit is not None:
            unit.record("open", bid, ttl, args, creating)
        else:
            try:
                open_block(redis, keys, bid, ttl, args, creating)
            except BaseException:
                if creating and outer is not None:
                    outer.remove([f"b:{bid}"])  # (a parent must not wait for a child never made)
                raise
        self._opened = True
        self._recorded = unit is not None
        scope = _Scope(bid, bk, redis, keys, ttl, owner, deterministic, self.callback_queue, unit)
        token = _scope.batch.set(scope)
        try:
            yield self
        finally:
            _scope.batch.reset(token)
            if unit is None:
                close_block(redis, keys, bid, ttl, owner)
            else:
                unit.record("close", bid, ttl, owner)
                if outer is None:
                    unit.stash()

    def _owner(self, outer: Any, running: _scope.Running | None) -> tuple[str, str, bool]:
        """(bid, the block's owner token, whether its jids are derived from that token).

        Inside a job, the block's token, its jids and its children's bids are the same in a run
        again of the job, which so adds the same jobs, not others that would never be pushed if it
        died between adding and pushing them.
        """
        deterministic = isinstance(outer, _Scope) and outer.deterministic
        if self.bid is None:
            self.bid = outer.next_jids(1)[0] if deterministic else payloads.new_jid()
        if running is not None:
            return self.bid, f"{running.payload.get('jid')}:{self.bid}:{running.next_block(self.bid)}", True
        return self.bid, outer.next_jids(1)[0] if deterministic else payloads.new_jid(), deterministic

    def _link(self, parent: str) -> None:
        """Make this batch a child of ``parent``: its events tell the parent (steps.BatchChildDone)."""
        from .steps import BatchChildDone

        options: dict[str, Any] = {"parent": parent, "step": True} if self.chain_step else {"parent": parent}
        for event in ("complete", "death") if self.chain_step else EVENTS:
            self._add_callback(event, self._setter(BatchChildDone).build([STATUS_PLACEHOLDER], options))

    # -- reading -------------------------------------------------------------

    @staticmethod
    def status(bid: str) -> BatchStatus:
        """The batch's counts now; BatchNotFound when it never existed or its data expired."""
        check_text(bid, "bid")
        redis, keys, _ttl_ = _context()
        return read_status(redis, keys.batch(bid), bid)


def open_block(redis: Any, keys: Keys, bid: str, ttl: float, args: list[str], creating: bool) -> None:
    """Open a jobs() block on batch ``bid`` (BATCH_OPEN with ``args``), listing it when ``creating``."""
    bk = keys.batch(bid)
    opened = run_script(scripts.BATCH_OPEN, redis, keys, bk, args, lambda: bk.expected(ttl))
    if opened == -1:
        raise BatchNotFound(bid)
    if opened == -2:
        raise BatchError(f"batch {bid} has finished (every job of it ran): jobs can be added to it now only "
                         f"by its own jobs")
    if creating:
        try:  # (NX: a block opened again, an outbox unit run again, keeps its first place)
            redis.zadd(keys.batches, {bid: time.time()}, nx=True)
        except Exception as exc:  # (the listing only: the batch works without it)
            logger.warning("batch %s not listed in %s: %s", bid, keys.batches, exc)


def close_block(redis: Any, keys: Keys, bid: str, ttl: float, owner: str) -> None:
    """Close ``owner``'s jobs() block on batch ``bid`` and deliver the callbacks it fired."""
    bk = keys.batch(bid)
    # (Entered first: a closer that dies between the close and its delivery leaves it to the
    # workers' sweep, delivery.py.)
    score = delivery.closing(redis, keys, bid, time.time())
    waiting = run_script(scripts.BATCH_CLOSE, redis, keys, bk, [bid, repr(time.time()), _ttl(ttl), owner],
                         lambda: bk.expected(ttl))
    if waiting and int(waiting) > 0:
        delivery.deliver(redis, keys, bid, ttl)
    delivery.closed(redis, keys, bid, score)


def count(redis: Any, keys: Keys, bid: str, ttl: float, how: str, jids: list[str]) -> None:
    """Add ``jids`` to batch ``bid``'s jobs (``how`` "add"), or take them off ("remove")."""
    bk = keys.batch(bid)
    for start in range(0, len(jids), 1000):
        if run_script(scripts.BATCH_ADD, redis, keys, bk, [bid, repr(time.time()), _ttl(ttl), how,
                                                           *jids[start:start + 1000]],
                      lambda: bk.expected(ttl)) == -1:
            raise BatchNotFound(bid)


class BatchStatus(dict):
    """A batch's status, as a dict (what a callback receives) with attribute access:
    ``bid``, ``description``, ``created_at``, ``total``, ``pending``, ``failures``, ``dead``,
    ``complete``, ``success``, ``failed`` (jid -> {class, error, message, at}: FAILED_SHOWN of them
    at most, ``failures`` counts them all; the admin's batch page lists more)). ``Batch.status``
    adds ``lost`` (the names of its keys found of the wrong type and moved to quarantine: what
    they counted is gone, docs/batches.md) and ``poisoned`` (those of the wrong type now, not moved
    yet: counted 0 here)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def read_status(redis: Any, bk: BatchKeys, bid: str) -> BatchStatus:
    pipe = redis.pipeline(transaction=False)
    pipe.hgetall(bk.meta)
    pipe.scard(bk.jobs)
    pipe.scard(bk.pending)
    pipe.hlen(bk.failed)
    pipe.hscan(bk.failed, 0, count=FAILED_SHOWN)
    pipe.scard(bk.dead)
    replies = pipe.execute(raise_on_error=False)
    poisoned = sorted({name for name, reply in zip(("meta", "jobs", "pending", "failed", "failed", "dead"), replies,
                                                   strict=True) if is_wrong_type(reply)})
    for reply in replies:
        if isinstance(reply, Exception) and not is_wrong_type(reply):
            raise reply
    counted: list[Any] = [0 if isinstance(reply, Exception) else reply for reply in replies]
    meta: dict[bytes, bytes] = counted[0] or {}
    total, pending, failures, scanned, dead = counted[1:]
    lost = sorted(k.decode()[5:] for k in meta if k.startswith(b"lost:"))
    if not poisoned and b"created_at" not in meta and not lost:
        raise BatchNotFound(bid)
    cursor, failed = scanned or (0, {})
    while cursor and len(failed) < FAILED_SHOWN:  # (COUNT is a hint: a scan may come back short)
        cursor, more = redis.hscan(bk.failed, cursor, count=FAILED_SHOWN)
        failed.update(more)
    text = {k.decode(): v.decode("utf-8", "replace") for k, v in meta.items()}
    shown = {}
    for jid, record in list(failed.items())[:FAILED_SHOWN]:
        try:
            shown[jid.decode()] = json.loads(record)
        except Exception:
            shown[jid.decode()] = {"error": record.decode("utf-8", "replace")}
    return BatchStatus(
        bid=bid, description=text.get("description", ""), created_at=float(text.get("created_at", 0)),
        parent=text.get("parent") or None, total=total, pending=pending, failures=failures, dead=dead,
        complete="done_complete" in text, success="done_success" in text, death="done_death" in text,
        committed=text.get("committed") == "1", failed=shown,
        callbacks={k[3:]: [cb[1] for cb in json.loads(v)] for k, v in text.items() if k.startswith("cb:")},
        completed_at=_float(text.get("done_complete")), succeeded_at=_float(text.get("done_success")),
        lost=lost, poisoned=poisoned,
    )


def _float(value: str | None) -> float | None:
    return float(value) if value else None


def _ttl(ttl: float) -> str:
    return str(max(1, int(ttl)))


class _Scope:
    """An open jobs() block as the client sees it (push/scope.py): the jobs pushed in it are added to
    the batch before their push, and removed when it failed.

    ``deterministic``: the block runs inside a job (of this batch, or making a child of one), and
    its jids (and child bids) are derived from the block's owner, so a run again of that job adds
    the same ones instead of new ones that would never be pushed if it died between.
    """

    def __init__(self, bid: str, bk: BatchKeys, redis: Any, keys: Keys, ttl: float, owner: str, deterministic: bool,
                 callback_queue: str | None = None, unit: units.Unit | None = None):
        self.bid = bid
        self.callback_queue = callback_queue  # (a workflow's nested parts take it: workflows.py)
        self.bk = bk
        self.redis = redis
        self.keys = keys
        self.ttl = ttl
        self.owner = owner
        self.deterministic = deterministic
        self.unit = unit  # (recording its writes for the outbox: outbox/units.py; None: writing them)
        self._made = 0

    def next_jids(self, n: int) -> list[str]:
        if not self.deterministic:
            return payloads.new_jids(n)
        first, self._made = self._made, self._made + n
        return [hashlib.sha1(f"{self.owner}:{i}".encode()).hexdigest()[:24] for i in range(first, first + n)]

    def add(self, jids: list[str]) -> None:
        self._step("add", jids)

    def remove(self, jids: list[str]) -> None:
        self._step("remove", jids)

    def record_jobs(self, items: list[dict[str, Any]]) -> None:
        """(Recording: outbox/units.py) ``items``, as the middleware let them through, are jobs of the batch."""
        assert self.unit is not None
        self.unit.record("jobs", self.bid, self.ttl, items)

    def _step(self, how: str, jids: list[str]) -> None:
        if self.unit is not None:
            self.unit.record("add", self.bid, self.ttl, how, jids)
        else:
            count(self.redis, self.keys, self.bid, self.ttl, how, jids)


units.use_batch_operations(sys.modules[__name__])  # (the steps of an outbox unit: outbox/units.py)
