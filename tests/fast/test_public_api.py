"""The public surface: ``django_cogworker.__all__`` is sorted and changes only on purpose."""

from __future__ import annotations

import importlib.metadata

import django_cogworker

EXPECTED = [
    "Batch",
    "BatchError",
    "BatchNotFound",
    "Cancelled",
    "CogworkerError",
    "ConfigError",
    "InvalidArgument",
    "IterableJob",
    "Job",
    "JobExpired",
    "JobNotFound",
    "JobSetter",
    "JobTimeout",
    "LimitKeyError",
    "Limiter",
    "OverLimit",
    "PayloadError",
    "PushLostAtCommit",
    "PushOutcome",
    "UnknownJobError",
    "WrongTypeError",
    "__version__",
    "cancel",
    "chain",
    "chord",
    "get_progress",
    "get_redis",
    "get_result",
    "group",
    "periodic",
]


def test_all_is_sorted_and_exactly_the_expected_names():
    assert django_cogworker.__all__ == sorted(django_cogworker.__all__)
    assert django_cogworker.__all__ == EXPECTED


def test_every_exported_name_exists():
    namespace: dict = {}
    exec("from django_cogworker import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == EXPECTED


def test_errors_share_one_base():
    for name in ("ConfigError", "InvalidArgument", "PayloadError", "PushLostAtCommit", "UnknownJobError",
                 "WrongTypeError"):
        assert issubclass(getattr(django_cogworker, name), django_cogworker.CogworkerError)
    assert issubclass(django_cogworker.UnknownJobError, django_cogworker.PayloadError)
    # The one exception outside it, on purpose: a job's `except Exception` must not swallow it.
    assert not issubclass(django_cogworker.JobTimeout, Exception)


def test_version_matches_the_installed_distribution():
    assert django_cogworker.__version__ == importlib.metadata.version("django-cogworker")


def test_features_exports_the_hook_interface_a_project_s_feature_imports():
    # (docs/extending.md's examples import these from django_cogworker.features alone.)
    import subprocess
    import sys

    from django_cogworker import features
    from django_cogworker.engine.run import hooks
    from django_cogworker.engine.settle.settlement import ACK

    assert features.__all__ == sorted(features.__all__)
    assert {"ACK", "Decision", "Feature", "JobRun", "Outcome", "WorkerParts"} <= set(features.__all__)
    assert [getattr(features, name) for name in ("ACK", "Decision", "Feature", "JobRun", "Outcome")] == [
        ACK, hooks.Decision, hooks.Feature, hooks.JobRun, hooks.Outcome]
    # A star import finds them all (they are served on first use: features/__init__.py's __getattr__).
    code = ("from django_cogworker.features import *; "
            "print(sorted(n for n in ('ACK', 'Decision', 'Feature', 'JobRun', 'Outcome') if n in globals()))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == "['ACK', 'Decision', 'Feature', 'JobRun', 'Outcome']\n"
