"""What the limits feature declares (django_cogworker/declarations.py): the class option ``limits``, checked as a
class is defined, and the rule that a sealed job's limiters can't be keyed by its arguments.

``limits``: a list of :class:`~.limiter.Limiter`, places each run takes first (hook.py); over one,
the job is rescheduled. A class option only (no ``set(...)``).
"""

from __future__ import annotations

from typing import Any

from ...declarations import Declaration, Option
from ...errors import CogworkerError, InvalidArgument


def check_limits(limits: Any, where: str) -> tuple[Any, ...]:
    """``limits`` as a tuple of Limiters; CogworkerError naming ``where`` and the entry otherwise."""
    from .limiter import Limiter

    if isinstance(limits, (str, bytes)) or not isinstance(limits, (list, tuple)):
        raise CogworkerError(f"{where} must be a list of limiters (Limiter.concurrent(...), ...), got {limits!r}")
    for i, entry in enumerate(limits):
        if not isinstance(entry, Limiter):
            raise CogworkerError(f"{where}[{i}] must be a Limiter (Limiter.concurrent, bucket, window or leaky), "
                                 f"got {entry!r}")
    return tuple(limits)


def _keyed_by_sealed_arguments(cls: Any, where: str) -> None:
    # (A limiter's key is found before the run, from the payload's arguments: sealed, it has none.)
    if getattr(cls, "encrypt", False) and any(getattr(limiter, "key_fn", None) is not None for limiter in cls.limits):
        raise InvalidArgument(f"{where}: a job that encrypts its arguments can't have a limit keyed by "
                              f"them (its limiters' key functions would see none)")


DECLARATION = Declaration("limits", options=(Option("limits", (), check_limits),),
                          rules=(_keyed_by_sealed_arguments,))
