"""What a process holds and has seen of its limiters, shared by the gate (a job's ``limits``), the
places held with ``within`` (within.py) and the heartbeat's upkeep (upkeep.py): the concurrency
places held (their leases renewed), the keys used (written to the index), the holder tokens, and
the wake-up of jobs waiting for a place a release freed. And how places are taken and given back
a round trip at a time: the takes of one fetch, and the releases held for one, each packed into
one script call (LIMIT_TAKE_MANY, LIMIT_RELEASE_MANY: scripts.py; :class:`Packing`), the release
riding the round trip as a settlement step (:class:`Release`, run by :class:`Releases`).

Why one call: a take's worker CPU was mostly redis-py packing its arguments (thirteen a job, about
3 µs each, one EVALSHA a job). A fetch of ten jobs of one limiter now packs six KEYS and four spec
values once, then four arguments a job (token, refusal, parked, its keys' numbers); a round
trip's releases, two a holder. The KEYS and spec of a limiter key are encoded once and kept.
A release is never worth the job's settlement: one Redis refuses is logged, and its places lapse
with their lease (upkeep.py).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from redis.exceptions import NoScriptError

from ...broker import scripts
from ...broker.keys import Keys
from ...broker.quarantine import quarantine_wrong
from ...push import payload as payloads
from ...push import scope  # (a leaf: the running job and the process identity, set by the worker)
from . import scripts as limit_scripts

logger = logging.getLogger(__name__)

Call = tuple[Any, list[tuple[Any, str]]]  # a holder's Ticket (gate.py) and its places (Limiter, key) in one script call


def wake(redis: Any, keys: Keys, popped: list[Any]) -> int:
    """Move the jobs a release popped from ``waiting`` (payload, due time, ...) from the schedule to
    their queues now, each only if still in the schedule as parked (one that ran or was deleted
    meanwhile isn't brought back); return how many moved. A wake-up that fails costs only time:
    the job is still due at its backoff."""
    from ...broker import crossings
    from ...push import payload as payloads

    moved = 0
    now = time.time()
    for raw, score in zip(popped[::2], popped[1::2], strict=True):
        try:
            payload = payloads.decode(raw)
            queue = payload.get("queue")
            if not isinstance(queue, str) or not queue:
                continue
            payload["enqueued_at"] = now
            text = payloads.encode(payload)
            if keys.spread:  # (the queue is in another slot: leased, pushed, then removed)
                moved += crossings.zset_to_queues(redis, keys, keys.schedule, [(raw, float(score), queue, text)],
                                                  now)[0] == crossings.MOVED
            else:
                moved += int(scripts.CLAIM_AND_REQUEUE(redis, [keys.schedule, keys.queues, keys.queue(queue)],
                                                       [raw, queue, text]))
        except Exception as exc:
            logger.warning("a job waiting for limiter place was not woken (%s: %s); it runs at its backoff",
                           type(exc).__name__, exc)
    return moved


def holder_token(jid: str | None) -> str:
    """A holder's token: who holds the place (shown by the admin), unique per run.

    JSON of jid, process, since and run (the admin and LIMIT_RELEASE read it), written as a fixed
    format rather than by json.dumps: a take's token was a fifth of its worker CPU. ``run`` is this
    process's random prefix and a count: unique per run, as a fresh random one was.
    """
    process = scope.identity or ""
    if _ours[0] != process:
        _ours[:] = [process, json.dumps(_process()), secrets.token_hex(4)]
    return (f'{{"jid":{json.dumps(jid)},"process":{_ours[1]},'
            f'"since":{round(time.time(), 3)!r},"run":"{_ours[2]}{next(_runs):x}"}}')


_runs = itertools.count()
# (The identity it was made for, its JSON, this process's run prefix: made again when the worker
# sets its identity, and in a forked child, whose count would repeat its parent's.)
_ours: list[str] = ["\0", "", ""]
os.register_at_fork(after_in_child=lambda: _ours.__setitem__(0, "\0"))


class _Held:
    """The concurrency places this process holds, for the heartbeat to renew their leases."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, tuple[str, float, str]] = {}
        self._next = 0

    def add(self, key: str, lease: float, token: str) -> int:
        with self._lock:
            self._next += 1
            self._held[self._next] = (key, lease, token)
            return self._next

    def remove(self, hold: int) -> None:
        with self._lock:
            self._held.pop(hold, None)

    def by_key(self) -> dict[str, tuple[float, list[str]]]:
        """limiter key -> (its lease, the tokens held on it)."""
        grouped: dict[str, tuple[float, list[str]]] = {}
        with self._lock:
            for key, lease, token in self._held.values():
                grouped.setdefault(key, (lease, []))[1].append(token)
        return grouped


HELD = _Held()


class _Seen:
    """The limiter keys this process used since its last beat, with their specs: the heartbeat
    writes them to the ``limits`` index (no write of its own on a job's path)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[str, str] = {}

    def add(self, key: str, limiter: Any) -> None:
        if key not in self._keys:
            with self._lock:
                self._keys[key] = limiter.describe()

    def put(self, key: str, spec: str) -> None:
        with self._lock:
            self._keys.setdefault(key, spec)

    def take(self) -> dict[str, str]:
        with self._lock:
            taken, self._keys = self._keys, {}
        return taken


SEEN = _Seen()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _process() -> str:
    """The worker process's identity, or host:pid elsewhere."""
    identity = scope.identity
    return identity if identity else f"{socket.gethostname()}:{os.getpid()}"


def _current_jid() -> str | None:
    running = scope.running.get()
    return running.payload.get("jid") if running is not None else None


KEPT_MAX = 4096  # limiter keys whose encoded KEYS are kept (a key function may make many: then dropped, made again)


class Packing:
    """Encodes the KEYS of limiter keys and the specs of limiters once (thread-safe: a dict set
    from several threads at worst makes one twice)."""

    def __init__(self, keys: Keys):
        self.keys = keys
        self._kept: dict[str, list[bytes]] = {}
        self._specs: dict[tuple, list[bytes]] = {}

    def limit_keys(self, key: str) -> list[bytes]:
        found = self._kept.get(key)
        if found is None:
            if len(self._kept) >= KEPT_MAX:
                self._kept = {}
            found = self._kept[key] = [name.encode() for name in self.keys.limit(key)]
        return found

    def spec(self, limiter: Any) -> list[bytes]:
        """``limiter.argv()`` encoded, kept by its spec (a group's limiter may be a new object per job:
        kept by the object, they piled up)."""
        spec = limiter.spec()
        kept = self._specs.get(spec)
        if kept is None:
            if len(self._specs) >= KEPT_MAX:
                self._specs = {}
            kept = self._specs[spec] = [str(value).encode() for value in limiter.argv()]
        return kept

    def many(self, leads: Sequence[tuple[Sequence[tuple[Any, str]], Sequence[Any]]],
             head: Sequence[Any] = ()) -> tuple[list[bytes], list[Any]]:
        """KEYS and ARGV of one _MANY call: ``head`` first (LIMIT_RELEASE_MANY's mode), then the count
        of limiter keys and their specs, then for each of ``leads`` (its limiters with their keys, and
        its own fields) one argument: the numbers of its keys, then its fields, a line each (only the
        last may hold a line break: a token is JSON, a refusal a word; the jid to unpark goes last).
        One argument a job, not four: redis-py's cost is per argument."""
        numbers: dict[tuple[str, tuple], int] = {}
        names: list[bytes] = []
        specs: list[bytes] = []
        tail: list[Any] = []
        for keyed, lead in leads:
            mine = []
            for limiter, key in keyed:
                ident = (key, limiter.spec())
                number = numbers.get(ident)
                if number is None:
                    number = numbers[ident] = len(numbers) + 1
                    names += self.limit_keys(key)
                    specs += self.spec(limiter)
                mine.append(number)
            tail.append("\n".join((str(mine[0]) if len(mine) == 1 else ",".join(map(str, mine)), *lead)))
        return names, [*head, len(numbers), *specs, *tail]


class Release(NamedTuple):
    """A step of a settlement: the places a run held given back (before its ack or filing).

    A run's places go back with its ack: held with it for the fetcher's next round trip
    (settlement.py), where every release held goes in one pipeline (:class:`Releases`), instead of
    a round trip of each job's own. A release is never worth the job's settlement: one Redis
    refuses is logged, and its places lapse with their lease (upkeep.py).
    """

    ticket: Any  # (gate.py's Ticket: not imported, gate.py imports this module)
    jid: str

    @property
    def holdable(self) -> bool:
        return True  # (never writes what the job's end waits for)


class Releases:
    """Runs Release steps (the Settler's runner for them): never raises. They ride the fetch's
    round trip (``queue``, ``landed``), unordered: a job's ack goes with its release."""

    ordered = False

    def __init__(self, gate: Any):  # (gate.py's LimitGate)
        self.gate = gate

    def queue(self, pipe: Any, steps: Sequence[Release]) -> int:
        packed = self._packed(self._calls(steps))
        for names, argv in packed:
            limit_scripts.LIMIT_RELEASE_MANY.in_pipeline_by_sha(pipe, names, argv)
        return len(packed)

    def landed(self, steps: Sequence[Release], replies: Sequence[Any]) -> None:
        if len(replies) == 1 and not isinstance(replies[0], Exception) and len(replies[0]) <= 1:
            return  # (one call, every place given back, no job to wake: nothing to read again)
        self._landed(self._calls(steps, forget=False), replies)

    def _packed(self, calls: list[Call]) -> list[tuple[list[bytes], list[Any]]]:
        """The LIMIT_RELEASE_MANY calls of ``calls``: one (on a cluster, one per limiter key: a
        call's keys are in one slot)."""
        packing = self.gate.packing
        return [packing.many([(group, (ticket.token,)) for ticket, group in chunk], ("release",))
                for chunk in self._packed_count(calls)]

    def _packed_count(self, calls: list[Call]) -> list[list[Call]]:
        if not calls:
            return []
        if not self.gate.keys.spread:
            return [calls]
        by_key: dict[str, list[Call]] = {}
        for call in calls:
            by_key.setdefault(call[1][0][1], []).append(call)
        return list(by_key.values())

    def _calls(self, steps: Sequence[Release], forget: bool = True) -> list[Call]:
        """Each release's LIMIT_RELEASE calls (one per key on a cluster); ``forget``: its places are
        no longer renewed by the heartbeat from now on."""
        spread = self.gate.keys.spread
        calls: list[Call] = []
        for step in steps:
            ticket = step.ticket
            if forget:
                for hold in ticket.holds:
                    HELD.remove(hold)
                ticket.holds = []
            groups = [ticket.taken] if not spread else [[pair] for pair in ticket.taken]
            calls += [(ticket, group) for group in groups]
        return calls

    def _landed(self, calls: list[Call], replies: Sequence[Any]) -> None:
        gate = self.gate
        for chunk, reply in zip(self._packed_count(calls), replies, strict=True):
            if isinstance(reply, NoScriptError):  # (Redis forgot it, or never had it: the call again, which loads it)
                try:
                    reply = limit_scripts.LIMIT_RELEASE_MANY(gate.redis, *self._packed(chunk)[0])
                except Exception as exc:  # noqa: BLE001 - (each alone, below)
                    reply = exc
            if isinstance(reply, Exception):  # (each again alone, which moves a wrong-type key aside)
                failed = chunk
            else:
                failed = [chunk[int(n) - 1] for n in _text(reply[1]).split(",") if n]
                if len(reply) > 2:
                    try:
                        wake(gate.redis, gate.keys, reply[2:])
                    except Exception:  # noqa: BLE001 - (the woken job runs at its backoff all the same)
                        logger.warning("jobs waiting for a place not woken", exc_info=True)
            for ticket, group in failed:
                if not isinstance(reply, Exception):
                    # (A key of the wrong type failed its holder in the call; its places, given back
                    # before the key, are gone: alone, its release might not meet the key again.)
                    try:
                        quarantine_wrong(gate.redis, gate.keys, gate._expected(group))
                    except Exception:  # noqa: BLE001 - (the next take meets it)
                        logger.warning("limits %s: keys not checked", [key for _l, key in group], exc_info=True)
                type(ticket)(gate, ticket.token, group, []).release()

    def run(self, step: Release) -> None:
        step.ticket.release()

    def run_many(self, steps: Sequence[Release]) -> None:
        """Every release in one pipeline of its own (a fetch that can't carry them)."""
        calls = self._calls(steps)
        try:
            pipe = self.gate.redis.pipeline(transaction=False)
            for names, argv in self._packed(calls):
                limit_scripts.LIMIT_RELEASE_MANY.in_pipeline(pipe, names, argv)
            replies = pipe.execute(raise_on_error=False)
        except Exception as exc:
            logger.error("%d limit release(s) not sent (%s: %s); their places free when their lease lapses",
                         len(calls), type(exc).__name__, payloads.printable(exc))
            return
        self._landed(calls, replies)
