"""The errors of encrypted arguments, each a CogworkerError.

Which of them a worker meets decides a job's fate: :class:`KeyUnavailable` and
:class:`SealBroken` are :class:`~django_cogworker.errors.NotRetried` (no retry can open
what this worker can't: the job goes to dead at once, its arguments still sealed, to
be retried from there once the key is given back to the workers). :class:`UnsealedArguments`, a
SealBroken, refuses clear arguments written beside a seal.
"""

from __future__ import annotations

from ...errors import CogworkerError, ConfigError, NotRetried


class EncryptionError(CogworkerError):
    """Base of the errors of encrypted arguments."""


class NoEncryptionKeys(EncryptionError, ConfigError):
    """A job that asks for encryption pushed with no ``ENCRYPTION_KEYS``: nothing was pushed.

    (A ConfigError: it is the settings that are wrong, and a clear-text push in its place would
    be the one thing the job's author asked never to happen.)
    """


class KeyUnavailable(EncryptionError, NotRetried):
    """A job's arguments were sealed with a key that no entry of this worker's ``ENCRYPTION_KEYS`` is."""


class SealBroken(EncryptionError, NotRetried):
    """A job's sealed arguments don't open with the key they name: changed since they were sealed
    (or sealed for another job class), or not a sealed blob at all."""


class UnsealedArguments(SealBroken):
    """A sealed payload carries clear arguments its seal doesn't name: a keyword, or an argument other
    than a batch callback's status, written beside the seal after it was made (in Redis, or by a
    client middleware). Refused, never run: merged in, they ran the job with what anyone who can
    write to Redis chose (and an error quoting one filed it in dead)."""
