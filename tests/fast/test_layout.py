"""The package's layout: no import circles, folders a reader can take in, and old import paths kept.

What users rely on: the imports they already have keep working (the public ones as they are, the
moved modules for one release with a DeprecationWarning), and a reader can open any module of
the package alone: no module imports, however indirectly, one that imports it back (an import
inside a function counts: it runs all the same).
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import django_cogworker
from django_cogworker import _moved

PACKAGE_DIR = Path(django_cogworker.__file__).parent
PACKAGE = "django_cogworker"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE_DIR.rglob("*.py") if "migrations" not in p.parts}


def moved_to(name: str) -> str:
    """Where an old path of _moved.MOVED leads (the longest moved prefix replaced); else ``name``."""
    parts = name.split(".")
    for cut in range(len(parts), 1, -1):
        old = ".".join(parts[1:cut])
        if parts[0] == PACKAGE and old in _moved.MOVED:
            return ".".join([PACKAGE, _moved.MOVED[old], *parts[cut:]])
    return name


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports, at module level or inside functions (an old
    path of a moved module counts as an import of the module it leads to: _moved serves it so)."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [moved_to(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here[: len(here) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            named = [moved_to(f"{base}.{alias.name}") for alias in node.names]
            submodules = [n for n in named if n in modules]
            # (from a package: each name a submodule is an edge to it; any other name, to the package)
            candidates = submodules + ([moved_to(base)] if len(submodules) < len(node.names) else [])
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in modules:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                found.add(candidate)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def test_no_module_of_the_package_imports_itself_back_through_others():
    assert cycles(import_graph()) == []


def test_the_cycle_check_sees_a_circle_made_by_an_import_inside_a_function(tmp_path):
    # (so the check above can fail)
    (tmp_path / "a.py").write_text("def later():\n    from . import b\n")
    (tmp_path / "b.py").write_text("from .a import later\n")
    modules = {"pkg.a": tmp_path / "a.py", "pkg.b": tmp_path / "b.py"}
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert graph == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]


def test_the_broker_imports_nothing_above_it():
    # Redis plumbing is handed what it needs of the config; it never reaches up for it.
    graph = import_graph()
    for name, targets in graph.items():
        if name.startswith(f"{PACKAGE}.broker"):
            above = {t for t in targets if not t.startswith(f"{PACKAGE}.broker") and t != f"{PACKAGE}.errors"}
            assert not above, f"{name} imports {sorted(above)}"


# The core: what pushes, runs and settles a job, and the object model's general parts. Features
# (features/<feature>/) plug into it; the Django side (admin/, metrics/, cli/, checks.py, the root
# package and api/'s __init__, which gather the features' parts) may import both.
CORE = ("broker", "push", "engine", "api")

# The core's imports of a feature: none. A feature plugs in through its hooks (engine/run/hooks.py:
# the job's path, and the services it asks of the worker: chores, housekeeping, start, stop) and its
# declaration (push/declarations.py: its class options, its push hooks, a job that dies off the
# path), both read by the core without naming it. Keep it empty; a public re-export of a feature's
# api would be named here as such.
CORE_TO_FEATURE: set[tuple[str, str]] = set()


def _in(name: str, folders: tuple[str, ...]) -> bool:
    return any(name == f"{PACKAGE}.{f}" or name.startswith(f"{PACKAGE}.{f}.") for f in folders)


def test_the_core_imports_no_feature_but_those_it_still_calls_by_name():
    graph = import_graph()
    found = set()
    for name, targets in graph.items():
        if _in(name, CORE) and name != f"{PACKAGE}.api":
            found |= {(name[len(PACKAGE) + 1:], t[len(PACKAGE) + 1:]) for t in targets
                      if _in(t, ("features", "batches"))}
    assert found - CORE_TO_FEATURE == set(), "the core imports a feature: plug it in instead"
    assert CORE_TO_FEATURE - found == set(), "gone from the core: take it off CORE_TO_FEATURE"


def test_a_feature_imports_the_core_and_other_features_but_not_the_django_side_s_gatherers():
    # (its admin views use admin/views.py's helpers; nothing of a feature needs what gathers them)
    graph = import_graph()
    gatherers = {f"{PACKAGE}.admin.urls", f"{PACKAGE}.metrics.collect", f"{PACKAGE}.checks", PACKAGE,
                 f"{PACKAGE}.batches"}
    for name, targets in graph.items():
        if _in(name, ("features",)):
            assert not targets & gatherers, f"{name} imports {sorted(targets & gatherers)}"


def test_the_engine_imports_neither_django_nor_the_admin_side_at_module_level():
    graph = import_graph()
    for name, targets in graph.items():
        if name.startswith(f"{PACKAGE}.engine"):
            wrong = {t for t in targets if t.startswith((f"{PACKAGE}.admin", f"{PACKAGE}.api", f"{PACKAGE}.cli",
                                                         f"{PACKAGE}.metrics", f"{PACKAGE}.management"))}
            assert not wrong, f"{name} imports {sorted(wrong)}"


def test_the_root_and_every_folder_hold_at_most_a_dozen_modules():
    for folder in [PACKAGE_DIR, *(p for p in PACKAGE_DIR.rglob("*") if p.is_dir())]:
        if folder.name in ("__pycache__", "migrations") or "templates" in folder.parts:
            continue
        modules = [p.name for p in folder.glob("*.py")]
        assert len(modules) <= 12, f"{folder.relative_to(PACKAGE_DIR.parent)}: {sorted(modules)}"


# A module a reader takes in at one sitting (STYLE.md 1: aim for 80-300 lines): past it, split by
# concept (a folder of its parts, the old module re-exporting what moved), never by line count.
MODULE_LINES_MAX = 400


def lines_over(limit: int, modules: dict[str, Path]) -> dict[str, int]:
    counts = {name: len(path.read_text().splitlines()) for name, path in modules.items()}
    return {name: count for name, count in sorted(counts.items()) if count > limit}


def test_no_module_of_the_package_passes_400_lines():
    assert lines_over(MODULE_LINES_MAX, package_modules()) == {}


def test_the_line_count_sees_a_module_one_line_over(tmp_path):
    # (so the check above can fail)
    (tmp_path / "long.py").write_text("x = 1\n" * (MODULE_LINES_MAX + 1))
    (tmp_path / "short.py").write_text("x = 1\n" * MODULE_LINES_MAX)
    modules = {"pkg.long": tmp_path / "long.py", "pkg.short": tmp_path / "short.py"}
    assert lines_over(MODULE_LINES_MAX, modules) == {"pkg.long": MODULE_LINES_MAX + 1}


def test_the_imports_users_have_keep_working_without_a_warning():
    code = """
