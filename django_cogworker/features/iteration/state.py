"""An iterable job's saved state in Redis: ``iteration:<jid>`` (its cursor, and how far it got) and
``iteration:longest`` (each class's longest single iteration seen, read at a worker's startup).

``iteration:<jid>`` (hash, all text): ``cursor`` (the JSON of the cursor after the last item done;
sealed, as its arguments are, when the job's payload is: codec.seal, bound to the jid so a cursor
copied into another job's hash doesn't open), ``done`` (items done over all its runs), ``runtime``
(seconds iterated over all its runs), ``executions`` (runs begun), ``started_at`` (epoch of the
first). Its TTL is set to the dead set's retention (DEAD_TIMEOUT) at each write: a job dead for good
keeps its cursor as long as the dead set keeps the job, and a retry from there resumes. When the
job succeeds, or ends for good out of the dead set (cancelled, discarded), the hook shortens its TTL
to ENDED_KEEP rather than deleting it: the job's ack may still be on its way (riding the next
fetch), and a kill -9 before it lands has the job run again: from its saved end, not from its start.

One round trip to begin a run (:meth:`State.begin`), one per checkpoint (:meth:`State.save`), which
carries the progress tracker's write too (``tracker.queue(pipe)``), and the class's longest
iteration when this process saw it grow.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...bounds import short_repr
from ...broker.keys import Keys
from ...broker.scripts._base import Script
from ...broker.types import RedisClient
from ...push import payload as payloads
from .errors import IterationError

# KEYS[1] = iteration:longest.
# ARGV[1] = a job class's name, ARGV[2] = seconds of one of its iterations.
# Keeps the longest: HSET only when ARGV[2] is more than what the hash holds. Returns 1 if written.
LONGEST = Script("""
local held = tonumber(redis.call("HGET", KEYS[1], ARGV[1]) or "") or 0
if tonumber(ARGV[2]) > held then
  redis.call("HSET", KEYS[1], ARGV[1], ARGV[2])
  return 1
end
return 0
""")

_encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode
_decode = json.JSONDecoder().decode

# class name -> the longest iteration this process wrote to ``iteration:longest`` (one write per
# growth, not per checkpoint; a race between two threads writes twice, harmlessly: the script keeps the max).
_written: dict[str, float] = {}


@dataclass(frozen=True)
class Saved:
    """What a run begins from: the cursor (None: from the start) and the counts of the runs before."""

    cursor: Any = None
    executions: int = 0  # runs begun before this one
    done: int = 0
    runtime: float = 0.0



# Seconds an ended job's state is kept: far longer than its ack can take to land (a fetch's round
# trip; a pending settlement retried through an outage of minutes), short beside DEAD_TIMEOUT.
ENDED_KEEP = 3600

def encode_cursor(cursor: Any, job_name: str) -> str:
    """The cursor as JSON text; IterationError naming the job and the value if JSON can't hold it."""
    try:
        return _encode(cursor)
    except (TypeError, ValueError, RecursionError) as exc:
        raise IterationError(f"{job_name}: its enumerator yielded a cursor JSON can't hold: {short_repr(cursor)} "
                             f"({type(exc).__name__}: {exc}); a cursor must be JSON (a number, text, a list...)"
                             ) from None


class State:
    """One run's view of ``iteration:<jid>``. Made by the hook for each run of an iterable job;
    used on the job's thread only. ``ring``: the encryption key ring when the payload is sealed
    (its cursor is sealed too), else None."""

    def __init__(self, redis: RedisClient, keys: Keys, jid: str, job_name: str, ttl: float,
                 ring: Any = None, clock: Callable[[], float] = time.time):
        self.redis = redis
        self.key = keys.iteration(jid)
        self.longest_key = keys.iteration_longest
        self.jid = jid
        self.job_name = job_name
        self.ttl = max(1, math.ceil(ttl))
        self.ring = ring
        self.clock = clock

    def begin(self) -> Saved:
        """Count this run and read what the runs before saved (one round trip)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self.key)
        pipe.hincrby(self.key, "executions", 1)
        pipe.hsetnx(self.key, "started_at", repr(self.clock()))
        pipe.expire(self.key, self.ttl)
        stored = pipe.execute()[0]
        fields = {_text(k): v for k, v in stored.items()}
        cursor = self._cursor(fields["cursor"]) if "cursor" in fields else None
        return Saved(cursor, _number(fields.get("executions"), int), _number(fields.get("done"), int),
                     _number(fields.get("runtime"), float))

    def save(self, cursor: Any, done: int, runtime: float, tracker: Any = None, longest: float = 0.0) -> None:
        """Write the cursor and the counts, with the tracker's report and the class's longest
        iteration if it grew (one round trip). Raises what Redis raises; IterationError for a cursor
        JSON can't hold."""
        text = encode_cursor(cursor, self.job_name)
        if self.ring is not None:
            from ..encryption import codec

            text = codec.seal([cursor], {}, self.job_name, self.ring, bound=self._bound)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.key, mapping={"cursor": text, "done": done, "runtime": repr(round(runtime, 6))})
        pipe.expire(self.key, self.ttl)
        if tracker is not None:
            tracker.queue(pipe)
        grew = longest > _written.get(self.job_name, 0.0)
        if grew:
            LONGEST.in_pipeline(pipe, [self.longest_key], [self.job_name, repr(round(longest, 6))])
        pipe.execute()
        if grew:
            _written[self.job_name] = longest

    @property
    def _bound(self) -> str:
        return f"iteration cursor:{self.jid}"

    def _cursor(self, stored: Any) -> Any:
        text = _text(stored)
        try:
            if self.ring is not None:
                from ..encryption import codec

                return codec.unseal(text, self.job_name, self.ring, bound=self._bound)[0][0]
            return _decode(text)
        except Exception as exc:
            raise IterationError(f"{self.job_name}: its saved cursor can't be read ({type(exc).__name__}: "
                                 f"{payloads.printable(exc)}); delete {self.key} to start it over") from exc


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _number(value: Any, kind: Callable[[Any], Any]) -> Any:
    """A count as stored; 0 when absent or unreadable (a hand-written hash is read leniently)."""
    try:
        return kind(float(_text(value))) if value is not None else kind(0)
    except (TypeError, ValueError, OverflowError):
        return kind(0)


def longest_by_class(redis: RedisClient, keys: Keys) -> dict[str, float]:
    """``iteration:longest``: each class's longest single iteration seen so far, in seconds."""
    return {_text(name): _number(seconds, float) for name, seconds in redis.hgetall(keys.iteration_longest).items()}
