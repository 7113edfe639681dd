"""Sealing a payload's arguments, and opening them: AES-256-GCM, one nonce per seal.

A sealed payload keeps every field of its own in the clear (jid, class, queue, retry, the
failure fields...), so the engine moves, retries and files it as any other; only its arguments
are replaced::

    {"jid": "...", "class": "app.jobs.Charge", "args": [], "kwargs": {},
     "encrypted": "v1.3f9a0c21.<base64url(nonce | ciphertext | tag)>", ...}

The ciphertext is the JSON of ``[args, kwargs]``, authenticated with the job's class name (a blob
copied into another job class's payload doesn't open). ``3f9a0c21`` is the sealing key's id
(keys.key_id): a worker opens with the key of that id, or files the job in dead at once
(KeyUnavailable) if it has none.

``clear_head``: a batch callback's first argument is its batch's status, put there by a script
when it fires (a placeholder in the payload's JSON until then); it stays in ``args``, and what is
sealed comes after it: :func:`open_arguments` gives ``args + sealed args``.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Sequence
from typing import Any

from .errors import KeyUnavailable, SealBroken
from .keys import KeyRing

FIELD = "encrypted"  # the payload field that holds the sealed arguments
VERSION = "v1"
NONCE_BYTES = 12  # GCM's own size: a random one per seal (2**32 seals a key stays far from a clash)
_AAD = "cogworker args:"
_json = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode
_parse = json.JSONDecoder().decode
_InvalidTag: Any = None  # cryptography's, imported at the first open (an optional dependency)


class Encrypted(str):
    """What the admin and the CLI show for sealed arguments: "(encrypted)" (a str, so that it prints
    as such anywhere; the admin's filters show it without quotes)."""

    __slots__ = ()


SHOWN = Encrypted("(encrypted)")


def is_sealed(payload: dict[str, Any]) -> bool:
    return FIELD in payload


def seal(args: Sequence[Any], kwargs: dict[str, Any], job_class: str, ring: KeyRing) -> str:
    """The blob of ``args`` and ``kwargs`` (JSON-native, checked by the caller) for ``job_class``."""
    kid, cipher = ring.sealing
    nonce = os.urandom(NONCE_BYTES)
    sealed = cipher.encrypt(nonce, _json([list(args), kwargs]).encode(), (_AAD + job_class).encode())
    return f"{VERSION}.{kid}.{base64.urlsafe_b64encode(nonce + sealed).decode().rstrip('=')}"


def unseal(blob: Any, job_class: str, ring: KeyRing) -> tuple[list[Any], dict[str, Any]]:
    """``(args, kwargs)`` from ``blob``; KeyUnavailable if no key of ``ring`` is the one it names,
    SealBroken if it doesn't open (changed, another class's, not a blob)."""
    global _InvalidTag
    if _InvalidTag is None:
        from cryptography.exceptions import InvalidTag as _InvalidTag
    if not isinstance(blob, str) or blob.count(".") != 2:
        raise SealBroken(f"its {FIELD!r} field is not a sealed blob ({VERSION}.<key id>.<data>)")
    version, kid, data = blob.split(".")
    if version != VERSION:
        raise SealBroken(f"its arguments were sealed in format {version[:20]!r}, which this worker doesn't read")
    ciphers = ring.opening(kid)
    try:
        raw = base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))
    except (binascii.Error, ValueError):
        raise SealBroken("its sealed arguments are not base64") from None
    aad = (_AAD + job_class).encode()
    for cipher in ciphers:
        try:
            clear = cipher.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], aad)
        except (_InvalidTag, ValueError):
            continue
        args, kwargs = _parse(clear.decode())
        return args, kwargs
    raise SealBroken(f"its sealed arguments don't open with key {kid!r}: changed since they were sealed, "
                     f"or sealed for another job class than {job_class[:200]!r}")


def seal_payload(payload: dict[str, Any], ring: KeyRing, clear_head: int = 0) -> dict[str, Any]:
    """Seal ``payload``'s arguments in place (its first ``clear_head`` args stay); return it."""
    args = payload.get("args") or []
    payload[FIELD] = seal(args[clear_head:], payload.get("kwargs") or {}, payload["class"], ring)
    payload["args"] = list(args[:clear_head])
    payload["kwargs"] = {}
    return payload


def perform_arguments(job: Any, payload: dict[str, Any], ring: KeyRing | None) -> tuple[Sequence[Any], dict[str, Any]]:
    """The arguments ``job.perform`` is called with: the payload's, opened with ``ring`` if sealed.

    The one place a worker decrypts (the innermost step of its server chain, ``run_job``; the
    testing modes): the clear arguments go to the job (``job.arguments``) and to ``perform``,
    never into ``payload``, which stays sealed: it is what a failure files in retry or dead.
    KeyUnavailable / SealBroken (NotRetried: dead at once) if they can't be opened.
    """
    if FIELD not in payload:  # (a job that doesn't encrypt: one dict lookup)
        return payload.get("args", ()), payload.get("kwargs", {})
    args, kwargs = open_arguments(payload, ring)
    job.arguments = (args, kwargs)
    return args, kwargs


def open_arguments(payload: dict[str, Any], ring: KeyRing | None) -> tuple[list[Any], dict[str, Any]]:
    """The arguments ``perform`` is called with: the payload's, opened if sealed. The payload itself
    is left as it is (sealed): it is what gets filed in retry or dead if the run fails."""
    args = payload.get("args") or []
    blob = payload.get(FIELD)
    if blob is None:
        return args, payload.get("kwargs") or {}
    if ring is None or not ring:
        raise KeyUnavailable("its arguments are encrypted and this worker has no COGWORKER[\"ENCRYPTION_KEYS\"]; "
                             "configure the key it was sealed with and retry it from dead")
    opened, kwargs = unseal(blob, str(payload.get("class")), ring)
    return [*args, *opened], {**(payload.get("kwargs") or {}), **kwargs}
