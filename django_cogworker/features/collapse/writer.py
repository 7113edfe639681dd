"""How a push that collapses is written: the push Client hands it here (declarations.py ``Writer``,
by its payload's ``collapse`` field) instead of writing it itself, and one script (COLLAPSE_PUSH)
writes it, replaces the job it collapses into, or drops it, by the state under its digest.

Where the job goes: a debounced job to the schedule, due ``debounce`` seconds from now (or at its
``perform_at`` time if later): only there can a later push find it and take its place. A throttled
or keep_last_if_active job to its queue, or the schedule if it is due later; on a cluster to the
schedule due now whatever it is (the state is in the home slot, the queue in a slot of its own: one
script can't write both; a poller moves it a moment later, as for a unique job). A keep_last
follow-up kept during a run keeps the time its push asked for (perform_in/perform_at): the run's end
writes it to the schedule at that time when it is later than the end.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from ...broker.quarantine import quarantine_key
from ...broker.types import RedisClient
from ...declarations import PushOutcome
from ...push import payload as payloads
from .scripts import COLLAPSE_PUSH

logger = logging.getLogger(__name__)

MODES = ("debounce", "throttle", "keep_last")


def write(redis: RedisClient, keys: Any, config: Any, payload: dict[str, Any], now: float, *,
          marked: bool = False) -> PushOutcome:
    """Write ``payload`` as its ``collapse`` field says; return what it came to. ``marked``: an outbox
    job (a row handed over at commit, or by a relay): written with its mark, and not again while
    the mark says it was handed over before (scripts.py, COLLAPSE_PUSH)."""
    mode, seconds, digest = payload["collapse"]
    at = payload.pop("at", None)
    if mode == "debounce":
        due: float | None = max(now + seconds, at or 0.0)
    elif at is not None and at > now:
        due = at
    else:
        due = now if keys.spread else None
    if due is None:
        payload["enqueued_at"] = now
    state = keys.collapse(digest)
    if mode == "debounce":
        # Until the job is due plus UNIQUE_LOCK_TTL, not a minute: a fleet whose pollers were down past
        # its due time plus a minute let the next push schedule a second job beside the first. Its
        # start lets the state go (hook.py), so this long TTL only bounds a fleet down that long.
        ttl = (due - now if due is not None else 0.0) + config.unique_lock_ttl
    elif mode == "throttle":
        ttl = seconds
    else:
        ttl = config.unique_lock_ttl
    queue = payload["queue"]
    destination = [keys.schedule, keys.outbox_marks()]
    if due is None:
        destination = [keys.queue(queue), keys.outbox_marks(), keys.queues]
    args = [mode, payload["jid"], payloads.encode(payload), "" if due is None else repr(due),
            max(math.ceil(ttl * 1000), 1), queue, keys.schedule_wake,
            repr(at) if mode == "keep_last" and at is not None and at > now else "", "1" if marked else ""]
    reply = COLLAPSE_PUSH(redis, [state, *destination], args)
    if _text(reply[0]) == "wrongtype":
        quarantine_key(redis, keys, state, "hash", "is no collapse state (the wrong type)")
        reply = COLLAPSE_PUSH(redis, [state, *destination], args)
    status, jid, other = (_text(part) for part in reply)
    if status == "dropped":
        logger.info("%s push of %s dropped: jid=%s stands for it", mode, payload["class"], jid)
    return PushOutcome(status, jid, other or None)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
