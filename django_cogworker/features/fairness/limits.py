"""``group_limits``: the fleet-wide limiters (features/limits/) applied per group, each group its own
limiter key, so that one tenant's 2 places are not another's.

A class's ``group_limits = [Limiter.concurrent("imports", 2)]`` counts a job of group ``acme`` in
queue ``default`` under the key ``imports@default/acme`` (family ``imports``: the admin's limits
page and the metrics sum a family's keys, so 10,000 groups make one series, not 10,000). The limits
feature's ClassLimits takes them with the class's own ``limits``, all or none in one LIMIT_TAKE
(features/standard.py hands it :data:`GROUP_LIMITS`); a refused job goes back to the schedule as
any limited job, and when due it comes back through its queue's list into its group (the fetch
files it there by its payload's ``group`` field). A concurrency place's lease is renewed by the
heartbeat and lapses if its process dies, as every concurrency place's.
"""

from __future__ import annotations

from typing import Any

from ...errors import CogworkerError, InvalidArgument
from ..limits.declaration import check_limits


def check_group_limits(value: Any, where: str) -> tuple[Any, ...]:
    """``group_limits`` as a tuple of Limiters of a static name (the group gives each its key)."""
    if value is None or value == ():
        return ()
    try:
        limits = check_limits(value, where)
    except InvalidArgument:
        raise
    except CogworkerError as exc:  # (the limits option's own error: here an argument refused, as the others)
        raise InvalidArgument(str(exc)) from None
    for i, limiter in enumerate(limits):
        if limiter.key_fn is not None:
            raise InvalidArgument(f"{where}[{i}] is keyed by a function ({limiter.family!r}); a group limit is "
                                  f"keyed by the job's group: give it a name (Limiter.concurrent('imports', 2))")
    return limits


def group_key(name: str, queue: str, group: str) -> str:
    """The limiter key of ``name`` for one group of one queue (braces, which a queue name may hold,
    made parentheses: a brace in a limiter key would move its keys' slot on a cluster)."""
    return f"{name}@{queue.replace('{', '(').replace('}', ')')}/{group}"


class GroupLimits:
    """What ClassLimits asks beside a class's own ``limits``: whether a class has group limits, and
    the limiters a payload's group takes (none for a job pushed ungrouped)."""

    @staticmethod
    def applies(job_class: Any) -> bool:
        return bool(getattr(job_class, "group_limits", ()))

    @staticmethod
    def limits(payload: dict[str, Any], job_class: Any) -> tuple[Any, ...]:
        group, queue = payload.get("group"), payload.get("queue")
        limits = getattr(job_class, "group_limits", ())
        if not limits or not isinstance(group, str) or not isinstance(queue, str):
            return ()
        return tuple(limiter.at(group_key(limiter.name, queue, group)) for limiter in limits)


GROUP_LIMITS = GroupLimits()
