"""What the features declare to the core: the class options they read, what they do to a payload as
it is pushed, and the services they offer a job and the object model, each under the feature's name.

The core names none of them. A feature's folder holds a ``declaration.py`` with one
:class:`Declaration` (features/results/declaration.py: ``result_ttl`` and ``timeout``, with their
defaults and their checks), and the package's own are listed in ``features/declared.py``, named here
by its dotted path (as engine/run/factories.py names the features a worker builds) and read on first
use: a job class defined, a push made, ``Job.cancel`` called. Nothing is filled in at import. (A
module of the root, as retries.py: the core reads it, and it imports nothing of a feature.)

Who reads what:

- :class:`~.push.job.Job` checks each declared option of a class as it is defined (its message, its
  default when the class gives none), and a ``set(...)``'s per-push options (``Option.push``).
- :class:`~.push.job.JobSetter` runs the ``on_push`` hooks that apply to its class and options
  (``pushes``, asked once per setter: the setter a plain ``perform_async`` reuses asks once per
  class), on each payload it builds: the expiry's ``expires_at``, the encryption's seal.
- a job that dies off the job's path (orphaned too many times, killed from the admin) is told to
  each ``died`` hook (a batch counts it dead), and ``provided(name)`` serves a feature's function
  to the core's public API (``Job.batch``, ``Job.cancel``, ``Job.cancelled``); one deleted (the
  admin, the API) or discarded off the job's path is told to each ``removed`` hook.
- the push :class:`~.push.client.Client` hands a payload carrying a :class:`Writer`'s field to that
  writer instead of its own write (a push that collapses into another: features/collapse/).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# The package's features' declarations: a tuple of Declaration (imported on first use, by name).
STANDARD = "django_cogworker.features.declared.STANDARD"

# Checks a declared option's value (``where`` names it in the message); returns the value to keep.
Check = Callable[[Any, str], Any]
# ``on_push(payload, job_class, options, head, due)``: change the payload as it is built (options: the
# push's own, ``set(...)``; head: the clear arguments a seal names; due: its perform_at time, or None).
PushHook = Callable[[dict[str, Any], Any, Mapping[str, Any], Sequence[tuple[str, str]], "float | None"], None]
# ``on_push_bulk(payloads, job_class, options)``: a bulk push's payloads, all built and given their jids.
BulkPushHook = Callable[[Sequence[dict[str, Any]], Any, Mapping[str, Any]], None]


@dataclass(frozen=True)
class Option:
    """A class option a feature reads: ``name`` on a Job class (or its default), checked as the class is
    defined; with ``push``, also given per push with ``set(...)``, checked by ``check_push`` there."""

    name: str
    default: Any = None
    check: Check | None = None
    push: bool = False
    check_push: Callable[[Any, str, Any], None] | None = None  # (value, the class's name, the class)


class PushOutcome(NamedTuple):
    """What one push came to, as ``JobSetter.push`` reports it: ``status`` "pushed" (a new job),
    "replaced" (its arguments took the place of an equal waiting job's, ``other``), "dropped" (an
    equal job, ``other``, stands for it: nothing written) or "deferred" (written at the commit);
    ``jid``: the job that runs for this push (a dropped push: the one that stands for it)."""

    status: str
    jid: str | None
    other: str | None = None


@dataclass(frozen=True)
class Writer:
    """How a feature writes the payloads that carry its ``field``, in place of the plain write: one
    script of its own (features/collapse/: a debounced push replaces the job it finds waiting).
    ``write(redis, keys, config, payload, now, marked=False)`` returns a :class:`PushOutcome`
    (``marked``: an outbox job, handed over with its mark as the core PUSH writes one, and not
    written again while the mark is there); ``batch_refusal`` is the error a push of such a payload
    inside a batch's ``jobs()`` block gets."""

    field: str
    write: Callable[..., PushOutcome]
    batch_refusal: str


