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

The ciphertext of a payload that carries clear arguments beside its seal (``v2``) is the JSON of
``[args, kwargs, head]``: ``head`` names each clear argument the package put before the sealed
ones, as ``[kind, bound]``. There is one such: a batch callback's first argument, its batch's
status (``["batch status", "<event>"]``), written by a script when the callback fires (a
placeholder in the payload's JSON until then). :func:`open_arguments` gives ``clear args + sealed
args`` only when the clear ones are what the seal names; anything else beside a seal (an argument
or a keyword added in Redis, or by a client middleware, after the seal) is refused:
:class:`~.errors.UnsealedArguments`, dead at once, never run. The clear arguments were merged in
unchecked before: a ``kwargs`` written next to a blob ran the job with it.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Sequence
from typing import Any

from ...push.payload import SEALED, SEALED_SHOWN
from ...push.payload import Encrypted as Encrypted  # (re-exported: its home before push/payload.py)
from .errors import KeyUnavailable, SealBroken, UnsealedArguments
from .keys import KeyRing

FIELD = SEALED  # the payload field that holds the sealed arguments (the payload schema's: push/payload.py)
VERSION = "v1"  # sealed: [args, kwargs]; no clear argument beside it
HEAD_VERSION = "v2"  # sealed: [args, kwargs, head]; the clear arguments ``head`` names come first
BATCH_STATUS = "batch status"  # the kind of clear argument a batch callback's status is
NONCE_BYTES = 12  # GCM's own size: a random one per seal (2**32 seals a key stays far from a clash)
_AAD = "cogworker args:"
# (v2's own: its version is authenticated, so a v2 blob relabelled v1, which would drop its head, doesn't open.)
_AAD_HEAD = "cogworker args v2:"
_json = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode
_parse = json.JSONDecoder().decode
_InvalidTag: Any = None  # cryptography's, imported at the first open (an optional dependency)


SHOWN = SEALED_SHOWN  # what the admin and the CLI show for sealed arguments: "(encrypted)"


def is_sealed(payload: dict[str, Any]) -> bool:
    return FIELD in payload


def seal(args: Sequence[Any], kwargs: dict[str, Any], job_class: str, ring: KeyRing,
         head: Sequence[tuple[str, str]] = (), bound: str = "") -> str:
    """The blob of ``args`` and ``kwargs`` (JSON-native, checked by the caller) for ``job_class``;
    ``head``: the clear arguments its payload will carry before them, each as (kind, bound);
    ``bound``: clear text stored beside the blob that it opens only with (a workflow step's options)."""
    kid, cipher = ring.sealing
    nonce = os.urandom(NONCE_BYTES)
    if head:
        version, aad, clear = HEAD_VERSION, _AAD_HEAD, [list(args), kwargs, [[kind, bound] for kind, bound in head]]
    else:  # (v1 unchanged: a worker of the previous release opens what a job without a head is sealed in)
        version, aad, clear = VERSION, _AAD, [list(args), kwargs]
    sealed = cipher.encrypt(nonce, _json(clear).encode(), _aad(aad, job_class, bound))
    return f"{version}.{kid}.{base64.urlsafe_b64encode(nonce + sealed).decode().rstrip('=')}"


def unseal(blob: Any, job_class: str, ring: KeyRing, bound: str = "") -> tuple[list[Any], dict[str, Any]]:
    """``(args, kwargs)`` from ``blob``; KeyUnavailable if no key of ``ring`` is the one it names,
    SealBroken if it doesn't open (changed, another class's, not a blob, ``bound`` not what it was sealed with)."""
    args, kwargs, _head = open_blob(blob, job_class, ring, bound)
    return args, kwargs


def binding(value: Any) -> str:
    """``value`` (JSON-native) as the ``bound`` text of :func:`seal`: one text for equal values."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _aad(prefix: str, job_class: str, bound: str) -> bytes:
    # (Without ``bound``, v1's own: what a worker of the previous release seals and opens.)
    return (prefix + job_class + ("\x00" + bound if bound else "")).encode()


def open_blob(blob: Any, job_class: str, ring: KeyRing,
              bound: str = "") -> tuple[list[Any], dict[str, Any], list[list[str]]]:
    """``(args, kwargs, head)`` from ``blob`` (``head``: what the clear arguments before them must be)."""
    global _InvalidTag
    if _InvalidTag is None:
        from cryptography.exceptions import InvalidTag as _InvalidTag
    if not isinstance(blob, str) or blob.count(".") != 2:
        raise SealBroken(f"its {FIELD!r} field is not a sealed blob ({VERSION}.<key id>.<data>)")
    version, kid, data = blob.split(".")
    if version not in (VERSION, HEAD_VERSION):
        raise SealBroken(f"its arguments were sealed in format {version[:20]!r}, which this worker doesn't read")
    ciphers = ring.opening(kid)
    try:
        raw = base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))
    except (binascii.Error, ValueError):
        raise SealBroken("its sealed arguments are not base64") from None
    aad = _aad(_AAD_HEAD if version == HEAD_VERSION else _AAD, job_class, bound)
    for cipher in ciphers:
        try:
            clear = cipher.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], aad)
        except (_InvalidTag, ValueError):
            continue
        opened = _parse(clear.decode())
        if version == VERSION:
            return opened[0], opened[1], []
        return opened[0], opened[1], opened[2]
    raise SealBroken(f"its sealed arguments don't open with key {kid!r}: changed since they were sealed, "
                     f"or sealed for another job class than {job_class[:200]!r}")


def seal_payload(payload: dict[str, Any], ring: KeyRing, head: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """Seal ``payload``'s arguments in place (its first ``len(head)`` args stay, each what ``head``
    names: (kind, bound)); return it."""
    args = payload.get("args") or []
    payload[FIELD] = seal(args[len(head):], payload.get("kwargs") or {}, payload["class"], ring, head)
    payload["args"] = list(args[:len(head)])
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
    is left as it is (sealed): it is what gets filed in retry or dead if the run fails.

    Beside a seal, the payload's clear ``args`` are taken only as its seal names them (a batch
    callback's status), and its clear ``kwargs`` never: UnsealedArguments (dead, unrun) otherwise.
    """
    args = payload.get("args")
    blob = payload.get(FIELD)
    if blob is None:
        return args or [], payload.get("kwargs") or {}
    clear_kwargs = payload.get("kwargs")
    if clear_kwargs is not None and clear_kwargs != {}:  # (checked before the keys: no key makes it right)
        raise UnsealedArguments(f"its payload carries clear kwargs beside its sealed arguments "
                                f"({_names(clear_kwargs)}), which cogworker never puts there: {_REFUSED}")
    if ring is None or not ring:
        raise KeyUnavailable("its arguments are encrypted and this worker has no COGWORKER[\"ENCRYPTION_KEYS\"]; "
                             "configure the key it was sealed with and retry it from dead")
    opened, kwargs, head = open_blob(blob, str(payload.get("class")), ring)
    clear = [] if args is None else args
    problem = _head_problem(clear, head)
    if problem:
        raise UnsealedArguments(f"{problem}: {_REFUSED}")
    return [*clear, *opened], kwargs


