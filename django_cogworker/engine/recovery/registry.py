"""Reading the fleet's registries leniently: a member or a stamp no worker wrote is skipped and said.

Garbage in ``queues``, ``processes``, ``in_progress_identities`` or ``last_beat`` (a client that
wrote to the wrong key, a restore from elsewhere) must cost the fleet one log line, never the round
of the key guard or of orphan recovery that reads it.
"""

from __future__ import annotations

import logging
from typing import cast

from ...broker.keys import Keys
from ...broker.types import RedisClient
from ..loops import redis_time

logger = logging.getLogger(__name__)


def readable(member: bytes | str, key: str, seen: set[bytes]) -> str | None:
    """``member`` of the set ``key`` as text, or None (logged the first time) when it is not UTF-8."""
    if not isinstance(member, bytes):
        return member
    try:
        return member.decode()
    except UnicodeDecodeError:
        if member not in seen:
            seen.add(member)
            logger.error("%s holds %.100r, which is not UTF-8: skipped (no name the worker writes)", key, member)
        return None


def parse_beats(raw: dict[bytes, bytes]) -> dict[str, float]:
    """identity -> stamp; an unreadable stamp is logged and treated as missing (alive while its process hash is)."""
    beats = {}
    for field, value in raw.items():
        try:
            beats[field.decode()] = float(value)
        except (ValueError, UnicodeDecodeError):
            logger.error("unreadable last-beat stamp %.50r for %.100r: skipped", value, field)
    return beats


def beats_again(redis: RedisClient, keys: Keys, identity: str, threshold: float) -> bool:
    """Whether ``identity``'s last beat is younger than ``threshold`` now (Redis's clock), read
    again under its orphan lock: a process that woke from a stall stamps its beat before it starts
    a job it took ahead (fetch/stall.py); recovered after that, the job ran twice. Logged if so."""
    try:
        beat = float(cast(bytes, redis.hget(keys.last_beat, identity)))
    except (TypeError, ValueError):  # (none, or unreadable: no beat)
        return False
    if redis_time(redis) - beat >= threshold:
        return False
    logger.info("%s beat again before its list was recovered: left alone", identity)
    return True
