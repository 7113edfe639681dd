"""replies.py: a command that does not complete never leaves its reply for the next command; a
socket timeout holds with one system call per send and per read.

What users rely on: after a job's timeout (or any exception) interrupts a Redis command between
its send and its read, every later command on that thread, on the shared pool, in a pipeline,
on Sentinel and on Cluster gets its own reply, never the interrupted one's: whether that reply
had already arrived or was still on its way (held back here by ``CLIENT PAUSE``, which made the
old ``select`` check miss it every time).

Here, the tests that run a real worker process; the in-process ones are in tests/fast/test_replies.py.
"""

from __future__ import annotations

from cluster_fixtures import cluster_fixture, cr_fixture, on_cluster_fixture  # noqa: F401 - fixtures
from helpers import Sentinels

# Helpers shared with this subject's fast tests, defined there once.
from test_replies import interrupted_incr, writes_held_back

from django_cogworker.push import runtime


def test_on_sentinel_an_interrupted_command_leaves_no_reply_behind(tmp_path, monkeypatch):
    sentinels = Sentinels(tmp_path / "servers").start()
    try:
        monkeypatch.setenv("COGWORKER_REDIS_URL", sentinels.url)
        runtime.reset()
        client = runtime.get_redis()
        client.set("k", "v")
        with writes_held_back(sentinels.primary.client()):
            interrupted_incr(client, monkeypatch)
            assert client.get("k") == b"v"
    finally:
        runtime.reset()
        sentinels.cleanup()
