"""The fast tier's one rule, checked: a test here starts no worker process.

No `runcogworker` (helpers.Worker, or `manage.py runcogworker` through subprocess), no Sentinel and
no Cluster: those tests live in tests/workers/. A private redis-server (helpers.RedisServer) is
fine, so is a Launcher run in a thread of the test process, and a bare `python -c` that checks
imports. A test that breaks the rule fails at once, naming it, rather than slowing the tier down
unnoticed (the tier is what a newcomer runs first: `make test-fast`).
"""

from __future__ import annotations

import subprocess

import helpers
import pytest

_MOVE = "the fast tier starts no worker process: move this test to tests/workers/ (tests/README.md)"


def _refuse(*args, **kwargs):
    raise AssertionError(_MOVE)


@pytest.fixture(autouse=True)
def no_worker_processes(monkeypatch):
    popen_init = subprocess.Popen.__init__

    def guarded(self, args, *rest, **kwargs):
        if "runcogworker" in (" ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args)):
            raise AssertionError(_MOVE)
        popen_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)
    monkeypatch.setattr(helpers.Worker, "__init__", _refuse)
    monkeypatch.setattr(helpers.Sentinels, "start", _refuse)
    monkeypatch.setattr(helpers.Cluster, "start", _refuse)
