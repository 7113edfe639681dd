"""What the collapse feature declares (django_cogworker/declarations.py): its class and push options,
the rule that refuses what they can't mean together, the ``collapse`` field put in a payload as it
is pushed, and the writer the push Client hands such a payload to (writer.py).

``debounce`` (seconds): a push while an equal job waits in the schedule takes its place, due
``debounce`` seconds from now: the last push of a burst runs, once. ``throttle`` (seconds): the
first push of a window is written; those after it in the window write nothing and get its jid.
``keep_last_if_active`` (True): a push while an equal job runs is kept as its one follow-up, written
when the run ends (a later push replaces it); one while it waits writes nothing. ``dedup_key`` (a
string): what makes two pushes equal (with the class and queue); None: the class, arguments and
queue, as for unique jobs (push/unique.py's digest). docs/fairness.md tells them apart.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ...bounds import check_seconds, check_text
from ...declarations import Declaration, Option, Writer
from ...errors import InvalidArgument
from ...push.unique import digest as arguments_digest
from . import writer

MODES = ("debounce", "throttle", "keep_last_if_active")
DEDUP_KEY_MAX = 200  # characters: a key, not a payload (it is hashed, but a megabyte of it is a bug)


def _seconds(value: Any, where: str) -> Any:
    check_seconds(value, where)  # (None: off; NaN, inf, negative, 0, a bool: refused, named)
    return value


def _flag(value: Any, where: str) -> Any:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{where} must be True or False, got {value!r}")
    return value


def _key(value: Any, where: str) -> Any:
    if value is None:
        return None
    check_text(value, where)
    if len(value) > DEDUP_KEY_MAX:
        raise InvalidArgument(f"{where} must be at most {DEDUP_KEY_MAX} characters, got {len(value)}")
    return value


def _modes(get: Any) -> list[str]:
    """The modes on, as ``get(option)`` reads them (a class's, or a push's over its class's)."""
    return [mode for mode in MODES if get(mode) not in (None, False)]


def _refusal(get: Any, where: str) -> str | None:
    """Why these options can't go together, or None."""
    modes = _modes(get)
    if len(modes) > 1:
        return (f"{where}: {' and '.join(modes)} can't be combined (each says differently what an equal push "
                f"does); choose one (docs/fairness.md)")
    if modes and get("unique_for") is not None:
        return (f"{where}: {modes[0]} can't be combined with unique_for (a unique job's duplicate is refused, "
                f"which leaves {modes[0]} nothing to do); choose one (docs/fairness.md)")
    if not modes and get("dedup_key") is not None:
        return f"{where}: dedup_key is given but none of {', '.join(MODES)} is: it would do nothing"
    return None


def _rule(cls: Any, where: str) -> None:
    refusal = _refusal(lambda name: getattr(cls, name, None), where)
    if refusal:
        raise InvalidArgument(refusal)


def _pushes(job_class: Any, options: Mapping[str, Any]) -> bool:
    def get(name: str) -> Any:
        return options[name] if name in options else getattr(job_class, name, None)

    refusal = _refusal(get, getattr(job_class, "name", job_class.__qualname__))
    if refusal:  # (asked once per setter: a set(...) combining what the class can't, refused at it)
        raise InvalidArgument(refusal)
    return bool(_modes(get))


def _collapse(payload: dict[str, Any], job_class: Any, options: Mapping[str, Any],
              head: Sequence[tuple[str, str]], due: float | None) -> None:
    """``collapse``: [mode, seconds, digest]; the digest of ``dedup_key`` (with the class and queue),
    or of the class, arguments and queue (before a seal: the encryption's hook comes after)."""
    def get(name: str) -> Any:
        return options[name] if name in options else getattr(job_class, name)

    mode = _modes(get)[0]
    key = get("dedup_key")
    if key is None:
        digest = arguments_digest(payload)
    else:
        basis = json.dumps([payload["class"], payload["queue"], key], separators=(",", ":"))
        digest = "k" + hashlib.sha256(basis.encode()).hexdigest()  # ("k": never an arguments digest's)
    seconds = get(mode) if mode != "keep_last_if_active" else 0
    payload["collapse"] = ["keep_last" if mode == "keep_last_if_active" else mode, seconds, digest]


def _died(redis: Any, keys: Any, payload: dict[str, Any], error: str, message: str, ttl: float) -> None:
    """A job that died off the job's path (orphaned too often, killed from the admin): a
    keep_last_if_active job's kept follow-up is written now, or its state goes (hook.py's ``died``)."""
    spec = payload.get("collapse")
    if isinstance(spec, list) and spec and spec[0] == "keep_last":  # (else nothing imported, nothing done)
        from .hook import died

        died(redis, keys, payload)


def _removed(redis: Any, keys: Any, payload: dict[str, Any]) -> None:
    """A job deleted (the admin, the API) or discarded off the job's path: a keep_last_if_active
    job's state is released as if its run had ended for good (hook.py's ``died``): its kept follow-up,
    a push of its own, is written, or the state goes, so equal pushes aren't dropped for a job that
    is gone (a week's retry deleted kept them dropped a week). A debounced job's state lets it go
    (hook.py's ``removed``). Throttle: nothing (its window is the throttle: deleting its job doesn't
    reopen it)."""
    spec = payload.get("collapse")
    if isinstance(spec, list) and spec and spec[0] in ("keep_last", "debounce"):
        from .hook import removed

        removed(redis, keys, payload)


DECLARATION = Declaration(
    "collapse",
    options=(Option("debounce", None, _seconds, push=True,
                    check_push=lambda v, n, c: _seconds(v, f"{n}: debounce")),
             Option("throttle", None, _seconds, push=True,
                    check_push=lambda v, n, c: _seconds(v, f"{n}: throttle")),
             Option("keep_last_if_active", False, _flag, push=True,
                    check_push=lambda v, n, c: _flag(v, f"{n}: keep_last_if_active")),
             Option("dedup_key", None, _key, push=True, check_push=lambda v, n, c: _key(v, f"{n}: dedup_key"))),
    rules=(_rule,), pushes=_pushes, on_push=_collapse, died=_died, removed=_removed,
    removed_fields=("collapse",),
    writer=Writer("collapse", writer.write,
                  "a push with debounce, throttle or keep_last_if_active can't be part of a batch (its job may "
                  "be replaced or dropped, which the batch would wait for in vain); push it outside "
                  "the batch's jobs() block"),
)
