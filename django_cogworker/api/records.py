"""What the listings return: a ``Page`` of items, and ``JobRecord``, one stored payload read leniently.

A record may hold only the first bytes of a big entry (and its last ones): a page reads each entry
through ``scripts.PREVIEW``, HEAD_BYTES of it on a list and DETAIL_BYTES on the entry's own page,
so a page costs what it shows, not what is stored. Such a record (``complete`` False) shows the
fields that can be read from either end; every action re-reads the whole entry first.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import re
from collections.abc import Callable
from typing import Any

from ..broker import scripts
from ..broker.types import RedisClient
from ..errors import PayloadError
from ..push import payload as payloads
from ._base import Poison, _number, reencode

HEAD_BYTES = 4_096  # of each entry a list reads (the digest of an entry without a usable jid is of these)
TAIL_BYTES = 2_048  # of its end, where the error fields are
DETAIL_BYTES = 262_144  # of an entry its own page reads and shows; the whole of it is a download
# Bytes of entries one script call copies at most (past one entry): Redis copies each entry whole
# into Lua, about 3 ms a megabyte, and serves no one else meanwhile.
CALL_BYTES = 8_000_000
_PLAIN_JID = re.compile(r"[A-Za-z0-9_.:@+=-]{1,128}\Z")  # fits a URL as it is
_SPACE = re.compile(r"[ \t\n\r]*")
_scanstring = json.decoder.scanstring  # type: ignore[attr-defined]  # (the parser's own, public in fact)


def _skip_space(text: str, pos: int) -> int:
    """The position of the first character at or after ``pos`` that isn't JSON white space."""
    match = _SPACE.match(text, pos)
    return match.end() if match else pos
_FIELD_START = re.compile(r"[{,][ \t\n\r]*\"")
_TAIL_TRIES = 64  # field starts tried in a tail (each a parse to its end)
_lenient = json.JSONDecoder()  # reads NaN and Infinity too: this is for showing, not for running


def _members(text: str, pos: int) -> tuple[dict[str, Any], int, bool]:
    """Read ``"key": value`` pairs of an object from ``pos`` (a quote): the fields read, where
    reading stopped, and whether the object's closing brace was reached."""
    fields: dict[str, Any] = {}
    while True:
        if text[pos:pos + 1] != '"':
            return fields, pos, False
        try:
            key, pos = _scanstring(text, pos + 1)
            pos = _skip_space(text, pos)
            if text[pos:pos + 1] != ":":
                return fields, pos, False
            value, pos = _lenient.raw_decode(text, _skip_space(text, pos + 1))
        except (ValueError, RecursionError):  # cut short, not JSON, or deeper than the parser goes
            return fields, pos, False
        fields[key] = value
        pos = _skip_space(text, pos)
        if text[pos:pos + 1] == "}":
            return fields, pos + 1, True
        if text[pos:pos + 1] != ",":
            return fields, pos, False
        pos = _skip_space(text, pos + 1)


def read_leniently(head: bytes, tail: bytes = b"") -> dict[str, Any]:
    """The top-level fields of a stored JSON object that can be read: from its start up to the
    first value that can't be (cut off, too deep, not JSON), and, from ``tail`` (its last bytes),
    the fields after the last such value. What a whole parse failed on, or never saw, is absent."""
    text = head.decode("utf-8", "replace")
    start = _skip_space(text, 0)
    fields = _members(text, _skip_space(text, start + 1))[0] if text[start:start + 1] == "{" else {}
    end_text = tail.decode("utf-8", "replace").rstrip(" \t\n\r")
    for tries, match in enumerate(_FIELD_START.finditer(end_text)):
        if tries == _TAIL_TRIES:
            break
        # The first place from which the rest reads as fields that close the object at the very
        # end is the top level: inside a nested value, its closing brackets come first.
        found, pos, closed = _members(end_text, match.end() - 1)
        if closed and pos == len(end_text):
            for key, value in found.items():
                fields.setdefault(key, value)
            break
    return fields


@dataclasses.dataclass
class Page:
    """One page of a list, ``number`` counted from 1.

    ``total`` is the size of the whole list, or for a filter the matches found;
    ``complete`` is False when a filter stopped at SCAN_LIMIT or MATCH_LIMIT.
    """

    items: list[Any]
    number: int
    per_page: int
    total: int
    filtered: bool = False
    scanned: int = 0
    complete: bool = True

    @property
    def pages(self) -> int:
        return max(math.ceil(self.total / self.per_page), 1)

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def has_next(self) -> bool:
        return self.number < self.pages