_REFUSED = ("added after it was sealed (by a hand that can write to Redis, or a client middleware that adds "
            "arguments); refused, never run")


def _head_problem(clear: Any, head: list[list[str]]) -> str:
    """What is wrong with the clear arguments ``clear`` of a sealed payload whose seal names ``head``,
    or "". Never a value (a clear argument may be what someone made a job run with)."""
    allowed = " and ".join(f"a {kind} ({bound})" for kind, bound in head) or "none"
    if not isinstance(clear, list) or len(clear) != len(head):
        count = len(clear) if isinstance(clear, list) else f"a {type(clear).__name__} of"
        return (f"its payload carries {count} clear argument(s) beside its sealed ones, where its seal allows "
                f"{allowed}")
    for value, (kind, bound) in zip(clear, head, strict=True):
        if kind == BATCH_STATUS:
            # (The batch feature's, which writes it: imported here only when a callback opens.)
            from ..batches.callback_status import problem

            wrong = problem(value, bound)
        else:
            wrong = f"its seal names a clear argument of a kind this worker doesn't know ({kind[:40]!r})"
        if wrong:
            return wrong
    return ""


def _names(kwargs: Any) -> str:
    if not isinstance(kwargs, dict):
        return f"a {type(kwargs).__name__}"
    names = [repr(str(name)[:40]) for name in list(kwargs)[:5]]
    return ", ".join(names) + (f" and {len(kwargs) - 5} more" if len(kwargs) > 5 else "")
