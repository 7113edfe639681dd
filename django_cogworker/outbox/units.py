"""A batch's ``jobs()`` block inside a transaction: one outbox row, its Redis writes run at commit.

With OUTBOX on, a top-level ``Batch.jobs()`` block entered inside ``transaction.atomic()`` (and
every block nested in it: a workflow's child batches) writes nothing to Redis while it runs: it
records what it would write, in order, as the steps of a :class:`Unit` (the batch opened, jobs
added and pushed, a chain's stored steps, the batch closed), and its end writes the unit as ONE
outbox row of that transaction. A rollback leaves nothing; at commit the pushing process runs the
steps (:func:`run`), or a relay does later. One row, so one relay at a time takes it (its lock, or
its claim: store.py claims it for the committing process too), and the batch's bookkeeping can't
be split between relays racing, nor run after some of its jobs.

Run again from where it stopped (its runner killed -9, Redis gone mid-way): the number of steps
done is kept in Redis under the unit's mark (``keys.outbox_pushed(<unit jid>)``, MARK_TTL), set
after each step, so only the step under way runs again; each is safe to run again right after
itself. A "jobs" step adds to the batch only the jobs not written before (a job's own mark, in
``keys.outbox_marks``, is written with it by PUSH): one pushed by the first run, which may have
run and settled since, is not counted again.
"""

from __future__ import annotations

import time
from typing import Any

from ..broker.scripts.push import MARK_TTL
from ..push import payload as payloads

UNIT_CLASS = "django_cogworker.outbox_unit"  # (a row's payload "class": what tells a unit from a job)

# The batch operations a unit's steps run (open_block, count, close_block), handed over by batches/
# when it is imported (features/batches/batch.py): batches/ imports this module, and push/client/ does
# through pushing.py, so importing batches/ from here closed a circle (push -> outbox -> batches
# -> push). A unit is recorded by batches/, and every process that runs one (the committing one,
# a worker's relay) has imported it.
_batches: Any = None


def use_batch_operations(module: Any) -> None:
    """Set where a unit's batch steps are run from (features/batches/batch.py, as it is imported)."""
    global _batches
    _batches = module


def _batch_operations() -> Any:
    if _batches is None:
        raise RuntimeError("an outbox unit runs batch steps, but django_cogworker.batches isn't imported")
    return _batches


class Unit:
    """The Redis steps of a top-level ``jobs()`` block (and the blocks inside it), recorded in order."""

    def __init__(self, client: Any, alias: str):
        self.client = client
        self.alias = alias
        self.steps: list[list[Any]] = []

    def record(self, *step: Any) -> None:
        self.steps.append(list(step))

    def stash(self) -> None:
        """Write the unit as one row of the transaction open on its database, run at its commit."""
        item = {"class": UNIT_CLASS, "args": [], "jid": f"unit-{payloads.new_jid()}", "unit": self.steps}
        self.client.outbox.stash_unit(self.alias, item, self.client.hand_over)


def begin(client: Any) -> Unit | None:
    """A new unit when a push through ``client`` (the process's: ``runtime.get_client()``, asked by
    the caller, as push/ imports this module) would be an outbox row (OUTBOX on, inside a
    transaction), else None. None too for the test helpers' stand-in (testing.fake/inline), which
    has no outbox: it takes each push as it is made, and a batch's own writes go to Redis at once."""
    outbox_alias = getattr(client, "_outbox_alias", None)
    if outbox_alias is None:
        return None
    alias = outbox_alias(client.config.enqueue_on_commit)
    return None if alias is None else Unit(client, alias)


def deferred() -> Unit | None:
    """The unit of the ``jobs()`` block open here, if it is being recorded."""
    from ..push import scope

    return getattr(scope.batch.get(), "unit", None)


def is_unit(item: dict[str, Any]) -> bool:
    return item.get("class") == UNIT_CLASS


def run(client: Any, item: dict[str, Any]) -> None:
    """Run the steps of unit ``item`` not done yet (see the module's docstring). Raises what stopped it."""
    batches = _batch_operations()
    redis, keys = client.redis, client.keys
    progress = keys.outbox_pushed(item["jid"])
    steps = item["unit"]
    for index in range(int(redis.get(progress) or 0), len(steps)):
        kind, *args = steps[index]
        if kind == "open":
            batches.open_block(redis, keys, *args)
        elif kind == "add":
            batches.count(redis, keys, *args)
        elif kind == "jobs":
            _jobs(client, *args)
        elif kind == "hset":
            redis.hset(args[0], mapping=args[1])
        elif kind == "close":
            batches.close_block(redis, keys, *args)
        else:
            raise ValueError(f"unknown step {kind!r} of outbox unit {item['jid']}")
        redis.set(progress, index + 1, ex=MARK_TTL)


def left(redis: Any, keys: Any, item: dict[str, Any]) -> dict[str, Any]:
    """Unit ``item`` as what it has left to do, for the dead set (relay.py), where it may wait for
    days: the steps not done, the one under way without the jobs written before, under a jid of
    its own (``unit_of``: the one it was). Its progress and its jobs' marks say what was done only
    for MARK_TTL: a retry (retry.py) runs this, never the whole unit again."""
    done = int(redis.get(keys.outbox_pushed(item["jid"])) or 0)
    steps = [list(step) for step in item["unit"][done:]]
    if steps and steps[0][0] == "jobs":
        kind, bid, ttl, items = steps[0]
        written = _marked(redis, keys, items)
        steps[0] = [kind, bid, ttl, [job for job in items if job["jid"] not in written]]
    return {**item, "jid": f"unit-{payloads.new_jid()}", "unit": steps, "unit_of": item.get("unit_of", item["jid"])}


def _jobs(client: Any, bid: str, ttl: float, items: list[dict[str, Any]]) -> None:
    """Add ``items`` to batch ``bid`` and push them (marked), but those pushed before; uncount the
    unique jobs' duplicates."""
    batches = _batch_operations()
    redis, keys = client.redis, client.keys
    done = _marked(redis, keys, items)
    todo = [item for item in items if item["jid"] not in done]
    if not todo:
        return
    batches.count(redis, keys, bid, ttl, "add", [item["jid"] for item in todo])
    written = {item["jid"] for item in client._write_bulk(todo, marked=True)}
    unwritten = [item["jid"] for item in todo if item["jid"] not in written]
    if unwritten:
        batches.count(redis, keys, bid, ttl, "remove", unwritten)


def _marked(redis: Any, keys: Any, items: list[dict[str, Any]]) -> set[str]:
    """The jids of ``items`` whose outbox mark is there and not run out: written to Redis before."""
    pipe = redis.pipeline(transaction=False)
    asked: list[str] = []
    for item in items:
        # (On a cluster a job for now is marked in its queue's slot, a scheduled one in the home slot.)
        for queue in (None, item.get("queue")) if keys.spread else (None,):
            pipe.zscore(keys.outbox_marks(queue), item["jid"])
            asked.append(item["jid"])
    # (A score is Redis's TIME + MARK_TTL; this host's clock is near enough to tell one run out.)
    now = time.time()
    return {jid for jid, score in zip(asked, pipe.execute(), strict=True) if score is not None and score > now}
