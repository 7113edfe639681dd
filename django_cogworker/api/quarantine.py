"""Quarantined keys: ``QuarantinedKey``, a key the key guard moved aside (inspect, restore, delete), and
``Bounded``, the list a bounded keyspace scan returns.

The limits below are read from this module at call time: a test patches them here
(``monkeypatch.setattr(api.quarantine, "QUARANTINE_LIMIT", ...)``), not on ``api``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..broker import scripts
from ..broker.cluster import scan_page
from ..broker.keys import Keys
from ..broker.types import RedisClient
from . import _base
from ._base import ActionRefused, _defaults, _number, _text

KEYSPACE_SCAN_LIMIT = 200_000  # keys examined at most looking for quarantined keys
QUARANTINE_LIMIT = 200  # quarantined keys listed at most
SAMPLE_ITEMS = 5
SAMPLE_CHARS = 200


class Bounded(list):
    """A list from a bounded scan; ``complete`` is False when the scan stopped at its limit."""

    complete: bool = True


class QuarantinedKey:
    """A key the key guard moved aside because it held the wrong type (kept 30 days)."""

    def __init__(self, key: str, *, redis: RedisClient, keys: Keys):
        self.key = key
        self.redis, self.keys = redis, keys
        # quarantine:<original key>:<unix time>:<random>; the original may hold colons itself.
        # (On a cluster a queue's key is quarantined in the queue's slot: broker/keys/.)
        self.original = keys.quarantined_from(key) or ""
        parts = key.rsplit(":", 2)
        self.quarantined_at = _number(parts[1]) if len(parts) == 3 and self.original else None
        self.type = "none"
        self.size: int | None = None
        self.ttl: int | None = None
        self.sample: list[str] = []

    def __repr__(self) -> str:
        return f"<QuarantinedKey {self.key!r} from {self.original!r} ({self.type})>"

    @classmethod
    def all(cls, *, redis: RedisClient | None = None, keys: Keys | None = None) -> Bounded:
        """Up to QUARANTINE_LIMIT keys, found among at most KEYSPACE_SCAN_LIMIT (SCAN MATCH on the prefix)."""
        redis, keys = _defaults(redis, keys)
        found, cursor, scanned = Bounded(), 0, 0
        pattern = keys.quarantine_match
        while True:
            cursor, names = scan_page(redis, cursor, pattern, _base.SCAN_COUNT)
            scanned += _base.SCAN_COUNT
            found.extend(cls(_text(n), redis=redis, keys=keys) for n in names if cls.is_name(_text(n), keys))
            if not cursor:
                break
            if scanned >= KEYSPACE_SCAN_LIMIT or len(found) >= QUARANTINE_LIMIT:
                found.complete = False
                break
        unique_keys = {q.key: q for q in found}
        found[:] = sorted(unique_keys.values(), key=lambda q: (-(q.quarantined_at or 0), q.key))
        for q in found:
            q.load()
        return found

    @staticmethod
    def is_name(key: str, keys: Keys) -> bool:
        return keys.quarantined_from(key) is not None

    @classmethod
    def get(cls, key: str, *, redis: RedisClient | None = None, keys: Keys | None = None) -> QuarantinedKey | None:
        redis, keys = _defaults(redis, keys)
        if not cls.is_name(key, keys):
            return None
        q = cls(key, redis=redis, keys=keys)
        q.load()
        return q if q.type != "none" else None

    def load(self) -> None:
        """Read type, size, TTL and the first few elements."""
        # (Any: which reply each read gives follows the TYPE read first, which no annotation can say)
        r: Any = self.redis
        k, n = self.key, SAMPLE_ITEMS
        self.type = _text(r.type(k))
        self.ttl = int(r.ttl(k))
        reads: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
            "string": (lambda: r.strlen(k), lambda: [r.getrange(k, 0, SAMPLE_CHARS - 1)]),
            "list": (lambda: r.llen(k), lambda: r.lrange(k, 0, n - 1)),
            "set": (lambda: r.scard(k), lambda: r.sscan(k, 0, count=n)[1][:n]),
            "zset": (lambda: r.zcard(k), lambda: [f"{_text(m)} ({s!r})" for m, s in
                                                   r.zrange(k, 0, n - 1, withscores=True)]),
            "hash": (lambda: r.hlen(k), lambda: [f"{_text(f)}: {_text(v)}" for f, v in
                                                 list(r.hscan(k, 0, count=n)[1].items())[:n]]),
            "stream": (lambda: r.xlen(k), lambda: [f"{_text(i)} {fields}" for i, fields in r.xrange(k, count=n)]),
        }
        if self.type in reads:
            size, sample = reads[self.type]
            self.size = int(size())
            self.sample = [_text(item)[:SAMPLE_CHARS] for item in sample()]

    def delete(self) -> bool:
        return bool(self.redis.delete(self.key))

    def restore(self) -> bool:
        """Rename it back, without its expiry, only if the original key is absent; False otherwise.

        The key guard moves it again at its next check if it still holds the
        wrong type: fix it (or read it) first.
        """
        result = int(scripts.RESTORE_QUARANTINED(self.redis, [self.key, self.original], []))
        if result < 0:
            raise ActionRefused(f"{self.key} is gone (deleted, or expired)")
        return result == 1
