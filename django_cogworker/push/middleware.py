"""Client and server middleware chains, in the shape of Django's request middleware.

A middleware is a factory called once with the next step, returning the step::

    class StampTenant:                      # client: around every push
        def __init__(self, push):
            self.push = push
        def __call__(self, payload):        # return None to stop the push
            payload["tenant"] = current_tenant()
            return self.push(payload)

    class Timing:                           # server: around every run
        def __init__(self, run):
            self.run = run
        def __call__(self, job, payload):
            started = time.monotonic()
            try:
                return self.run(job, payload)
            finally:
                log(time.monotonic() - started)

Chains are listed by dotted path in ``COGWORKER["CLIENT_MIDDLEWARE"]`` and
``["SERVER_MIDDLEWARE"]``; the first listed is the outermost.

A job whose ``perform`` is ``async def`` runs on the worker's event loop through the async form of
the server chain: each middleware built again with the next async step, and its ``acall`` awaited::

    class Timing:
        ...
        async def acall(self, job, payload):    # self.run is the next async step here
            started = time.monotonic()
            try:
                return await self.run(job, payload)
            finally:
                log(time.monotonic() - started)

One server middleware without ``acall`` and there is no async chain: async jobs then run on
processor threads, as sync jobs do (logged at startup).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib import import_module
from typing import Any


def import_string(path: str) -> Any:
    """Import ``package.module.Name`` (only from the config, never from Redis)."""
    module_path, _, name = path.rpartition(".")
    if not module_path:
        raise ImportError(f"{path!r} is not a dotted path")
    module = import_module(module_path)
    try:
        return getattr(module, name)
    except AttributeError as exc:
        raise ImportError(f"module {module_path!r} has no attribute {name!r}") from exc


def build_chain(factories: Sequence[Callable[[Callable], Callable]], terminal: Callable) -> Callable:
    """Wrap ``terminal`` so the first factory is outermost."""
    step = terminal
    for factory in reversed(factories):
        step = factory(step)
    return step


def build_async_chain(factories: Sequence[Callable[[Callable], Any]],
                      terminal: Callable) -> tuple[Callable | None, str]:
    """The async chain around ``terminal`` (each factory's ``acall``, the first outermost), and ""; or
    None and the name of the first factory without ``acall``."""
    for factory in factories:
        if not callable(getattr(factory, "acall", None)):
            return None, getattr(factory, "__qualname__", repr(factory))
    step = terminal
    for factory in reversed(factories):
        step = factory(step).acall
    return step, ""


def load(paths: Sequence[str]) -> list[Callable]:
    return [import_string(p) for p in paths]
