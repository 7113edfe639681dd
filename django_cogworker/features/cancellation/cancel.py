"""Cancelling a job by its jid: ``Job.cancel(jid)``, the admin's Cancel button, ``cogworker cancel JID``.

What :func:`cancel` does, in this order:

1. writes a request to the ``cancels`` hash first, so that a job moving between places while it
   is looked for (due and moved to its queue, fetched) is still stopped: every worker reads the
   hash each beat, drops a fetched job with a request before it starts, and tells a running one;
2. looks for the job waiting: in the schedule and retry sets (ZSCAN), then in each queue (read
   1,000 at a time). Found, it is removed (ZREM / LREM of its exact payload: atomic, and a
   no-op if a worker took it meanwhile, which the request then covers), its request withdrawn,
   and "removed" is returned;
3. else looks for it fetched or running (each process's in-progress list and workers hash):
   found, "signalled" is returned. The job stops when it reads ``self.cancelled``, or at once
   with ``interrupt`` (Cancelled raised in its thread, as a timeout is), within a heartbeat;
4. else raises JobNotFound (a job in the dead set too: delete it there), and the request is
   withdrawn; unless a live process uses basic fetch, which holds what it fetched in memory
   only, out of sight until its next beat: then the request is kept, and says so.

A job found whose class can't be cancelled (``Job.cancellable``: the hand-overs of batches, which
a chain or a parent batch waits for) is left where it is, waiting or running, and NotCancellable
says why; its request is withdrawn (a worker reading it meanwhile ignores it for such a job).

A cancelled job is counted in ``stat:cancelled``; a task's result reads FAILED with a Cancelled
error; a job of a batch counts as dead for its batch. Finding a waiting job reads the sets and
queues whole in the worst case: an operator's action, not one for a hot path.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

from ...bounds import check_text
from ...broker.keys import Keys, Want, for_config, glob_escape
from ...broker.quarantine import guarded
from ...broker.types import RedisClient
from ...errors import Cancelled, InvalidArgument, JobNotFound, NotCancellable
from ...push import payload as payloads
from ...push import scope
from ...push.job import registered
from ..batches import steps

logger = logging.getLogger(__name__)

CHUNK = 1000  # queue entries read per LRANGE while looking for a job
CHECK_EVERY = 1.0  # seconds: how often Job.cancelled asks Redis itself


def cancel(jid: str, interrupt: bool = False, *, redis: RedisClient | None = None, keys: Keys | None = None,
           batch_ttl: float | None = None) -> str:
    """Cancel job ``jid``: "removed" (it waited), "signalled" (it runs); JobNotFound otherwise."""
    if not isinstance(jid, str) or not jid:
        raise InvalidArgument(f"cancel takes a job's jid (a non-empty string), got {jid!r}")
    check_text(jid, "cancel's jid")  # (a lone surrogate raised UnicodeEncodeError from redis-py)
    if redis is None or keys is None or batch_ttl is None:
        from ...push import runtime

        config = runtime.get_config()
        redis = redis if redis is not None else runtime.get_redis()
        keys = keys if keys is not None else for_config(config)
        batch_ttl = batch_ttl if batch_ttl is not None else config.batch_ttl
    request = json.dumps({"at": time.time(), "interrupt": bool(interrupt)})
    # (``cancels`` of the wrong type: moved to quarantine, and the request written to a fresh one)
    guarded(redis, keys, {keys.cancels: Want("hash")}, lambda: redis.hset(keys.cancels, jid, request))
    payload = _remove_waiting(redis, keys, jid)
    if payload is not None:
        # (Its one copy is gone: the request would only cost every heartbeat a field for a day.)
        redis.hdel(keys.cancels, jid)
        error = Cancelled("cancelled before it ran")
        redis.incr(keys.stat_cancelled)
        _record(redis, keys, payload, error)
        steps.died(redis, keys, payload, "Cancelled", str(error), batch_ttl)
        logger.warning("cancelled jid=%s class=%s: removed before it ran", payloads.printable(jid),
                       payloads.printable(payload.get("class")))
        return "removed"
    if _fetched(redis, keys, jid):
        logger.warning("cancel requested for jid=%s, which runs%s", payloads.printable(jid),
                       ": interrupting it" if interrupt else "")
        return "signalled"
    if any(_matches(redis.zscan_iter(keys.dead, match=_pattern(jid), count=CHUNK), jid)):
        redis.hdel(keys.cancels, jid)
        raise JobNotFound(f"job {jid!r} is in the dead set: it won't run again (delete it there)")
    if _basic_fetch_runs(redis, keys):
        # A process with basic fetch holds what it fetched in memory only, shown by its next beat:
        # the request stays (a day), so such a process drops the job or stops it all the same.
        raise JobNotFound(f"no job {jid!r} is waiting, scheduled, retrying or known to run; a process with "
                          f"basic fetch may hold it unseen, so the request is kept and stops it there")
    redis.hdel(keys.cancels, jid)
    raise JobNotFound(f"no job {jid!r} is waiting, scheduled, retrying or running")


def asked(payload: dict[str, Any]) -> bool:
    """Job.cancelled: whether the run of ``payload`` on this thread was asked to stop."""
    run = scope.running.get()
    if run is None or run.payload is not payload:
        return False  # (a job made by hand, not run by a worker)
    if run.cancelled:
        return True
    now = time.monotonic()
    if now - run.checked >= CHECK_EVERY:
        run.checked = now
        try:
            from ...engine.run.cancels import read_request  # (a worker's: it runs the job)
            from ...push import runtime

            redis, keys = runtime.get_redis(), for_config(runtime.get_config())
            raw = guarded(redis, keys, {keys.cancels: Want("hash")},
                          lambda: redis.hget(keys.cancels, str(payload.get("jid"))))
            # (Garbage in the hash is no request: the heartbeat drops it, logged.)
            run.cancelled = raw is not None and read_request(raw, time.time()) is not None
        except Exception as exc:  # (Redis away: the heartbeat tells it once back)
            logger.warning("jid=%s: could not read its cancel request: %s", payloads.printable(payload.get("jid")), exc)
    return run.cancelled


def _pattern(jid: str) -> str:
    return f'*"jid":{glob_escape(json.dumps(jid, ensure_ascii=False))}*'


def _needle(jid: str) -> bytes:
    return f'"jid":{json.dumps(jid, ensure_ascii=False)}'.encode()


def _jid_of(raw: bytes) -> Any:
    try:
        return json.loads(raw).get("jid")
    except (ValueError, AttributeError):
        return None


def _matches(entries: Iterator[Any], jid: str) -> Iterator[bytes]:
    """The raw payloads among ``entries`` (members, or (member, score) pairs) whose jid is ``jid``."""
    needle = _needle(jid)
    for entry in entries:
        raw = entry[0] if isinstance(entry, tuple) else entry
        if needle in raw and _jid_of(raw) == jid:  # (the needle may be in its arguments too)
            yield raw


def _remove_waiting(redis: RedisClient, keys: Keys, jid: str) -> dict[str, Any] | None:
    """Remove ``jid`` from the schedule, retry or a queue; return its payload if it was there."""
    for zset in (keys.schedule, keys.retry):
        for raw in _matches(redis.zscan_iter(zset, match=_pattern(jid), count=CHUNK), jid):
            _refuse_if_not_cancellable(redis, keys, jid, raw)
            if redis.zrem(zset, raw):
                return json.loads(raw)
    for name in sorted(redis.smembers(keys.queues)):
        queue = keys.queue(name.decode() if isinstance(name, bytes) else name)
        start = 0
        while True:
            chunk = redis.lrange(queue, start, start + CHUNK - 1)
            for raw in _matches(iter(chunk), jid):
                _refuse_if_not_cancellable(redis, keys, jid, raw)
                if redis.lrem(queue, 1, raw):  # type: ignore[arg-type]
                    return json.loads(raw)
            if len(chunk) < CHUNK:
                break
            start += CHUNK - 10  # (overlapping: a fetch from the other end shifts the list meanwhile)
    return None


def _fetched(redis: RedisClient, keys: Keys, jid: str) -> bool:
    """Whether some process holds ``jid``: on its in-progress list, or running it (workers hash)."""
    lists = []
    queues = [q.decode() if isinstance(q, bytes) else q for q in redis.smembers(keys.queues)] if keys.spread else []
    for identity in redis.smembers(keys.in_progress_identities):
        identity = identity.decode() if isinstance(identity, bytes) else identity
        if keys.spread:  # (one list per identity and queue, each in its queue's slot)
            lists += [keys.in_progress(identity, queue) for queue in queues]
        else:
            lists.append(keys.in_progress(identity))
    for key in lists:
        for raw in _matches(iter(redis.lrange(key, 0, -1)), jid):
            _refuse_if_not_cancellable(redis, keys, jid, raw)
            return True
    needle = _needle(jid)
    for identity in redis.smembers(keys.processes):
        identity = identity.decode() if isinstance(identity, bytes) else identity
        for run in redis.hvals(keys.workers(identity)):
            try:
                text = json.loads(run).get("payload", "").encode()
            except (ValueError, AttributeError):
                continue
            if needle in text and _jid_of(text) == jid:  # (the needle may be in its arguments too)
                _refuse_if_not_cancellable(redis, keys, jid, text)
                return True
    return False


def _refuse_if_not_cancellable(redis: RedisClient, keys: Keys, jid: str, raw: bytes) -> None:
    """Raise NotCancellable, the request withdrawn and the job left where it is, for a job whose class
    can't be cancelled: a batch's hand-over (a chain's next step, a child batch telling its parent),
    cancelled, left its chain or batch waiting for ever."""
    payload = json.loads(raw)
    job_class = registered(payload["class"]) if isinstance(payload.get("class"), str) else None
    if job_class is not None and not getattr(job_class, "cancellable", True):  # (declaration.py)
        redis.hdel(keys.cancels, jid)
        raise NotCancellable(job_class.cancel_refusal(payload))


def _basic_fetch_runs(redis: RedisClient, keys: Keys) -> bool:
    """Whether a live process uses basic fetch (its process hash's info says so)."""
    for identity in redis.smembers(keys.processes):
        info = redis.hget(keys.process(identity.decode() if isinstance(identity, bytes) else identity), "info")
        try:
            if info and json.loads(info).get("fetch") == "basic":
                return True
        except (ValueError, AttributeError):
            continue
    return False


def _record(redis: RedisClient, keys: Keys, payload: dict[str, Any], error: BaseException) -> None:
    """A task's result (a job's that keeps one): FAILED with ``error``, for as long as it was kept."""
    jid = str(payload.get("jid"))
    ttl = redis.ttl(keys.result(jid))
    if ttl is not None and ttl > 0:
        # (Imported here: this module is imported with the package, by every process that pushes,
        # and a web process must not load the engine; tests/fast/test_client.py checks it.)
        from ..results.writer import ResultWriter

        ResultWriter(redis, keys, "cancel").finished(payload, ttl, error=error, target="dead")

