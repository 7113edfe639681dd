"""The Redis Cluster fixtures of test_cluster.py and test_cluster_spread.py: one real three-primary
cluster for the session (started by the first test that asks for it), each test on empty primaries.

    from cluster_fixtures import cluster_fixture, cr_fixture, on_cluster_fixture  # noqa: F401 - fixtures

(Named ``*_fixture`` here, as engine_fixtures.py's are, so a test's parameter doesn't shadow an import.)
"""

from __future__ import annotations

import pytest
from helpers import Cluster, client_for

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
