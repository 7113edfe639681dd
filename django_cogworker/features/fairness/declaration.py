"""What the fairness feature declares (django_cogworker/declarations.py): its class and push options,
the rules that refuse what they can't mean together, the push hook that writes a job's ``group`` or
``priority`` as its payload's first field, and what it provides the core's ``api.Queue``.

``group``: which group of its queue a job is in; the queue's groups take turns (the core's fetch,
engine/fetch/, over the lanes broker/keys/families.py names). On a class: an id, ``"arg:N"``,
``"kwarg:name"`` or a function of the job's arguments returning the id (None: ungrouped); on
``set(...)``: the id itself (a str or an int), or None. ``priority`` (-100..100, 0: none): higher
runs first within the queue. ``group_limits``: a list of Limiter applied per group (limits.py).

Why the first field: the fetch script tells a grouped or prioritized payload by its opening text
(``{"group":"`` / ``{"priority":``), with no JSON decoding of every job it moves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...declarations import Declaration, Option
from ...errors import InvalidArgument
from . import options as opts
from .limits import check_group_limits


def _rule(cls: Any, where: str) -> None:
    refusal = opts.refusal(lambda name: getattr(cls, name, None), where)
    if refusal:
        raise InvalidArgument(refusal)


def _getter(job_class: Any, options: Mapping[str, Any]) -> Any:
    def get(name: str) -> Any:
        return options[name] if name in options else getattr(job_class, name, None)

    return get


def _pushes(job_class: Any, options: Mapping[str, Any]) -> bool:
    get = _getter(job_class, options)
    refusal = opts.refusal(get, getattr(job_class, "name", job_class.__qualname__), pushed=True)
    if refusal:  # (asked once per setter: a set(...) combining what the class can't is refused at it)
        raise InvalidArgument(refusal)
    return get("group") is not None or bool(get("priority"))


def _first(payload: dict[str, Any], field: str, value: Any) -> None:
    """Make ``field`` the payload's first key (rebuilt in place: the setter's callers hold this dict).
    A bulk push's copies carry the first job's field already: it is replaced, not kept after."""
    items = [(key, item) for key, item in payload.items() if key != field]
    payload.clear()
    payload[field] = value
    payload.update(items)


def _mark(payload: dict[str, Any], job_class: Any, options: Mapping[str, Any],
          head: Sequence[tuple[str, str]], due: float | None) -> None:
    """``group`` or ``priority`` as the payload's first field (before the encryption's seal: a class's
    group may read the clear arguments; a sealed job's may not, _rule refuses it)."""
    get = _getter(job_class, options)
    where = getattr(job_class, "name", job_class.__qualname__)
    group = opts.resolve(get("group"), payload.get("args") or (), payload.get("kwargs") or {}, where)
    priority = get("priority") or 0
    payload.pop("group", None)
    payload.pop("priority", None)
    if group is not None:
        _first(payload, "group", group)
    elif priority:
        _first(payload, "priority", priority)


def _provided(name: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        from . import api  # (read when the admin, the CLI or a shell first asks: a push never does)

        return getattr(api, name)(*args, **kwargs)

    call.__name__ = name
    return call


DECLARATION = Declaration(
    "fairness",
    options=(Option("group", None, opts.check_group, push=True, check_push=opts.check_push_group),
             Option("priority", 0, opts.check_priority, push=True, check_push=opts.check_push_priority),
             Option("group_limits", (), check_group_limits)),
    rules=(_rule,), pushes=_pushes, on_push=_mark,
    provides={name: _provided(name) for name in ("pause_group", "resume_group", "queue_groups")},
)