@dataclass(frozen=True)
class Declaration:
    """One feature's declaration (the fields it has no use for left empty)."""

    name: str
    options: tuple[Option, ...] = ()
    # Checks of a class as a whole, once its options are set (``rule(cls, where)``): an option that
    # rules another out (a sealed job's limiter keyed by its arguments).
    rules: tuple[Callable[[Any, str], None], ...] = ()
    # ``pushes(job_class, options)``: whether ``on_push`` applies to pushes of this class with these options.
    pushes: Callable[[Any, Mapping[str, Any]], bool] | None = None
    on_push: PushHook | None = None
    # A bulk push (``perform_bulk``): called once with all its payloads instead of ``on_push`` on each
    # (one span for the push, the tracing's): None, ``on_push`` on each.
    on_push_bulk: BulkPushHook | None = None
    # ``died(redis, keys, payload, error_class, message, batch_ttl)``: a job that ends off the job's path.
    died: Callable[..., None] | None = None
    # ``removed(redis, keys, payload)``: a job that won't run, and isn't dead: deleted (from the admin,
    # ``SortedEntry.delete``, ``delete_all``, ``Queue.clear``) or discarded off the job's path (orphaned
    # too often, ``dead: false``). What it held for later pushes goes (features/collapse/).
    removed: Callable[..., None] | None = None
    # The payload fields of the jobs ``removed`` is for: a bulk delete reads and tells only those (api/removals.py).
    removed_fields: tuple[str, ...] = ()
    provides: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    writer: Writer | None = None


class Declared:
    """The declarations in force: the options by name, and the hooks of each kind, in their order."""

    def __init__(self, declarations: Sequence[Declaration]):
        self.declarations = tuple(declarations)
        self.options = tuple(o for d in self.declarations for o in d.options)
        self.by_name = {o.name: o for o in self.options}
        self.push_options = frozenset(o.name for o in self.options if o.push)
        self.rules = tuple(r for d in self.declarations for r in d.rules)
        self.pushers = tuple((d.pushes, d.on_push, d.on_push_bulk) for d in self.declarations
                             if d.pushes is not None and d.on_push is not None)
        self.deaths = tuple(d.died for d in self.declarations if d.died is not None)
        self.removals = tuple(d.removed for d in self.declarations if d.removed is not None)
        self.removed_fields = tuple(dict.fromkeys(f for d in self.declarations for f in d.removed_fields))
        self.provided = {name: f for d in self.declarations for name, f in d.provides.items()}
        self.writers = tuple(d.writer for d in self.declarations if d.writer is not None)

    def push_hooks(self, job_class: Any, options: Mapping[str, Any]) -> tuple[PushHook, ...]:
        """The ``on_push`` hooks that apply to pushes of ``job_class`` with ``options``."""
        return tuple(hook for pushes, hook, _ in self.pushers if pushes(job_class, options))

    def bulk_push_hooks(self, job_class: Any, options: Mapping[str, Any]
                        ) -> tuple[tuple[PushHook, ...], tuple[BulkPushHook, ...]]:
        """A bulk push's hooks: those run on each payload, and those run once on all of them."""
        applying = [(hook, bulk) for pushes, hook, bulk in self.pushers if pushes(job_class, options)]
        return (tuple(hook for hook, bulk in applying if bulk is None),
                tuple(bulk for _, bulk in applying if bulk is not None))


_declared: Declared | None = None
_lock = threading.Lock()


def declared() -> Declared:
    """The declarations in force: the package's features' (``STANDARD``), read on first use."""
    global _declared
    if _declared is None:
        with _lock:
            if _declared is None:
                from .push.middleware import import_string

                _declared = Declared(import_string(STANDARD))
    return _declared


def provided(name: str) -> Callable[..., Any]:
    """The function a feature provides as ``name`` (RuntimeError naming it if none does)."""
    function = declared().provided.get(name)
    if function is None:
        raise RuntimeError(f"no feature provides {name!r} (django_cogworker/features/declared.py lists them)")
    return function


def died(redis: Any, keys: Any, payload: dict[str, Any], error: str, message: str, batch_ttl: float) -> None:
    """Tell each feature of a job that died off the job's path (a batch counts it dead)."""
    for hook in declared().deaths:
        hook(redis, keys, payload, error, message, batch_ttl)


def removed(redis: Any, keys: Any, payload: dict[str, Any]) -> None:
    """Tell each feature of a job removed without running, not dead (deleted, or discarded off the
    job's path): a keep_last_if_active job's kept follow-up is written, or its state goes."""
    for hook in declared().removals:
        hook(redis, keys, payload)
