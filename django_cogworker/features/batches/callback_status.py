"""The status a batch callback is handed (``perform(status, **options)``), as the ``status()`` of
scripts.py writes it into the callback's payload when its event fires, and its check where it
can't be taken on trust: beside a sealed payload (features/encryption/codec.py).

A callback whose job encrypts is sealed when it is set (``Batch.on``), its status still a
placeholder: the status stays clear, the one clear argument its seal allows, bound to the event
it was set for. The counts and the bid are made by Redis when the event fires and can't be sealed;
what is checked is that the value is such a status: these fields, of these types, of that event.
Someone who can write to Redis can still change a count or the description of a status, within
that shape (docs/encryption.md).
"""

from __future__ import annotations

from typing import Any

# field -> its type(s), as scripts.py's status() writes it (created_at is absent when the batch has none).
FIELDS: dict[str, tuple[type, ...]] = {
    "bid": (str,), "event": (str,), "total": (int,), "pending": (int,), "failures": (int,), "dead": (int,),
    "created_at": (int, float), "description": (str,)}
REQUIRED = ("bid", "event", "total", "pending", "failures", "dead", "description")


def problem(value: Any, event: str) -> str:
    """What keeps ``value`` from being the status of a callback set for ``event``, or "".

    Names the fields, never their values (a clear argument may be what someone made a job run with).
    """
    if not isinstance(value, dict):
        return f"its first argument, a batch status, is a {type(value).__name__}, not the status a batch writes"
    unknown = [repr(str(name)[:40]) for name in value if name not in FIELDS]
    if unknown:
        return f"its batch status has field(s) no batch writes: {', '.join(unknown[:5])}"
    missing = [name for name in REQUIRED if name not in value]
    if missing:
        return f"its batch status lacks {', '.join(missing)}"
    wrong = [name for name, kinds in FIELDS.items() if name in value and (
        not isinstance(value[name], kinds) or isinstance(value[name], bool)
        or (kinds == (int,) and value[name] < 0))]
    if wrong:
        return f"its batch status has {', '.join(wrong)} of a type or value no batch writes"
    if value["event"] != event:
        return f"its batch status is not of event {event!r}, the event this callback was set for"
    return ""
