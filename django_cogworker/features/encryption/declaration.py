"""What the encryption feature declares (django_cogworker/declarations.py): ``encrypt``, a class option and a push
option, and the seal put on a payload as it is pushed.

``encrypt``: True: a job's arguments are stored AES-256-GCM encrypted with ENCRYPTION_KEYS
(docs/encryption.md); ``perform`` gets them clear (hook.py opens them for the run), ``self.payload``
has them sealed. A unique job's digest, which hashes its arguments, is keyed as well.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...declarations import Declaration, Option
from ...errors import InvalidArgument
from . import codec
from .keys import KeyRing, sealing_ring


def _flag(value: Any, where: str) -> Any:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{where} must be True or False, got {value!r}")
    return value


def _push_flag(value: Any, name: str, job_class: Any) -> None:
    if not isinstance(value, bool):
        raise InvalidArgument(f"encrypt must be True or False, got {value!r}")


def encrypts(job_class: Any, options: Mapping[str, Any]) -> bool:
    """Whether pushes of ``job_class`` with ``options`` (``set(...)``'s) seal their arguments."""
    return bool(options.get("encrypt", job_class.encrypt)) if options else bool(job_class.encrypt)


def push_ring(job_class: Any) -> KeyRing:
    """The ring a push seals with (the settings' ENCRYPTION_KEYS); NoEncryptionKeys if there is none."""
    from ...push import runtime  # (the Django edge: read on the first sealed push)

    return sealing_ring(runtime.get_config().encryption_keys, getattr(job_class, "name", job_class.__qualname__))


def seal(payload: dict[str, Any], job_class: Any, options: Mapping[str, Any],
         head: Sequence[tuple[str, str]] = (), due: float | None = None) -> None:
    """Seal ``payload``'s arguments (and key its unique digest, which hashes them) in place; its first
    ``len(head)`` arguments left clear, each the (kind, bound) its seal names (a batch callback's status)."""
    ring = push_ring(job_class)
    if "unique_digest" in payload:
        payload["unique_digest"] = ring.unique_digest(payload["unique_digest"])
    codec.seal_payload(payload, ring, head)


DECLARATION = Declaration("encryption", options=(Option("encrypt", False, _flag, push=True, check_push=_push_flag),),
                          pushes=encrypts, on_push=seal)
