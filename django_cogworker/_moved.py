"""The modules moved when the package was laid out by who uses it: their old paths import for one
release.

``import django_cogworker.runtime`` (or ``from django_cogworker import keys``) gets the module from
its new place, with a DeprecationWarning naming it; the module is the same object, so patching
it through either name patches both. Served by a finder that answers for
those names only, rather than by a file per old name: the package root keeps
to the modules a reader should open.

The features' modules moved to a folder each (features/): ``django_cogworker.batches`` stays as
the public path of Batch and the workflows (a package of its own, no warning); ``flow`` is served
as features/limits (its ``Limiter``; ``cancel`` is ``django_cogworker.cancel``).

Not served: ``django_cogworker.periodic`` (the decorator of that name is what the root package
exports, and a module imported under it would replace it), ``django_cogworker.tasks`` (still
the backend's package: ``django_cogworker.tasks.CogworkerBackend``) and ``django_cogworker.engine.fetch``
(now the fetch folder; its old names are its ``__getattr__``'s).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

PACKAGE = __name__.rpartition(".")[0]

# old path -> new path, both under the package
MOVED: dict[str, str] = {
    "_types": "broker.types",
    "admin.batch_views": "features.batches.admin_views",
    "admin.cancel_views": "features.cancellation.admin_views",
    "admin.limit_views": "features.limits.admin_views",
    "api.batches": "features.batches.api",
    "api.limits": "features.limits.api",
    "api.results": "features.results.api",
    "arguments": "push.arguments",
    "batches.batch": "features.batches.batch",
    "batches.delivery": "features.batches.delivery",
    "batches.steps": "features.batches.steps",
    "batches.workflows": "features.batches.workflows",
    "broker.scripts.batches": "features.batches.scripts",
    "broker.scripts.limits": "features.limits.scripts",
    "broker.scripts.results": "features.results.scripts",
    "client": "push.client",
    "cluster": "broker.cluster",
    "connection": "broker.connection",
    "crossings": "broker.crossings",
    "db": "engine.run.db",
    "engine.affinity": "engine.process.affinity",
    "engine.due": "engine.schedule.due",
    "engine.extras": "features.results.hook",
    "engine.fetch_basic": "engine.fetch.basic",
    "engine.fetch_reliable": "engine.fetch.reliable",
    "engine.fetch_sharded": "engine.fetch.sharded",
    "engine.fetcher": "engine.fetch.fetcher",
    "engine.heartbeat": "engine.process.heartbeat",
    "engine.housekeeping": "engine.recovery.housekeeping",
    "engine.key_guard": "engine.recovery.key_guard",
    "engine.launcher": "engine.process.launcher",
    "engine.ledger": "engine.fetch.ledger",
    "engine.manager": "engine.process.manager",
    "engine.orphans": "engine.recovery.orphans",
    "engine.processor": "engine.run.processor",
    "engine.results": "features.results.writer",
    "engine.run.results": "features.results.writer",
    "engine.run.gate": "features.limits.gate",
    "engine.run.extras": "features.results.hook",
    "engine.retry": "engine.settle.retry",
    "engine.run_locks": "engine.run.run_locks",
    "engine.scheduled": "engine.schedule.poller",
    "engine.settling": "engine.settle.settling",
    "engine.stats": "engine.settle.stats",
    "engine.supervisor": "engine.process.supervisor",
    "engine.timeouts": "engine.run.timeouts",
    "engine.wakeups": "engine.schedule.wakeups",
    "flow": "features.limits",
    "flow.cancel": "features.cancellation.cancel",
    "flow.limiter": "features.limits.limiter",
    "flow.upkeep": "features.limits.upkeep",
    "job": "push.job",
    "keys": "broker.keys",
    "locks": "broker.locks",
    "loops": "engine.loops",
    "middleware": "push.middleware",
    "payload": "push.payload",
    "push.results": "features.results.records",
    "quarantine": "broker.quarantine",
    "redis_urls": "broker.urls",
    "results": "features.results.records",
    "runtime": "push.runtime",
    "scripts": "broker.scripts",
    "scripts._base": "broker.scripts._base",
    "scripts.admin": "broker.scripts.admin",
    "scripts.jobs": "broker.scripts.jobs",
    "scripts.periodic": "broker.scripts.periodic",
    "scripts.results": "features.results.scripts",
    "scripts.slots": "broker.scripts.slots",
    "sentinel": "broker.sentinel",
    "tasks_api": "tasks.api",
    "unique": "push.unique",
}



class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths of :data:`MOVED`; loading one imports the new module and puts that
    very module in ``sys.modules`` under the old name too."""

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(PACKAGE + ".") or fullname[len(PACKAGE) + 1:] not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # (a blank module, replaced in exec_module)

    def exec_module(self, module: ModuleType) -> None:
        old = module.__name__
        new = f"{PACKAGE}.{MOVED[old[len(PACKAGE) + 1:]]}"
        warnings.warn(f"{old} has moved to {new}; the old path goes in the next release", DeprecationWarning,
                      stacklevel=2)
        # (the import system returns what sys.modules holds under the name once this returns)
        sys.modules[old] = importlib.import_module(new)


def install() -> None:
    """Serve the old paths (once per process)."""
    if any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        return
    # First: it answers for the old names only, and must answer before the path finder, which
    # would load ``scripts/jobs.py`` a second time, as a new module, under the name
    # ``django_cogworker.scripts.jobs`` once ``django_cogworker.scripts`` is the moved package.
    sys.meta_path.insert(0, MovedModules())
