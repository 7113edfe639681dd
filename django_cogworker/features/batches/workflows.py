"""Workflows: chain, group and chord, as thin helpers over batches (docs/batches.md).

Every workflow runs as a batch, and every part of it that is not a single job as a child batch:

- ``group(a, b, ...)``: a batch holding each member.
- ``chain(a, b, ...)``: a batch holding one step at a time, each step a child batch of it. A
  step's success callback (:class:`ChainNext`, pushed once by the step's batch) opens the chain's
  batch, adds the next step to it, then settles the finished step in it: the chain's batch can't
  complete between two steps. A step whose job dies tells the chain's batch (its death), and the
  chain stops there: its success never fires, so no next step is pushed.

  The steps are stored once, when the chain starts, in its batch's meta hash (``chain:<i>``, and
  ``chain_steps``: how many), and a hand-over carries only the index of the step it adds: it costs
  the same in a chain of 500 steps as in one of 3, where carrying the steps to come cost a 500-step
  chain 125,000 step copies. Fields of the meta hash, not a key of their own: they live as long as
  the batch (its TTL, refreshed with its other keys), in its slot, and no script changes. They are
  written once and never change: a hand-over run again (its process killed before it was acked)
  reads the same step at the same index, and adds it with the same bid and jids as the first run.
- ``chord(group, callback)``: a chain of the group and the callback.

A step asks for the previous step's return value with ``.with_previous()``: the value (a list of
values, in the order of its members, for a group) is its first argument. Only the jobs of a step
followed by such a step keep their return value (in their step's batch, for its TTL).

The workflows' callbacks (``.on(event, Job, **options)``) are the outer batch's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

from ...bounds import MAX_DEPTH, nesting
from ...errors import BatchError, InvalidArgument
from ...outbox import units
from ...push import payload as payloads
from ...push import scope as _scope
from ...push.job import Job, registered
from ..encryption import codec
from ..encryption.declaration import encrypts, push_ring
from .batch import Batch, _context
from .signature import Signature

# Single jobs of a group (or a chain's step) pushed together: one push_bulk, as perform_bulk's calls.
BULK = 1000
# A chain's steps stored per HSET (a pipeline of them: one round trip).
STORED = 1000


class Node:
    """A part of a workflow."""

    takes_previous = False
    depth = 0  # (how deep its dump nests: _depth)
    _callbacks: list[tuple[str, type[Job], dict[str, Any]]]

    def on(self, event: str, job_class: type[Job], **options: Any) -> Node:
        """A callback of the workflow's batch (see :meth:`Batch.on`)."""
        Batch().on(event, job_class, **options)  # (checks it now, at the call)
        self._callbacks = [*getattr(self, "_callbacks", []), (event, job_class, options)]
        return self

    def perform_async(self, description: str = "", callback_queue: str | None = None) -> Batch:
        """Start the workflow; return its batch (``.bid`` to follow it with ``Batch.status``).
        ``callback_queue``: the queue of its callbacks and of the steps' hand-overs (Batch)."""
        batch = Batch(description or self.describe(), callback_queue=callback_queue)
        for event, job_class, options in getattr(self, "_callbacks", []):
            batch.on(event, job_class, **options)
        with batch.jobs():
            self.fill(batch, None, keep=False)
        return batch

    def describe(self) -> str:
        raise NotImplementedError

    def launch(self, previous: Any, keep: bool) -> str | None:
        """Push this part inside the open jobs() block, as a child batch of it (``keep``: its jobs
        keep their return value). Return None: a job's jid for a single job (Signature.launch)."""
        outer = _scope.batch.get()
        batch = Batch(self.describe(), callback_queue=getattr(outer, "callback_queue", None))
        with batch.jobs():
            self.fill(batch, previous, keep)
        return None

    def fill(self, batch: Batch, previous: Any, keep: bool) -> None:
        """Push this part's contents into ``batch``, whose jobs() block is open."""
        raise NotImplementedError

    def dump(self) -> dict[str, Any]:
        raise NotImplementedError


Part = Node | Signature  # (a workflow's part: a single job, or a group, chain or chord of parts)


class Group(Node):
    """Members run at once, in one batch: ``group(A.s(1), A.s(2))``."""

    def __init__(self, members: Sequence[Part]):
        self.members = [_node(m) for m in members]
        self.takes_previous = any(m.takes_previous for m in self.members)
        self.depth = _depth(self.members)

    def describe(self) -> str:
        return f"group of {len(self.members)}"

    def fill(self, batch: Batch, previous: Any, keep: bool) -> None:
        _launch_members(self.members, previous, keep)

    def dump(self) -> dict[str, Any]:
        return {"t": "group", "m": [dump_part(m) for m in self.members]}