def preview(redis: RedisClient, key: Any, mode: str, first: int, count: int, head: int, make: Callable[..., Any],
            score: float | None = None) -> tuple[int, list[Any]]:
    """(the key's size, ``make(head, score, size=, tail=, position=)`` for up to ``count`` entries from
    ``first``), through ``scripts.PREVIEW``, CALL_BYTES a call."""
    made: list[Any] = []
    total, done = 0, 0
    while done < count:
        reply = scripts.PREVIEW(redis, [key], [mode, first + done, count - done, head, TAIL_BYTES,
                                               "" if score is None else repr(score), CALL_BYTES])
        total, read, rows = int(reply[0]), int(reply[1]), reply[2:]
        made += [make(rows[i], rows[i + 1], size=rows[i + 2], tail=rows[i + 3], position=first + done + i // 4)
                 for i in range(0, len(rows), 4)]
        if read == 0 or len(rows) < 4 * read:  # the end, or entries gone meanwhile
            break
        done += read
    return total, made


class JobRecord:
    """One stored payload, read leniently: an unreadable one is still shown, as ``(unparseable)``.

    ``raw`` is the entry's bytes, or its first ``len(raw)`` bytes when ``size`` (its length) is
    larger, with ``tail`` its last bytes; ``complete`` says which.
    """

    def __init__(self, raw: bytes | str, *, position: int | None = None, size: int | None = None,
                 tail: bytes = b""):
        self.raw = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
        self.position = position
        self.size = len(self.raw) if size is None else int(size)
        self.complete = self.size <= len(self.raw)
        self.parse_error: str | None = None
        if self.complete:
            try:
                self.payload: dict[str, Any] = payloads.decode(self.raw)
                return
            except PayloadError as exc:
                self.parse_error = str(exc)
            tail = self.raw[-TAIL_BYTES:]
        self.payload = read_leniently(self.raw, tail)

    def get(self, name: str, default: Any = None) -> Any:
        return self.payload.get(name, default)

    def __repr__(self) -> str:
        if self.parse_error:
            return f"<{type(self).__name__} (unparseable) {self.text[:60]!r}>"
        return f"<{type(self).__name__} jid={self.get('jid')} class={self.get('class')} args={self.get('args')!r:.80}>"

    @property
    def text(self) -> str:
        return self.raw.decode("utf-8", "replace")

    @property
    def jid(self) -> str | None:
        jid = self.payload.get("jid")
        return jid if isinstance(jid, str) else None

    @functools.cached_property
    def ident(self) -> str:
        """The jid; for a payload without one that fits a URL as it is (``tenant/42``), a digest of
        its first HEAD_BYTES and its size, which any page's read of it holds."""
        # (Of the first HEAD_BYTES only, so a list's read and the entry's own page agree.)
        jid = self.jid if self.size <= HEAD_BYTES else read_leniently(self.raw[:HEAD_BYTES]).get("jid")
        if isinstance(jid, str) and _PLAIN_JID.match(jid):
            return jid
        digest = "sha1:" + hashlib.sha1(self.raw[:HEAD_BYTES]).hexdigest()[:16]
        return digest if self.size <= HEAD_BYTES else f"{digest}-{self.size}"

    @property
    def poison(self) -> str | None:
        """Why this payload can't be written back (retried, moved), or None (unknown when not complete)."""
        if not self.complete or self.parse_error:
            return None
        try:
            reencode(self.payload)
        except Poison as exc:
            return exc.reason
        return None

    @property
    def read_in_part(self) -> bool:
        """Whether some of it isn't shown: only its ends were read, or a value couldn't be parsed."""
        return not self.complete or self.parse_error is not None

    @property
    def display_class(self) -> str:
        klass = self.payload.get("class")
        return klass if isinstance(klass, str) else payloads.UNPARSEABLE_CLASS

    @property
    def queue(self) -> str | None:
        queue = self.payload.get("queue")
        return queue if isinstance(queue, str) and queue else None

    @property
    def encrypted(self) -> bool:
        """Whether its arguments are sealed (encrypt): ``args`` is then "(encrypted)", ``kwargs`` empty."""
        return payloads.SEALED in self.payload

    @property
    def args(self) -> Any:
        if payloads.SEALED in self.payload:
            return payloads.SEALED_SHOWN
        return self.payload.get("args", [])

    @property
    def kwargs(self) -> Any:
        if payloads.SEALED in self.payload:
            return {}
        return self.payload.get("kwargs", {})

    @property
    def error_class(self) -> str | None:
        return self.payload.get("error_class")

    @property
    def error_message(self) -> str | None:
        return self.payload.get("error_message")

    @property
    def backtrace(self) -> list[str]:
        lines = self.payload.get("error_backtrace")
        return [str(line) for line in lines] if isinstance(lines, list) else []

    @property
    def retry_count(self) -> int | None:
        count = self.payload.get("retry_count")
        return count if isinstance(count, int) and not isinstance(count, bool) else None

    def time(self, name: str) -> float | None:
        """A timestamp field (``created_at``, ``enqueued_at``, ``failed_at``, ``retried_at``) as epoch seconds."""
        return _number(self.payload.get(name))
