"""How a worker makes its features: the factories the package's and ``COGWORKER["FEATURES"]`` name,
imported, checked and called once per process with its :class:`~.hooks.WorkerParts`; and how it
drives the services they ask of it that no phase of a job's path covers (``requeue_hook``,
``stop_features``; their chores and housekeeping steps are asked by the heartbeat and the poller).

A factory that is no factory, or one that returns what isn't a Feature, stops the worker at
startup with an error naming the ``FEATURES`` entry; ``manage.py check`` reports what can be told
without calling it (checks.py, cogworker.E007: a Feature class given for its factory).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ...errors import ConfigError
from .hooks import Feature, WorkerParts

if TYPE_CHECKING:
    from ...conf import Config

logger = logging.getLogger(__name__)

FeatureFactory = Callable[[WorkerParts], "Feature | Sequence[Feature]"]


# The package's own features (django_cogworker/features/): always first, before a project's own.
STANDARD_FEATURES = "django_cogworker.features.standard.build"


def load_features(config: Config) -> list[FeatureFactory]:
    """The factories of the package's features and of ``COGWORKER["FEATURES"]``, imported by name."""
    from ...push.middleware import import_string

    return [import_string(path) for path in (STANDARD_FEATURES, *config.features)]


def build_features(factories: Sequence[FeatureFactory], parts: WorkerParts) -> list[Feature]:
    """Call each factory with ``parts``; their features in the order given. A factory that isn't
    one, or returns what isn't a Feature or a list of them, stops the worker at startup naming it
    (one returning None failed with ``'NoneType' object is not iterable``, naming nothing)."""
    built: list[Feature] = []
    for factory in factories:
        entry = entry_of(factory)
        problem = factory_problem(entry, factory)
        if problem:
            raise ConfigError([problem])
        made = factory(parts)
        many = list(made) if isinstance(made, Iterable) and not isinstance(made, (str, bytes)) else [made]
        if not all(isinstance(feature, Feature) for feature in many):
            raise ConfigError([f'COGWORKER["FEATURES"] entry {entry!r} returned {made!r:.200}: it must return '
                               f"a Feature or a list of them"])
        built += many
    return built


def factory_problem(entry: str, factory: Any) -> str | None:
    """What makes ``factory``, imported from the ``FEATURES`` entry ``entry``, no feature factory, or
    None: it isn't callable, or it is a Feature class given for the function that builds it (one
    whose constructor takes the worker's parts is a factory, and accepted)."""
    if isinstance(factory, type) and issubclass(factory, Feature):
        try:
            inspect.signature(factory).bind(None)
        except TypeError:
            return (f'COGWORKER["FEATURES"] entry {entry!r} is a Feature class, whose constructor can\'t take '
                    f"the worker's parts: name a function that takes them and returns the feature "
                    f"(docs/extending.md)")
        except ValueError:  # (no signature to read: the call will tell)
            pass
        return None
    if not callable(factory):
        return (f'COGWORKER["FEATURES"] entry {entry!r} is {type(factory).__name__} {factory!r:.100}, not a '
                f"callable that takes the worker's parts and returns a Feature")
    return None


def entry_of(factory: Any) -> str:
    """The dotted path a factory is named by in ``FEATURES``: its module and name, as imported."""
    module, name = getattr(factory, "__module__", None), getattr(factory, "__qualname__", None)
    return f"{module}.{name}" if isinstance(module, str) and isinstance(name, str) else repr(factory)


def requeue_hook(features: Sequence[Feature]) -> Callable[[dict[str, Any], str], None] | None:
    """What the Settler calls for each job handed back at shutdown (``run_hook(payload, "requeued")``):
    the ``requeued`` hook of every feature that has one, in order; None if none has."""
    hooks = [f.requeued for f in features if type(f).requeued is not Feature.requeued]
    if not hooks:
        return None

    def requeued(payload: dict[str, Any], moment: str) -> None:
        # (One that raises is logged, and the others run all the same: a periodic run's lock kept by
        # one must not be lost to another's error.)
        for hook in hooks:
            try:
                hook(payload)
            except Exception:
                logger.exception("a feature's requeued hook (%r) raised for jid=%s", hook, payload.get("jid"))

    return requeued


def step_runners(features: Sequence[Feature]) -> dict[Any, Any]:
    """Each step type the features settle with, and the runner that runs it (for the Settler)."""
    return {kind: runner for f in features for kind, runner in f.step_runners().items()}


def stop_features(features: Sequence[Feature]) -> None:
    """Stop each feature (the last first); one that raises is logged, and the others stop all the same."""
    for feature in reversed(features):
        try:
            feature.stop()
        except Exception:
            logger.exception("feature %r failed to stop", getattr(feature, "name", feature))