class Chain(Node):
    """Steps one after the other, each once the previous succeeded: ``chain(A.s(1), B.s(), C.s())``."""

    def __init__(self, steps: Sequence[Part]):
        if not steps:
            raise BatchError("a chain needs at least one step")
        self.steps = [_node(s) for s in steps]
        self.takes_previous = self.steps[0].takes_previous
        self.depth = _depth(self.steps)

    def describe(self) -> str:
        return "chain of " + " -> ".join(s.describe() for s in self.steps)

    def fill(self, batch: Batch, previous: Any, keep: bool) -> None:
        bid = cast(str, batch.bid)  # (its jobs() block is open: it has one)
        _store_steps(bid, self.steps)
        _start_step(bid, 0, len(self.steps), self.steps[0], self.steps[1] if len(self.steps) > 1 else None,
                    previous, keep, batch.callback_queue)

    def dump(self) -> dict[str, Any]:
        return {"t": "chain", "s": [dump_part(s) for s in self.steps]}


class Chord(Chain):
    """A group, then a callback once every member succeeded: ``chord(group(...), Done.s())``."""

    def __init__(self, header: Group | Sequence[Part], body: Part):
        super().__init__([header if isinstance(header, Group) else Group(header), body])


def chain(*steps: Part) -> Chain:
    return Chain(steps)


def group(*members: Part) -> Group:
    return Group(members)


def chord(header: Group | Sequence[Part], body: Part) -> Chord:
    return Chord(header, body)


def _node(node: Any) -> Part:
    if not isinstance(node, (Node, Signature)):
        raise BatchError(f"a workflow part must be a signature (MyJob.s(...)), a group, a chain or a chord, "
                         f"got {node!r}")
    return node.check() if isinstance(node, Signature) else node


def _depth(parts: Sequence[Part]) -> int:
    """How deep the JSON of a group or chain of ``parts`` nests (``dump``: a dict and a list over its
    parts'); InvalidArgument past what a step's hand-over may carry.

    A chain's steps travel as JSON in its hand-over's options (``steps``, one list deep), which
    are held to MAX_DEPTH as any job's: so is every workflow, when it is built. Counted as each
    part is made, so a chain nested 2,000 deep is refused at its 50th level, not walked (its
    describe and dump recursed, and raised RecursionError).
    """
    depth = 2 + max((p.depth if isinstance(p, Node) else nesting(dump_part(p)) for p in parts), default=0)
    if depth + 1 > MAX_DEPTH:
        raise InvalidArgument(f"a workflow may nest {MAX_DEPTH} lists and dicts deep as its steps travel (each "
                              f"chain or group around a step adds 2, a step 2 over its arguments): this one nests "
                              f"{depth + 1}")
    return depth


def _launch_members(members: Sequence[Part], previous: Any, keep: bool) -> list[str | None]:
    """Push each member in the open block, the single jobs up to BULK at a time in one push (a
    member that isn't one job is a child batch, launched in its place); return their jids, in
    order (None for such a child)."""
    jids: list[str | None] = []
    single: list[Signature] = []

    def push_single() -> None:
        for start in range(0, len(single), BULK):
            # (A signature takes the previous value only if it asks for it: Signature._build.)
            jids.extend(Signature.launch_many(single[start:start + BULK], previous, keep))
        single.clear()

    for member in members:
        if isinstance(member, Signature):
            single.append(member)
        else:
            push_single()
            jids.append(member.launch(previous if member.takes_previous else None, keep))
    push_single()
    return jids


def _store_steps(chain_bid: str, steps: Sequence[Part]) -> None:
    """Store the steps of the chain whose batch is ``chain_bid`` in its meta hash (whose jobs() block
    is open: the hash exists, with the batch's TTL), before its first step is pushed."""
    redis, keys, _ttl = _context()
    meta = keys.batch(chain_bid).meta
    fields: dict[str, Any] = {"chain_steps": len(steps)}
    unit = units.deferred()  # (a block recorded for the outbox: its writes too, outbox/units.py)
    pipe = redis.pipeline(transaction=False)
    hset = pipe.hset if unit is None else lambda key, mapping: unit.record("hset", key, mapping)
    for i, step in enumerate(steps):
        fields[f"chain:{i}"] = payloads.encode(dump_part(step))
        if len(fields) >= STORED:
            hset(meta, mapping=fields)
            fields = {}
    if fields:
        hset(meta, mapping=fields)
    if unit is None:
        pipe.execute()


def _stored_steps(chain_bid: str, index: int) -> tuple[int, Part | None, Part | None]:
    """How many steps the chain has, and its steps ``index`` and ``index + 1`` (None past its end)."""
    redis, keys, _ttl = _context()
    count, step, following = redis.hmget(keys.batch(chain_bid).meta, ["chain_steps", f"chain:{index}",
                                                                       f"chain:{index + 1}"])
    if count is None or (step is None and index < int(count)):
        raise BatchError(f"chain {chain_bid}: its steps are not in its batch (its data expired, or was quarantined)")
    return (int(count), None if step is None else load(json.loads(step)),
            None if following is None else load(json.loads(following)))


