"""What the listings return: a ``Page`` of items, and ``JobRecord``, one stored payload read leniently."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any

from .. import payload as payloads
from ..errors import PayloadError
from ._base import _number


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


class JobRecord:
    """One stored payload, read leniently: an unreadable one is still shown, as ``(unparseable)``."""

    def __init__(self, raw: bytes | str, *, position: int | None = None):
        self.raw = raw if isinstance(raw, bytes) else raw.encode()
        self.position = position
        self.parse_error: str | None = None
        try:
            self.payload: dict[str, Any] = payloads.decode(self.raw)
        except PayloadError as exc:
            self.parse_error = str(exc)
            try:
                loaded = json.loads(self.raw)
            except (ValueError, RecursionError):
                loaded = None
            self.payload = loaded if isinstance(loaded, dict) else {}

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

    @property
    def ident(self) -> str:
        """The jid, or for a payload without one a digest of its bytes."""
        return self.jid or "sha1:" + hashlib.sha1(self.raw).hexdigest()[:16]

    @property
    def display_class(self) -> str:
        klass = self.payload.get("class")
        return klass if isinstance(klass, str) else payloads.UNPARSEABLE_CLASS

    @property
    def queue(self) -> str | None:
        queue = self.payload.get("queue")
        return queue if isinstance(queue, str) and queue else None

    @property
    def args(self) -> Any:
        return self.payload.get("args", [])

    @property
    def kwargs(self) -> Any:
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