import warnings
warnings.simplefilter("error")
import django
django.setup()
from django_cogworker import Job, JobSetter, periodic, get_redis, get_result, ConfigError
from django_cogworker import Batch, Limiter, cancel, chain, chord, group
from django_cogworker.batches import Batch, BatchChildDone, BatchStatus, Chain, ChainNext, Chord, Group, Signature
from django_cogworker.batches import chain, chord, group
from django_cogworker.api import BatchSet, LimitSet, job_result
from django_cogworker import api, testing, pytest_plugin
from django_cogworker.api import Queue, DeadSet, RetrySet, ScheduledSet, ProcessSet, Stats
from django_cogworker.metrics import metrics_view
from django_cogworker.tasks import CogworkerBackend
from django_cogworker.admin import urls
from django.utils.module_loading import import_string
assert import_string("django_cogworker.tasks.CogworkerBackend") is CogworkerBackend
assert callable(periodic) and not isinstance(periodic, type(django))
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**__import__("os").environ, "DJANGO_SETTINGS_MODULE": "testproject.settings"},
                         cwd=PACKAGE_DIR.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_a_moved_module_imports_from_its_old_path_as_the_same_module_with_a_deprecation_warning(old):
    old_name, new_name = f"{PACKAGE}.{old}", f"{PACKAGE}.{_moved.MOVED[old]}"
    sys.modules.pop(old_name, None)
    _import_parent(old_name)
    with pytest.warns(DeprecationWarning, match=f"{old_name} has moved to {new_name}"):
        module = importlib.import_module(old_name)
    _assert_one_object(old, module)
    sys.modules.pop(old_name, None)


def _import_parent(old_name: str) -> None:
    parent = old_name.rpartition(".")[0]
    if parent != PACKAGE and parent not in sys.modules:  # (its own warning, tested on its own)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            importlib.import_module(parent)


def _assert_one_object(old: str, module: object) -> None:
    new_name = f"{PACKAGE}.{_moved.MOVED[old]}"
    assert module is importlib.import_module(new_name)
    # (one object: under its new name and old ones only, never loaded a second time)
    names = {new_name} | {f"{PACKAGE}.{o}" for o, n in _moved.MOVED.items() if n == _moved.MOVED[old]}
    assert all(m is not module or n in names for n, m in list(sys.modules.items()))


def test_from_the_root_package_an_old_module_name_still_imports():
    sys.modules.pop(f"{PACKAGE}.runtime", None)
    if "runtime" in vars(django_cogworker):  # (set by an earlier import of the old path)
        delattr(django_cogworker, "runtime")
    with pytest.warns(DeprecationWarning, match="runtime has moved to django_cogworker.push.runtime"):
        from django_cogworker import runtime  # noqa: F401 - the old spelling under test
    from django_cogworker.push import runtime as new

    assert runtime is new
    assert django_cogworker.periodic is not sys.modules.get(f"{PACKAGE}.push.periodic")  # (the decorator stays)


def test_the_old_fetch_module_s_names_are_served_by_the_fetch_folder_with_a_warning():
    from django_cogworker.engine import fetch
    from django_cogworker.engine.fetch.contract import Fetch
    from django_cogworker.engine.fetch.registry import make_fetch

    with pytest.warns(DeprecationWarning, match="engine.fetch.Fetch has moved"):
        assert fetch.Fetch is Fetch
    with pytest.warns(DeprecationWarning, match="engine.fetch.make_fetch has moved"):
        assert fetch.make_fetch is make_fetch
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError):
            fetch.no_such_name  # noqa: B018