def _start_step(chain_bid: str, index: int, count: int, node: Part, following: Part | None, previous: Any,
                keep_last: bool, callback_queue: str | None) -> None:
    """Add step ``index`` (``node``) of a chain of ``count``, as a child batch of the chain's (whose
    jobs() block is open); ``following``: the next step, None for the last.

    A group step's members are the step batch's own jobs; when the next step takes the previous
    value, the step's batch keeps their order (``order``) and they keep their return values.
    """
    keep = keep_last if following is None else following.takes_previous
    step = Batch(f"step {index + 1} of {count}: {node.describe()}", callback_queue=callback_queue)
    step.chain_step = True  # (its success is told by ChainNext, once the next step is added)
    # (The index only: the steps are the chain batch's, stored once; module docstring.)
    step.on("success", ChainNext, chain=chain_bid, index=index + 1, keep=keep_last, callback_queue=callback_queue)
    with step.jobs():
        members = node.members if isinstance(node, Group) else [node]
        jids = _launch_members(members, previous, keep)
        if keep:
            redis, keys, _ttl = _context()
            order = {"order": json.dumps({"group": isinstance(node, Group), "jids": jids})}
            meta = keys.batch(step.bid).meta  # type: ignore[arg-type]
            if (unit := units.deferred()) is not None:
                unit.record("hset", meta, order)
            else:
                redis.hset(meta, mapping=order)


def previous_value(step_bid: str) -> Any:
    """The return value of a finished step: its job's, or a list of its members' for a group
    (None for a member that was no single job)."""
    redis, keys, _ttl = _context()
    meta = keys.batch(step_bid).meta
    order = json.loads(redis.hget(meta, "order") or b'{"group": false, "jids": []}')
    values = [None if jid is None else _value(redis.hget(meta, f"result:{jid}")) for jid in order["jids"]]
    return values if order["group"] else (values[0] if values else None)


def _value(raw: bytes | None) -> Any:
    return None if raw is None else json.loads(raw)


def dump_part(part: Part) -> dict[str, Any]:
    """A part as stored in its workflow's batch data: a step sealed (``"e"``) if its job encrypts, its
    clear options and ``with_previous`` bound to the seal: changed in Redis, ``"p"`` put the previous
    step's value before its sealed arguments, and ``"o"`` ``{"encrypt": false}`` pushed them in clear."""
    data = part.dump()
    if isinstance(part, Signature) and encrypts(part.job_class, part.options):
        bound = codec.binding([part.options, bool(part.takes_previous)])
        data.update(a=[], k={}, e=codec.seal(part.args, part.kwargs, part.job_class.name, push_ring(part.job_class),
                                             bound=bound))
    return data


def load(data: dict[str, Any]) -> Part:
    """A node from :meth:`Node.dump` (a chain's steps are stored so: :func:`_store_steps`)."""
    kind = data["t"]
    if kind == "sig":
        job_class = registered(data["c"])
        if job_class is None:
            raise BatchError(f"workflow step {data['c']!r} is no job class registered in this worker")
        if "e" in data:  # (sealed: opened with the settings' keys, and the clear options it was stored with)
            args, kwargs = codec.unseal(data["e"], job_class.name, push_ring(job_class),
                                        codec.binding([data["o"], bool(data["p"])]))
            data = {**data, "a": args, "k": kwargs}
        return Signature.load(job_class, data)
    if kind == "group":
        return Group([load(m) for m in data["m"]])
    if kind == "chain":
        return Chain([load(s) for s in data["s"]])
    raise BatchError(f"unknown workflow part {kind!r}")


class ChainNext(Job):
    """A chain step's success callback: adds the next step to the chain's batch, then settles the
    finished step in it (in that order: the chain's batch can't complete in between)."""

    name = "django_cogworker.chain_next"
    _cogworker_handover = True  # (pushed where the batch's hand-overs go: batch.handover_queue)
    cancellable = False  # (its chain waits for it: see cancel_refusal)

    @classmethod
    def cancel_refusal(cls, payload: dict[str, Any]) -> str:
        from .steps import handed_over

        status, options = handed_over(payload)
        return (f"job {payload.get('jid')!r} is chain {options.get('chain')!r}'s own bookkeeping ({cls.name}): it "
                f"hands the chain on from step {status.get('bid')!r} to the next; cancelled, the chain would "
                f"neither go on nor fire complete or death. To stop the chain, cancel a job of its next step "
                f"once pushed: a step whose job dies ends the chain with its death")

    def perform(self, status: dict[str, Any], chain: str, index: int, keep: bool = False,
                callback_queue: str | None = None) -> None:
        from ...push import runtime
        from .steps import settle

        redis, keys, ttl = _context()
        finished = f"b:{status['bid']}"
        if not redis.sismember(keys.batch(chain).pending, finished):
            return  # (a run again after the step was settled: the next step was added then)
        count, node, following = _stored_steps(chain, index)
        if node is not None:
            previous = previous_value(status["bid"]) if node.takes_previous else None
            with Batch(bid=chain, callback_queue=callback_queue).jobs():
                _start_step(chain, index, count, node, following, previous, keep, callback_queue)
        settle(redis, keys, chain, finished, "success", "", runtime.get_config().batch_ttl)

