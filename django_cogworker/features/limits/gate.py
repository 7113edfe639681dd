"""A job's limits, taken before it runs and given back after (the limits feature's hook, hook.py).

A job whose class has ``limits`` takes a place in each, all or none, in one LIMIT_TAKE round trip
(on a cluster, one per limiter key: each key has a slot of its own, and a later refusal gives back
what the earlier ones took). Refused, the job goes back to the schedule (:meth:`LimitGate.reschedule`)
atomically with its ack, its retry count untouched; after OVER_LIMIT_MAX reschedules the next
refusal fails it like an error (retry, then dead). Redis away or refusing every write (an outage)
sends it back to the schedule uncounted, to be tried again in UNREACHABLE_DELAY; a take Redis
refuses for good fails it (LimitError: retry, then dead), never rescheduled for ever. A limiter
key of the wrong type is no such refusal: it is moved to quarantine at once and the take made
again (broker/quarantine.py).

The concurrency places a run took are given back when it ends (:meth:`Ticket.release`); if its
process dies first, their leases lapse (upkeep.py).
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Union

from redis.exceptions import ResponseError

from ...broker.keys import Keys, Want
from ...broker.quarantine import run_script
from ...broker.types import RedisClient
from ...engine.settle.retry import Filing
from ...errors import LimitError, LimitKeyError, OverLimit, is_unavailable
from ...push import payload as payloads
from . import scripts
from .held import Packing, Release, Releases  # noqa: F401 - (Release, Releases: importers, the tests)
from .limiter import HELD, SEEN, Limiter, holder_token, wake

if TYPE_CHECKING:
    from ...engine.settle.retry import RetryPolicy

logger = logging.getLogger(__name__)

BACKOFF_MAX = 60.0  # seconds: the longest a concurrency limit's refusal waits before the next try
CONCURRENT_BACKOFF = 1.0  # seconds: the shortest (a freed place wakes a waiting job sooner: LIMIT_PARK)
UNREACHABLE_DELAY = 2.0  # seconds: a job whose limits Redis didn't answer for is tried again after
_HOLDING = frozenset({"concurrent", "window"})  # the kinds whose takes a holder's token names


class Ticket:
    """The concurrency places a run holds: given back by ``release`` when it ends."""

    __slots__ = ("gate", "token", "taken", "holds")

    def __init__(self, gate: LimitGate, token: str, taken: list[tuple[Limiter, str]], holds: list[int]):
        self.gate, self.token, self.taken, self.holds = gate, token, taken, holds

    def release(self) -> None:
        """Give the places back; never raises (a place not given back lapses with its lease)."""
        for hold in self.holds:
            HELD.remove(hold)
        try:
            self.gate.give_back(self.taken, self.token, "release")
        except Exception as exc:
            logger.error("limits %s: places not given back (%s: %s); they free when their lease lapses",
                         ", ".join(key for _l, key in self.taken), type(exc).__name__, payloads.printable(exc))


# What a take got a job: its places (a Ticket), none to hold (None), a refusal, or what failed.
Taken = Union["Ticket", None, OverLimit, BaseException]  # noqa: UP007


class Rescheduled(NamedTuple):
    """A job sent back to the schedule instead of running: its filing (the settlement), and the
    concurrency limit to wait on (parked once the filing is settled: see ``park``)."""

    filing: Filing
    refused: OverLimit | None


class LimitGate:
    """Created by the Launcher, shared by the processor threads (no state of its own but the rng)."""

    def __init__(self, redis: RedisClient, keys: Keys, *, over_limit_max: int, retry: RetryPolicy,
                 clock: Any = time.time, rng: random.Random | None = None):
        self.redis = redis
        self.keys = keys
        self.over_limit_max = over_limit_max
        self.retry = retry
        self.clock = clock
        self.rng = rng or random.Random()
        self.packing = Packing(keys)
        self._warned: set[str] = set()  # (the keys found with two specs: said once each)

    def take(self, payload: dict, limits: Any) -> Ticket | Rescheduled | None:
        """Take a place in each of ``limits`` for the job: its Ticket (None when it holds no
        concurrency place), or the Rescheduled to settle instead of running it.

        Raises LimitError (a key function failed: LimitKeyError; Redis refused the take for good)
        or OverLimit (refused once more than OVER_LIMIT_MAX allows): filed as the job's failure.
        """
        return self.resolve(payload, self._take_one(payload, limits))

    def take_many(self, wanted: Sequence[tuple[dict, Any]]) -> list[Taken]:
        """The takes of the jobs one fetch brought (``(payload, limits)`` each), in one round trip:
        one LIMIT_TAKE_MANY of them all (packing.py; on a cluster, where a job's keys may be in
        several slots, one take after another). What each got, for :meth:`resolve` when the job is about
        to run: its Ticket, None (no place held), the OverLimit refusing it, or what failed."""
        if self.keys.spread:
            return [self._take_one(payload, limits) for payload, limits in wanted]
        asks: list[tuple[int, list[tuple[Limiter, str]], str, str, str]] = []
        outcomes: list[Taken] = []
        for index, (payload, limits) in enumerate(wanted):
            try:
                keyed, token, refusal, parked = self._ask(payload, limits)
            except Exception as exc:  # (a key function that raised: LimitKeyError, filed as its failure)
                outcomes.append(exc)
                continue
            outcomes.append(None)
            asks.append((index, keyed, token, refusal, parked))
        if not asks:
            return outcomes
        alone = self._two_specs(asks)
        together = [ask for ask in asks if ask[0] not in alone]
        names, argv = self.packing.many([(keyed, (refusal, token, parked))
                                         for _i, keyed, token, refusal, parked in together])
        try:
            # (A key of the wrong type stops the call before its first write: moved aside, the
            # call is made again, each refusal counted once.)
            replies = run_script(scripts.LIMIT_TAKE_MANY, self.redis, self.keys, names, argv,
                                 functools.partial(self._expected, [pair for ask in together for pair in ask[1]]))
        except ResponseError:  # (refused for good: each take alone, for its own outcome)
            replies = [None] * len(together)
        except Exception as exc:  # (the round trip failed: every take did, uncounted)
            for index, *_rest in asks:
                outcomes[index] = exc
            return outcomes
        for (index, keyed, token, refusal, parked), reply in zip(together, replies, strict=True):
            if reply is None:
                outcomes[index] = self._take_keyed(keyed, token, refusal, parked)
            else:
                outcomes[index] = self._granted(keyed, token, reply)
        for index, keyed, token, refusal, parked in asks:
            if index in alone:  # (after the call: each alone reads what the call wrote)
                outcomes[index] = self._take_keyed(keyed, token, refusal, parked)
        return outcomes

    def _two_specs(self, asks: list[tuple[int, list[tuple[Limiter, str]], str, str, str]]) -> set[int]:
        """The asks that count a limiter key with another spec than the call's first for it: taken
        alone after the call. (The call keeps a key's reads and grants per spec: two specs of one
        key counted only their own, 5 places granted of a limit of 3.)"""
        specs: dict[str, tuple] = {}
        alone = set()
        for index, keyed, *_rest in asks:
            for limiter, key in keyed:
                spec = specs.setdefault(key, limiter.spec())
                if spec != limiter.spec():
                    alone.add(index)
                    if key not in self._warned:
                        self._warned.add(key)
                        logger.warning("limiter key %s is counted by limiters of two specs (%s and %s): each "
                                       "checks the shared count against its own (periods differing, neither "
                                       "holds)", payloads.printable(key), spec, limiter.spec())
        return alone

    def _ask(self, payload: dict, limits: Any) -> tuple[list[tuple[Limiter, str]], str, str, str]:
        args, kwargs = payload.get("args"), payload.get("kwargs")
        keyed = [(limiter, limiter.key_for(args, kwargs)) for limiter in limits]
        over = _count(payload.get("over_limit"))
        refusal = "fail" if over >= self.over_limit_max else "reschedule"
        # (Refused before, it was parked in its concurrency limits' waiting sets: granted, or
        # refused and parked anew, its entry there goes. Asked of every take, not only of a job
        # counting reschedules: a failure resets the count, and an entry left would waste a wake-up.)
        # A holder's token names a concurrency place or a window's start: a bucket or a leaky
        # limiter keeps neither, and its takes skip making one (a fifth of a bucket's take) and
        # sending it; one with no concurrency limit is never parked either.
        kinds = {limiter.kind for limiter, _key in keyed}
        token = holder_token(payload.get("jid")) if kinds & _HOLDING else ""
        return keyed, token, refusal, str(payload.get("jid")) if "concurrent" in kinds else ""

    def _take_one(self, payload: dict, limits: Any) -> Taken:
        try:
            keyed, token, refusal, parked = self._ask(payload, limits)
        except Exception as exc:
            return exc
        return self._take_keyed(keyed, token, refusal, parked)

    def _take_keyed(self, keyed: list[tuple[Limiter, str]], token: str, refusal: str, parked: str) -> Taken:
        """LIMIT_TAKE of ``keyed``, through the quarantine guard (on a cluster one key at a time, a
        later refusal giving back what the earlier ones took)."""
        taken: list[tuple[Limiter, str]] = []
        try:
            for group in ([keyed] if not self.keys.spread else [[pair] for pair in keyed]):
                reply = run_script(scripts.LIMIT_TAKE, self.redis, self.keys,
                                   *self._script_args(group, token, refusal, parked),
                                   functools.partial(self._expected, group))
                granted = self._granted(group, token, reply, hold=False)
                if isinstance(granted, OverLimit):
                    if taken:
                        self.give_back(taken, token, "undo")
                    return granted
                taken += group
        except Exception as exc:
            if taken:
                self._give_back_quietly(taken, token)
            return exc
        return self._granted(keyed, token, [1])

    def _granted(self, keyed: list[tuple[Limiter, str]], token: str, reply: Any, hold: bool = True) -> Taken:
        """What a LIMIT_TAKE's reply gave: the refusal, or (``hold``) the Ticket of the places held."""
        if int(reply[0]) != 1:
            limiter, key = keyed[int(reply[1]) - 1]
            after = reply[2].decode() if isinstance(reply[2], bytes) else str(reply[2])
            return OverLimit(key, limiter.kind, float(after) if after else None)
        if not hold:
            return None
        for limiter, key in keyed:
            SEEN.add(key, limiter)
        held = [(limiter, key) for limiter, key in keyed if limiter.kind == "concurrent"]
        if not held:
            return None
        return Ticket(self, token, held, [HELD.add(key, limiter.lease or 0.0, token) for limiter, key in held])

    def resolve(self, payload: dict, taken: Taken) -> Ticket | Rescheduled | None:
        """What a take means for the job about to run: its Ticket (or None), or the Rescheduled to
        settle instead; raises what is filed as its failure (see :meth:`take`)."""
        if taken is None or isinstance(taken, Ticket):
            return taken
        if isinstance(taken, OverLimit):
            rescheduled = self.reschedule(payload, taken)
            if rescheduled is None:
                raise taken
            return rescheduled
        if isinstance(taken, LimitKeyError) or not is_unavailable(taken):
            if isinstance(taken, LimitError):
                raise taken
            # Refused for good (a script error that no waiting mends): rescheduled uncounted,
            # such a job came back every UNREACHABLE_DELAY for ever. Filed as its failure.
            raise LimitError(f"its limits could not be taken: {type(taken).__name__}: "
                             f"{payloads.printable(taken)}") from taken
        # Redis away or refusing: the job hasn't run; it goes back to the schedule (kept in
        # memory by the settler until Redis takes it), without counting as over its limit.
        logger.error("jid=%s: its limits could not be taken (%s: %s); tried again in %.0fs",
                     payloads.printable(payload.get("jid")), type(taken).__name__, payloads.printable(taken),
                     UNREACHABLE_DELAY)
        return Rescheduled(self._schedule(payload, UNREACHABLE_DELAY), None)

    def _script_args(self, group: list[tuple[Limiter, str]], token: str, mode: str,
                     parked: str | None = None) -> tuple[list, list]:
        keys: list[str] = []
        argv: list[Any] = [token, mode] if parked is None else [token, mode, parked]
        for limiter, key in group:
            keys += self.keys.limit(key)
            argv += limiter.argv()
        return keys, argv

    def _expected(self, group: list[tuple[Limiter, str]]) -> dict[str, Want]:
        return {key: want for _limiter, key in group for key, want in self.keys.limit(key).expected().items()}

    def give_back(self, taken: list[tuple[Limiter, str]], token: str, mode: str) -> None:
        """LIMIT_RELEASE of ``taken`` (one call per key on a cluster); a job waiting for a place given
        back goes to its queue at once (limiter.py's ``wake``)."""
        for group in ([taken] if not self.keys.spread else [[pair] for pair in taken]):
            reply = run_script(scripts.LIMIT_RELEASE, self.redis, self.keys, *self._script_args(group, token, mode),
                               functools.partial(self._expected, group))
            if len(reply) > 1:
                wake(self.redis, self.keys, reply[1:])

    def _give_back_quietly(self, taken: list[tuple[Limiter, str]], token: str) -> None:
        try:
            self.give_back(taken, token, "undo")
        except Exception as exc:  # (a concurrency place lapses with its lease)
            logger.warning("limits %s: taken places not given back (%s: %s)", ", ".join(key for _l, key in taken),
                           type(exc).__name__, payloads.printable(exc))

    def reschedule(self, payload: dict, refused: OverLimit, counted: bool = True) -> Rescheduled | None:
        """Send a job refused by a limit back to the schedule, with a backoff; None when it has
        been OVER_LIMIT_MAX times already (then it fails with ``refused``, and counts afresh).

        ``counted``: the limiter's stats already say what became of it (a refusal at fetch counts
        it in its LIMIT_TAKE); an OverLimit raised by the job (``within``) is counted here.
        """
        over = _count(payload.get("over_limit"))
        if not counted:
            self._count(refused.key, "fail" if over >= self.over_limit_max else "reschedule")
        if over >= self.over_limit_max:
            payload.pop("over_limit", None)
            return None
        payload["over_limit"] = over + 1
        delay = self.backoff(refused.retry_after, over + 1, refused.kind)
        logger.info("over limit jid=%s class=%s limiter=%s: rescheduled in %.2fs (%d of OVER_LIMIT_MAX %d)",
                    payloads.printable(payload.get("jid")), payloads.printable(payload.get("class")),
                    payloads.printable(refused.key), delay, over + 1, self.over_limit_max)
        return Rescheduled(self._schedule(payload, delay), refused if refused.kind == "concurrent" else None)

    def park(self, rescheduled: Rescheduled) -> None:
        """Once its filing is settled: wake the poller when it is due, and park a job refused by a
        concurrency limit in the limit's waiting set (woken by the next place given back: LIMIT_PARK)."""
        filing, refused = rescheduled
        self.retry.wake(filing.score, filing.payload.get("jid"))
        if refused is None:
            return
        try:
            lk = self.keys.limit(refused.key)
            run_script(scripts.LIMIT_PARK, self.redis, self.keys, [lk.waiting, lk.parked],
                       [str(filing.payload.get("jid")), filing.raw(), repr(filing.score)], lk.expected)
        except Exception as exc:  # (it comes back at its due time all the same)
            logger.warning("jid=%s: not parked for a wake-up (%s: %s)", payloads.printable(filing.payload.get("jid")),
                           type(exc).__name__, payloads.printable(exc))

    def _count(self, key: str, outcome: str) -> None:
        try:
            lk = self.keys.limit(key)
            run_script(scripts.LIMIT_COUNT, self.redis, self.keys, [lk.stats], [outcome], lk.expected)
        except Exception as exc:  # (a count, never worth the job's filing)
            logger.warning("limiter %s: a %s not counted (%s: %s)", payloads.printable(key), outcome,
                           type(exc).__name__, payloads.printable(exc))

    def backoff(self, retry_after: float | None, count: int, kind: str) -> float:
        """Seconds before a refused job is tried again (its ``count``-th refusal), with jitter.

        A rate limiter says when a place frees: then, spread over a little more each time the job
        lost the race for it. A concurrency limit can't say: a refused job waits in the limit's
        ``waiting`` set, and each place given back sends the first waiting one to its queue at once
        (LIMIT_PARK, ``wake``). Its backoff is only the fallback for a place freed otherwise (a
        holder's lease lapsing): at least CONCURRENT_BACKOFF (or how long places are held
        lately, if longer), doubled with each refusal up to BACKOFF_MAX. Shorter, the jobs coming
        back by their backoff took the places freed before the woken ones reached them.
        """
        rng = self.rng
        if kind != "concurrent" and retry_after is not None:
            return retry_after + rng.uniform(0, 0.05 + 0.05 * min(count, 20) * min(retry_after + 0.1, 1.0))
        # Jittered below the cap too (x 0.5 to 1.5, the top cut at BACKOFF_MAX): jittered after
        # capping, a job held out long waited up to 1.5 x BACKOFF_MAX.
        wait = min(max(retry_after or 0.0, CONCURRENT_BACKOFF) * 2 ** min(count - 1, 10), BACKOFF_MAX)
        return rng.uniform(wait * 0.5, min(wait * 1.5, BACKOFF_MAX))

    def _schedule(self, payload: dict, delay: float) -> Filing:
        return Filing("schedule", self.clock() + delay, payload)


def _count(value: Any) -> int:
    return value if type(value) is int and value >= 0 else 0


