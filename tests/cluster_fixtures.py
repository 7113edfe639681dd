"""The Redis Cluster fixtures of test_cluster.py and test_cluster_spread.py: one real three-primary
cluster for the session (started by the first test that asks for it), each test on empty primaries.

    from cluster_fixtures import cluster_fixture, cr_fixture, on_cluster_fixture  # noqa: F401 - fixtures

(Named ``*_fixture`` here, as engine_fixtures.py's are, so a test's parameter doesn't shadow an import.)
Beside them, what both files' tests use: ``worker_env`` (a worker's environment on the cluster) and
``texts`` (a reply as str).
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers import FAST_ENV, Cluster, client_for

from django_cogworker.push import runtime


@pytest.fixture(scope="session", name="cluster")
def cluster_fixture(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("cluster")) as started:
        yield started


@pytest.fixture(name="cr")
def cr_fixture(cluster):
    """A bytes cluster client; every primary flushed first (each test starts empty)."""
    for node in cluster.nodes:
        client = node.client()
        client.flushdb()
        client.close()
    client = client_for(cluster.url)
    yield client
    client.close()


@pytest.fixture(name="on_cluster")
def on_cluster_fixture(cluster, settings):
    """This process's pushers and admin on the cluster (the runtime is rebuilt from settings)."""
    settings.COGWORKER = {**settings.COGWORKER, "REDIS_URL": cluster.url}
    yield
    runtime.reset()


def worker_env(cluster: Cluster, **extra: str) -> dict[str, str]:
    """FAST_ENV for a worker on ``cluster`` (four processors), plus ``extra``."""
    return {**FAST_ENV, "COGWORKER_REDIS_URL": cluster.url, "COGWORKER_CONCURRENCY": "4", **extra}


def texts(values: Any) -> list[str]:
    """``values`` as str (a cluster client may answer bytes)."""
    return [v.decode() if isinstance(v, bytes) else v for v in values]
