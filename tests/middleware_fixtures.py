"""Client middleware importable by dotted path (``COGWORKER["CLIENT_MIDDLEWARE"]``) for the client tests."""

from __future__ import annotations

from typing import Any


class StampTenant:
    """Adds ``tenant`` to every payload, as a multi-tenant project would."""

    def __init__(self, push):
        self.push = push

    def __call__(self, payload: dict[str, Any]):
        payload["tenant"] = "acme"
        return self.push(payload)


class DropMarked:
    """Stops any push whose first argument is ``"drop"`` (returns None without calling on)."""

    def __init__(self, push):
        self.push = push

    def __call__(self, payload: dict[str, Any]):
        if payload["args"][:1] == ["drop"]:
            return None
        return self.push(payload)


class _Trail:
    label = ""

    def __init__(self, push):
        self.push = push

    def __call__(self, payload: dict[str, Any]):
        payload.setdefault("trail", []).append(self.label)
        return self.push(payload)


class TrailOuter(_Trail):
    label = "outer"


class TrailInner(_Trail):
    label = "inner"


class BreaksTheQueue:
    """Sets ``queue`` to a number (a bug in a project's middleware)."""

    def __init__(self, push):
        self.push = push

    def __call__(self, payload: dict[str, Any]):
        payload["queue"] = 5
        return self.push(payload)


class DropsTheJid:
    """Sets ``jid`` to None (a bug in a project's middleware)."""

    def __init__(self, push):
        self.push = push

    def __call__(self, payload: dict[str, Any]):
        payload["jid"] = None
        return self.push(payload)
