"""``ENCRYPTION_KEYS``: checked at startup, and the ring of keys a process seals and opens with.

Each key is 32 random bytes in URL-safe base64 (44 characters, ``=`` included: what
:func:`new_key`, ``manage.py cogworker genkey`` and ``base64.urlsafe_b64encode(os.urandom(32))``
make). The first key of the list seals; every key opens (rotation: put the new key first, keep
the old ones after it until nothing sealed with them is left in Redis).

A key is never shown: not in an error (which names the entry's position and what is wrong with
it), not in ``repr(Config)``, not in a log line. What a sealed blob carries is its key's id, a
fingerprint (:func:`key_id`) that tells the keys of a ring apart and reveals nothing of them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import threading
from collections.abc import Sequence
from typing import Any

from .errors import KeyUnavailable, NoEncryptionKeys

SETTING = 'COGWORKER["ENCRYPTION_KEYS"]'
KEY_BYTES = 32  # AES-256
KEY_ID_CHARS = 8  # hex: 32 bits, enough to tell a handful of keys apart (a clash is tried key by key)
_ID_LABEL = b"cogworker encryption key id\x00"
_DIGEST_LABEL = b"cogworker unique digest\x00"
INSTALL_HINT = "pip install 'django-cogworker[encryption]'"


def new_key() -> str:
    """A fresh key: 32 random bytes in URL-safe base64."""
    return base64.urlsafe_b64encode(os.urandom(KEY_BYTES)).decode()


def key_id(key: bytes) -> str:
    """The fingerprint a sealed blob names its key by: a hash of the key, cut short."""
    return hashlib.sha256(_ID_LABEL + key).hexdigest()[:KEY_ID_CHARS]


def problems(value: Any) -> list[str]:
    """What is wrong with ``value`` as ENCRYPTION_KEYS, each naming the entry's position, never its value."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        # (not echoed: a lone key given without its list is exactly what this would print)
        return [f"{SETTING} must be a list of keys (the first seals, all open), got a {type(value).__name__}"]
    found: list[str] = []
    seen: dict[bytes, int] = {}
    for position, entry in enumerate(value):
        key, wrong = _decode(entry)
        if wrong:
            found.append(f"{SETTING}[{position}] must be {KEY_BYTES} random bytes in URL-safe base64 (as "
                         f"`manage.py cogworker genkey` prints), got {wrong}")
        elif key in seen:
            found.append(f"{SETTING}[{position}] is the same key as {SETTING}[{seen[key]}]")
        else:
            seen[key] = position
    if value and not found and not _crypto_available():
        found.append(f"{SETTING} needs the cryptography package: {INSTALL_HINT}")
    return found


def _keys(count: int) -> str:
    """``1 key``, ``2 keys`` (a worker with one key said "(1 keys)")."""
    return f"{count} key" if count == 1 else f"{count} keys"


def _decode(entry: Any) -> tuple[bytes, str]:
    """The key's bytes, or what is wrong with ``entry`` (its type or length, never its characters)."""
    if not isinstance(entry, str):
        return b"", f"a {type(entry).__name__}"
    try:
        key = base64.b64decode(entry.encode("ascii"), altchars=b"-_", validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return b"", f"{len(entry)} characters that aren't URL-safe base64"
    if len(key) != KEY_BYTES:
        return b"", f"{len(key)} bytes"
    return key, ""


def _crypto_available() -> bool:
    try:
        import cryptography.hazmat.primitives.ciphers.aead  # noqa: F401
    except ImportError:
        return False
    return True


class KeyRing:
    """The keys of one ENCRYPTION_KEYS list, as ciphers: the first seals, each opens what names its id.

    Built once per list (:func:`ring_for`) and shared by every thread: an ``AESGCM`` object is
    stateless between calls, and building one per job was a fifth of the cost of a seal.
    """

    def __init__(self, encoded: Sequence[str]):
        wrong = problems(list(encoded)) if encoded else []
        if wrong:
            raise ValueError("; ".join(wrong))
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        keys = [_decode(entry)[0] for entry in encoded]
        self._ciphers: list[tuple[str, Any]] = [(key_id(key), AESGCM(key)) for key in keys]
        # The unique digest of an encrypted job is keyed by the sealing key (see unique_digest).
        self._digest_key = hmac.new(keys[0], _DIGEST_LABEL, hashlib.sha256).digest() if keys else b""

    def __bool__(self) -> bool:
        return bool(self._ciphers)

    def __repr__(self) -> str:
        return f"KeyRing({_keys(len(self._ciphers))})"  # (never the keys: this is what a traceback's locals show)

    @property
    def sealing(self) -> tuple[str, Any]:
        """(id, cipher) of the key that seals: the first."""
        return self._ciphers[0]

    def opening(self, kid: str) -> list[Any]:
        """The ciphers of the keys whose id is ``kid`` (one, but for a clash of fingerprints)."""
        found = [cipher for key, cipher in self._ciphers if key == kid]
        if not found:
            raise KeyUnavailable(
                f"its arguments were encrypted with key {kid!r}, which is not among this worker's "
                f"{SETTING} ({_keys(len(self._ciphers))}); add that key to the list and retry it from dead")
        return found

    def unique_digest(self, digest: str) -> str:
        """A unique job's digest, keyed: a plain hash of the arguments in a key name (``unique:<digest>``)
        would let anyone who reads Redis test guesses of low-entropy arguments (a birth date, a card's
        last digits) against it. Rotating the sealing key changes it: a duplicate pushed across the
        rotation is not recognised as one."""
        return hmac.new(self._digest_key, digest.encode(), hashlib.sha256).hexdigest()


def sealing_ring(encoded: Sequence[str], job_name: str) -> KeyRing:
    """The ring a push of ``job_name`` seals with; NoEncryptionKeys (nothing pushed) if ``encoded`` is empty."""
    if not encoded:
        raise NoEncryptionKeys([
            f"{job_name} encrypts its arguments (encrypt=True) but {SETTING} is empty: nothing was pushed (its "
            f"arguments are never pushed in clear text instead). Set it to a list of keys; `manage.py cogworker "
            f"genkey` prints one"])
    return ring_for(encoded)


_rings: dict[tuple[str, ...], KeyRing] = {}
_rings_lock = threading.Lock()


def ring_for(encoded: Sequence[str]) -> KeyRing:
    """The shared ring of the list ``encoded`` (built on first use)."""
    key = tuple(encoded)
    ring = _rings.get(key)
    if ring is None:
        with _rings_lock:
            ring = _rings.get(key)
            if ring is None:
                ring = _rings[key] = KeyRing(key)
    return ring
