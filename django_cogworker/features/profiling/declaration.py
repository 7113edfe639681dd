"""What the profiling feature declares (django_cogworker/declarations.py): ``profile``, a push option,
and the ``profile`` field it puts in a payload as it is pushed (hook.py runs that job profiled).

``profile``: a label for the profile ("why-slow"), given per push with ``set(profile=...)``; None
(the default) profiles nothing. Only the push's own option is read, never the class's attribute:
a class may well have a ``profile`` of its own (an AWS profile's name, a method), and a class
option would have profiled every run of every such class without anyone asking.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...bounds import check_text
from ...declarations import Declaration, Option
from ...errors import InvalidArgument

FIELD = "profile"
LABEL_LIMIT = 200  # characters of a label


def check_label(value: Any, where: str) -> str:
    """``value`` as a profile's label: a non-empty string of at most LABEL_LIMIT characters."""
    label = check_text(value, where)
    if len(label) > LABEL_LIMIT:
        raise InvalidArgument(f"{where} must be at most {LABEL_LIMIT} characters, got {len(label):,}")
    return label


def _push_label(value: Any, name: str, job_class: Any) -> None:
    if value is not None:  # (None: not profiled)
        check_label(value, f"{name}: profile")


def _pushes(job_class: Any, options: Mapping[str, Any]) -> bool:
    """Asked once per setter: a plain ``perform_async`` (no options) never runs the hook."""
    return options.get(FIELD) is not None


def _mark(payload: dict[str, Any], job_class: Any, options: Mapping[str, Any],
          head: Sequence[tuple[str, str]], due: float | None) -> None:
    payload[FIELD] = options[FIELD]  # (outside an encrypted job's seal: the seal takes args and kwargs)


# (``check`` None: a class's own ``profile`` is left as it is, whatever it holds; the default None
# is set on a class without one, as for every declared option.)
DECLARATION = Declaration("profiling", options=(Option(FIELD, None, None, push=True, check_push=_push_label),),
                          pushes=_pushes, on_push=_mark)
