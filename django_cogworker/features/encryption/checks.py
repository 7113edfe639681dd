"""The system check of encrypted arguments (``cogworker.E020``, registered in checks.py).

A job class that encrypts, in a project with no ENCRYPTION_KEYS: every push of it would fail
(NoEncryptionKeys), and a worker could open none. Said by ``manage.py check`` and by
``runcogworker``, which refuses to start, instead of at the first push in production.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .keys import SETTING


def problems(job_classes: Mapping[str, Any], keys: Sequence[str]) -> list[str]:
    """One message per job class (or task) that encrypts when ``keys`` is empty."""
    if keys:
        return []
    return [f"{name} encrypts its arguments (encrypt=True) but {SETTING} is empty: each push of it would fail. "
            f"Set {SETTING} to a list of keys (`manage.py cogworker genkey` prints one)"
            for name, job_class in sorted(job_classes.items()) if getattr(job_class, "encrypt", False) is True]
