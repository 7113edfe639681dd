"""The one exception hierarchy of django-cogworker.

Redis errors are mapped at the boundary (``raise ... from exc``) only where the
caller must tell a lost connection (Redis away: retry at once, back nothing off)
from a deterministic failure (a key of the wrong type: back off, quarantine).
"""

from __future__ import annotations

import redis.exceptions


class CogworkerError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(CogworkerError):
    """Invalid configuration: the message names the setting and the value given."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__("; ".join(self.errors))


class PayloadError(CogworkerError):
    """A payload that cannot be decoded, or names no registered job."""


class UnknownJobError(PayloadError):
    """The payload's ``class`` is not a registered job name."""


def is_connection_error(exc: BaseException) -> bool:
    """Tell Redis being away (connection lost, timed out) from a command that failed."""
    return isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError))
