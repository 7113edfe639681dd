"""The checks of the fairness options (``group``, ``priority``, ``group_limits``) and the reading of
a push's group id: what declaration.py declares and its push hook calls.

A group id names a Redis key (``<queue key> lane:g:<id>``) and is found by the fetch script with a
Lua pattern in the payload's text (``{"group":"<id>"``): so it is 1 to GROUP_MAX characters of
GROUP_CHARS, never a quote, a backslash or a space, which would end the pattern early or make the
id JSON escapes (the script would then file the job under another group than the one it names).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...bounds import short_repr
from ...errors import InvalidArgument

GROUP_MAX = 100  # characters of a group id: a tenant's id, not a payload
GROUP_CHARS = "A-Za-z0-9_.:@/+=-"
_GROUP = re.compile(f"[{GROUP_CHARS}]{{1,{GROUP_MAX}}}")
PRIORITY_MIN, PRIORITY_MAX = -100, 100  # Django's Task.priority range
SELECTORS = ("arg:", "kwarg:")


def group_id(value: Any, where: str) -> str:
    """``value`` as a group id (a str, or an int made one); InvalidArgument naming ``where`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InvalidArgument(f"{where} must be a group id (a str or an int), got {short_repr(value)}")
    text = value if isinstance(value, str) else str(value)
    if not _GROUP.fullmatch(text):
        raise InvalidArgument(f"{where} must be 1 to {GROUP_MAX} characters of {GROUP_CHARS} (no quote, backslash "
                              f"or space: the fetch finds the id in the payload's text), got {short_repr(value)}")
    return text


def check_group(value: Any, where: str) -> Any:
    """A class's ``group``: None, a literal id, ``"arg:N"``, ``"kwarg:name"`` or a callable of the
    job's arguments. Kept as given (a literal int made a str)."""
    if value is None or callable(value):
        return value
    if isinstance(value, str) and value.startswith(SELECTORS):
        kind, _, rest = value.partition(":")
        if kind == "arg" and not (rest.isdigit() and rest.isascii()):
            raise InvalidArgument(f"{where} 'arg:N' takes an argument's position (0, 1, ...), got {value!r}")
        if kind == "kwarg" and not rest.isidentifier():
            raise InvalidArgument(f"{where} 'kwarg:name' takes a keyword argument's name, got {value!r}")
        return value
    return group_id(value, where)


def check_push_group(value: Any, name: str, job_class: Any) -> None:
    """``set(group=...)``: an id (str or int), or None for ungrouped; never a selector or a function
    (those say how a class finds the id in its arguments: a push gives the id itself)."""
    if value is not None:
        group_id(value, f"{name}: group")


def check_push_priority(value: Any, name: str, job_class: Any) -> None:
    check_priority(value, f"{name}: priority")


def check_priority(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise InvalidArgument(f"{where} must be a whole number from {PRIORITY_MIN} to {PRIORITY_MAX} "
                              f"(0: none), got {short_repr(value)}")
    return value


def computed(group: Any) -> bool:
    """Whether a class's ``group`` is read from the job's arguments (a selector or a callable)."""
    return callable(group) or (isinstance(group, str) and group.startswith(SELECTORS))


def resolve(group: Any, args: Sequence[Any], kwargs: Mapping[str, Any], where: str) -> str | None:
    """The group id of a push: ``group`` as the class or the push gives it, read from the
    arguments when it is a selector or a callable (None: ungrouped)."""
    if group is None:
        return None
    if callable(group):
        try:
            value = group(*args, **kwargs)
        except Exception as exc:
            raise InvalidArgument(f"{where}: its group function raised {type(exc).__name__}: {exc}") from exc
        return None if value is None else group_id(value, f"{where}: the id its group function returned")
    if isinstance(group, str) and group.startswith("arg:"):
        index = int(group[4:])
        if index >= len(args):
            raise InvalidArgument(f"{where}: group {group!r} reads argument {index}, but the push has "
                                  f"{len(args)} positional argument(s)")
        value = args[index]
        return None if value is None else group_id(value, f"{where}: group {group!r}")
    if isinstance(group, str) and group.startswith("kwarg:"):
        name = group[6:]
        if name not in kwargs:
            raise InvalidArgument(f"{where}: group {group!r} reads keyword argument {name!r}, which the push "
                                  f"doesn't give (pass it by name, or give set(group=...))")
        value = kwargs[name]
        return None if value is None else group_id(value, f"{where}: group {group!r}")
    return str(group)


def refusal(get: Callable[[str], Any], where: str, *, pushed: bool = False) -> str | None:
    """Why these options can't go together (``get(option)`` reads the class's, or a push's over its
    class's), or None."""
    group, priority = get("group"), get("priority")
    if group is not None and priority:
        return (f"{where}: group and priority can't be combined yet (a grouped job takes its group's turn, "
                f"a prioritized one its rank among the queue's: choose one; docs/fairness.md)")
    if not pushed and get("group_limits") and group is None:
        return (f"{where}: group_limits is given but group isn't: the limits are per group (each group its own "
                f"limiter key), so say which group a job is in (group = 'arg:0', 'kwarg:name', a function, or an id)")
    if computed(group) and get("encrypt"):
        return (f"{where}: a job that encrypts its arguments can't read its group from them (group={group!r}): "
                f"the id is stored in clear beside the sealed payload. Give it with set(group=...), "
                f"an id you accept to show")
    return None
