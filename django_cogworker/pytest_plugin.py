"""pytest fixtures for projects using django-cogworker (installed as a pytest plugin)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from . import testing


@pytest.fixture
def cogworker_fake() -> Iterator[testing.FakeJobs]:
    """Collect pushes in memory for this test; ``.drain()`` runs them."""
    with testing.fake() as jobs:
        yield jobs


@pytest.fixture
def cogworker_inline() -> Iterator[testing.InlineJobs]:
    """Run each job at push time for this test."""
    with testing.inline() as jobs:
        yield jobs
