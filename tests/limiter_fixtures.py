"""Shared pieces of the limiter tests (test_limiter, test_upkeep, test_gate, test_checks).

    from limiter_fixtures import fresh_limiters, unique  # noqa: F401 - the fresh_limiters fixture

Limiters register by name for the whole process (features/limits/limiter.py ``_defined``): a limiter a test
defines with a 0.3 s lease would be named by ``manage.py check`` (cogworker.E004) in every later
test that runs the checks, and a name used twice with another size refuses the second. So each
test gets names of its own (``unique``), and ``fresh_limiters`` forgets, at its end, every limiter
the test defined. Limiters defined at import (on job classes) stay: give them valid leases.
"""

from __future__ import annotations

import uuid

import pytest

from django_cogworker.features.limits import limiter as limiter_module


def unique(tag: str) -> str:
    """A limiter name no other test uses."""
    return f"test:{tag}:{uuid.uuid4().hex[:10]}"


@pytest.fixture(autouse=True)
def fresh_limiters(monkeypatch):
    """The registry of limiter definitions as it was before the test, once it ends."""
    monkeypatch.setattr(limiter_module, "_defined", dict(limiter_module._defined))
    monkeypatch.setattr(limiter_module, "_all", list(limiter_module._all))
