"""The ``TASKS`` entry of a CogworkerBackend, read and checked: every problem a message naming the
backend's alias and the option (``TASKS["default"]["OPTIONS"]["RETRY"] must be ...``).

A bad option raised from the backend's construction, which ``@task`` runs as Django starts: a
40-line traceback out of ``django.setup()`` for ``RETRY = -1``. It is read into :class:`Options`
instead, with defaults where a value is bad, and its problems are told by ``manage.py check``
(``cogworker.E005``, checks.py), by ``runcogworker``, which refuses to start, and by a push
through the backend, which raises ``ConfigError`` with the same text.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
from collections.abc import Mapping
from typing import Any

from ..bounds import check_seconds
from ..errors import InvalidArgument

OPTIONS = frozenset({"RESULT_TTL", "RETRY", "TIMEOUT", "ENQUEUE_ON_COMMIT", "MODULES"})
KEYS = frozenset({"BACKEND", "QUEUES", "OPTIONS"})  # (Django's, of every backend's entry)
DEFAULT_RESULT_TTL = 86400.0  # a day, renewed on each change of the record
# No retries unless asked for: django.tasks says a task that raised is FAILED. (A Job's default,
# True, retried every task 25 times while its result read READY.)
DEFAULT_RETRY = 0


@dataclasses.dataclass(frozen=True)
class Options:
    """A backend's options, each valid (a bad one replaced by its default), and the problems found."""

    queues: tuple[str, ...] | None  # (None: not given, or bad: Django's default then)
    result_ttl: float = DEFAULT_RESULT_TTL
    timeout: float | None = None
    retry: bool | int = DEFAULT_RETRY
    enqueue_on_commit: bool | None = None
    modules: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()


def valid_retry(value: Any) -> bool:
    """Whether ``value`` is a retry option: a count >= 0, True (COGWORKER["MAX_RETRIES"]) or False (none)."""
    return isinstance(value, bool) or (isinstance(value, int) and value >= 0)


def read(alias: str, params: Mapping[str, Any]) -> Options:
    """The options of the backend ``alias`` from its ``TASKS`` entry ``params``; never raises."""
    top = f'TASKS["{alias}"]'
    where = f'{top}["OPTIONS"]'
    problems: list[str] = []
    for key in sorted(set(params) - KEYS, key=str):
        # (Only a key that looks like one of ours or Django's: a key a later Django reads is its own.)
        if key in OPTIONS:
            problems.append(f'{top}["{key}"] is not a key of the entry (did you mean {where}["{key}"]?)')
        else:
            hint = _close(key, KEYS | OPTIONS)
            if hint:
                shown = f'{where}["{hint}"]' if hint in OPTIONS else f'{top}["{hint}"]'
                problems.append(f'{top}["{key}"] is not a key of the entry (did you mean {shown}?)')
    queues = params.get("QUEUES")
    if "QUEUES" in params and not (isinstance(queues, (list, tuple, set, frozenset)) and all(
            isinstance(q, str) and q and not any(c.isspace() for c in q) for q in queues)):
        problems.append(f'{top}["QUEUES"] must be a list of queue names (non-empty strings without spaces), '
                        f"got {queues!r}")
        queues = None
    options = params.get("OPTIONS", {})
    if not isinstance(options, Mapping):
        problems.append(f"{where} must be a dict, got {options!r}")
        options = {}
    for key in sorted(set(options) - OPTIONS, key=str):
        hint = _close(key, OPTIONS)
        problems.append(f'{where}["{key}"] is not an option ' + (f'(did you mean "{hint}"?)' if hint else
                                                                  f"(one of {', '.join(sorted(OPTIONS))})"))
    values: dict[str, Any] = {}
    for name, field, optional in (("RESULT_TTL", "result_ttl", False), ("TIMEOUT", "timeout", True)):
        if name in options:
            value = options[name]
            try:  # (held to MAX_SECONDS as a job's own: a RESULT_TTL of 1e16 is a TTL Redis refuses)
                check_seconds(value, f'{where}["{name}"]', none=optional)
            except InvalidArgument as exc:
                problems.append(str(exc))
            else:
                values[field] = None if value is None else float(value)
    if "RETRY" in options:
        if valid_retry(options["RETRY"]):
            values["retry"] = options["RETRY"]
        else:
            problems.append(f'{where}["RETRY"] must be True, False or a count >= 0, got {options["RETRY"]!r}')
    if "ENQUEUE_ON_COMMIT" in options:
        if options["ENQUEUE_ON_COMMIT"] in (None, True, False):
            values["enqueue_on_commit"] = options["ENQUEUE_ON_COMMIT"]
        else:
            problems.append(f'{where}["ENQUEUE_ON_COMMIT"] must be True or False, got {options["ENQUEUE_ON_COMMIT"]!r}')
    modules = options.get("MODULES", ())
    if isinstance(modules, str) or not isinstance(modules, (list, tuple)) or not all(
            isinstance(m, str) and m for m in modules):
        problems.append(f'{where}["MODULES"] must be a list of module paths, got {modules!r}')
    else:
        values["modules"] = tuple(m for m in modules if _findable(m))
        problems.extend(f'{where}["MODULES"]: no module {m!r} to import' for m in modules if not _findable(m))
    return Options(queues=tuple(queues) if queues is not None else None, problems=tuple(problems), **values)


def _close(key: Any, choices: frozenset[str]) -> str | None:
    matches = difflib.get_close_matches(str(key).upper(), sorted(choices), n=1)
    return matches[0] if matches else None


def _findable(module: str) -> bool:
    """Whether ``module`` exists (found, not imported: its import, and its errors, are apps.py's)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # (a parent package that doesn't exist, or a bad name)
        return False
