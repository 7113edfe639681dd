"""What the expiry feature declares (django_cogworker/declarations.py): ``expires_in``, a class option and a
push option, and the ``expires_at`` it puts in a payload as it is pushed (hook.py drops a job
fetched past it).

``expires_in``: seconds after it is due (pushed, or its perform_at time) that a job still waiting
is dropped at fetch, never run; None: never.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...bounds import check_seconds
from ...declarations import Declaration, Option


def _seconds(value: Any, where: str) -> Any:
    check_seconds(value, where)
    return value


def _push_seconds(value: Any, name: str, job_class: Any) -> None:
    if value is not None:  # (None: the class's)
        check_seconds(value, f"{name}: expires_in")


def _pushes(job_class: Any, options: Mapping[str, Any]) -> bool:
    return options.get("expires_in", job_class.expires_in) is not None


def _expire(payload: dict[str, Any], job_class: Any, options: Mapping[str, Any],
            head: Sequence[tuple[str, str]], due: float | None) -> None:
    """``expires_at``: ``expires_in`` after the job is due (its push, or its perform_at time)."""
    created_at = payload["created_at"]
    due_in = 0.0 if due is None else max(due - created_at, 0.0)
    payload["expires_at"] = created_at + options.get("expires_in", job_class.expires_in) + due_in


DECLARATION = Declaration("expiry", options=(Option("expires_in", None, _seconds, push=True,
                                                    check_push=_push_seconds),),
                          pushes=_pushes, on_push=_expire)
