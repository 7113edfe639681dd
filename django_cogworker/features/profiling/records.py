"""A profile in Redis: ``profile:<id>``, a hash that lives a day, and the index ``profiles`` (id ->
when its run started), trimmed to a day and to ``KEPT`` ids as each profile is written.

Fields of ``profile:<id>``: ``label``, ``jid``, ``class``, ``queue``, ``attempt``, ``started``
(epoch seconds), ``elapsed`` (seconds), ``profiler`` ("cProfile", "pyinstrument"; "" when the run
went unprofiled, ``skipped`` saying why), ``error`` ("<class>: <message>" of what the job raised),
``identity`` (the worker process), ``top`` (JSON: the top functions, profilers.Session.top) and
``html`` (pyinstrument's page, zlib-compressed; absent past ``HTML_LIMIT``).

Written by the worker that ran the job in one pipeline (and a second round trip only when the
index holds more than ``KEPT``: the oldest ids and their hashes go). Read by the admin and the CLI
(api.py).
"""

from __future__ import annotations

import dataclasses
import json
import time
import zlib
from typing import Any

from ...broker.keys import Keys
from ...broker.types import RedisClient

TTL = 86_400  # seconds a profile is kept
KEPT = 500  # profiles the index keeps at most (the oldest go first): a bound on the memory they take
HTML_LIMIT = 256_000  # bytes of pyinstrument's page, compressed (a small job's: 77 KB, 26 KB compressed)
SUMMARY = ("label", "jid", "class", "queue", "attempt", "started", "elapsed", "profiler", "skipped", "error",
           "identity")


@dataclasses.dataclass
class Profile:
    """One profiled run as kept (``top`` empty in a listing, which reads the summary fields only)."""

    id: str
    label: str
    jid: str
    job_class: str
    queue: str = ""
    attempt: int = 1
    started: float = 0.0
    elapsed: float = 0.0
    profiler: str = ""
    skipped: str = ""
    error: str = ""
    identity: str = ""
    top: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    html_size: int = 0  # bytes of the compressed page kept; 0: none

    @property
    def has_html(self) -> bool:
        return self.html_size > 0

    def document(self, top: bool = True) -> dict[str, Any]:
        shown = {"id": self.id, "label": self.label, "jid": self.jid, "class": self.job_class, "queue": self.queue,
                 "attempt": self.attempt, "started": self.started, "elapsed": self.elapsed,
                 "profiler": self.profiler, "skipped": self.skipped or None, "error": self.error or None,
                 "identity": self.identity, "html": self.has_html}
        if top:
            shown["top"] = self.top
        return shown


def save(redis: RedisClient, keys: Keys, profile: Profile, html: str | None = None, now: float | None = None) -> None:
    """Write ``profile`` (and ``html``, compressed, when it fits) for a day; trim the index of what
    started over a day before ``now`` (this host's clock: a few seconds off trims as early or late)."""
    fields: dict[Any, Any] = {"label": profile.label, "jid": profile.jid, "class": profile.job_class,
                              "queue": profile.queue, "attempt": profile.attempt, "started": repr(profile.started),
                              "elapsed": repr(profile.elapsed), "profiler": profile.profiler,
                              "skipped": profile.skipped, "error": profile.error, "identity": profile.identity,
                              "top": json.dumps(profile.top)}
    if html:
        packed = zlib.compress(html.encode("utf-8", "replace"), 6)
        if len(packed) <= HTML_LIMIT:
            fields["html"] = packed
    key = keys.profile(profile.id)
    pipe = redis.pipeline(transaction=False)
    pipe.hset(key, mapping=fields)
    pipe.expire(key, TTL)
    pipe.zadd(keys.profiles, {profile.id: profile.started})
    pipe.zremrangebyscore(keys.profiles, "-inf", (time.time() if now is None else now) - TTL)
    pipe.zcard(keys.profiles)
    held = pipe.execute()[-1]
    if held > KEPT:
        _trim(redis, keys, held - KEPT)


def _trim(redis: RedisClient, keys: Keys, over: int) -> None:
    """The ``over`` oldest profiles go, their hashes with them (two writers at once delete twice: harmless)."""
    oldest = [_text(i) for i in redis.zrange(keys.profiles, 0, over - 1)]
    if oldest:
        pipe = redis.pipeline(transaction=False)
        pipe.delete(*(keys.profile(i) for i in oldest))
        pipe.zrem(keys.profiles, *oldest)
        pipe.execute()


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _number(value: Any, kind: type = float) -> Any:
    try:
        return kind(_text(value))
    except (TypeError, ValueError):
        return kind(0)


def from_fields(ident: str, fields: dict[str, Any]) -> Profile:
    """The Profile of a hash's fields (names as str; values as Redis gives them)."""
    try:
        top = json.loads(fields["top"]) if fields.get("top") else []
    except ValueError:
        top = []
    html = fields.get("html")
    return Profile(ident, _text(fields.get("label", "")), _text(fields.get("jid", "")),
                   _text(fields.get("class", "")), _text(fields.get("queue", "")),
                   _number(fields.get("attempt"), int), _number(fields.get("started")),
                   _number(fields.get("elapsed")), _text(fields.get("profiler", "")),
                   _text(fields.get("skipped", "")), _text(fields.get("error", "")),
                   _text(fields.get("identity", "")), top if isinstance(top, list) else [],
                   len(html) if isinstance(html, bytes) else 0)


def load(redis: RedisClient, keys: Keys, ident: str) -> Profile | None:
    """The whole profile ``ident`` (its HTML's size, not the HTML), or None if it is gone."""
    key = keys.profile(ident)
    pipe = redis.pipeline(transaction=False)
    pipe.hmget(key, [*SUMMARY, "top"])
    pipe.hstrlen(key, "html")
    values, html_size = pipe.execute()
    if values[0] is None:
        return None
    fields = dict(zip([*SUMMARY, "top"], values, strict=True))
    profile = from_fields(ident, fields)
    profile.html_size = int(html_size)
    return profile


def summaries(redis: RedisClient, keys: Keys, start: int, count: int) -> tuple[list[Profile], int]:
    """``count`` profiles from the ``start``-th newest (their summary fields), and how many the index holds."""
    pipe = redis.pipeline(transaction=False)
    pipe.zcard(keys.profiles)
    pipe.zrevrange(keys.profiles, start, start + count - 1)
    total, ids = pipe.execute()
    ids = [_text(i) for i in ids]
    if not ids:
        return [], int(total)
    pipe = redis.pipeline(transaction=False)
    for ident in ids:
        pipe.hmget(keys.profile(ident), list(SUMMARY))
        pipe.hstrlen(keys.profile(ident), "html")
    replies = pipe.execute()
    found = []
    for n, ident in enumerate(ids):
        values, html_size = replies[2 * n], replies[2 * n + 1]
        if values[0] is None:  # (expired before the index was trimmed of it)
            continue
        profile = from_fields(ident, dict(zip(SUMMARY, values, strict=True)))
        profile.html_size = int(html_size)
        found.append(profile)
    return found, int(total)


def html(redis: RedisClient, keys: Keys, ident: str) -> str | None:
    """Profile ``ident``'s HTML page, or None (gone, or none kept)."""
    packed = redis.hget(keys.profile(ident), "html")
    if not isinstance(packed, bytes):
        return None
    try:
        return zlib.decompress(packed).decode("utf-8", "replace")
    except zlib.error:
        return None
