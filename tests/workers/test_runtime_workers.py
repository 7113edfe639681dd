"""runtime.py: the shared clients, and a processor thread's own connection (``own_connection``).

What users rely on: a job's ``get_redis()`` works the same in a worker as anywhere (every command,
pipelines, after Redis restarts), its connection goes back to the pool when the thread is done,
and a thread outside the worker's processors keeps the shared client.

Here, the tests that run a real worker process; the in-process ones are in tests/fast/test_runtime.py.
"""

from __future__ import annotations

from helpers import Sentinels, in_thread

from django_cogworker.push import runtime


def test_on_sentinel_a_thread_keeps_the_shared_client_so_that_failovers_are_followed(tmp_path, monkeypatch):
    # A held connection would skip the Sentinel pool's check of the primary on each checkout.
    sentinels = Sentinels(tmp_path / "servers").start()
    try:
        monkeypatch.setenv("COGWORKER_REDIS_URL", sentinels.url)
        runtime.reset()
        shared = runtime.get_redis()

        def work():
            with runtime.own_connection():
                client = runtime.get_redis()
                client.set("through", "the primary")
                return client

        assert in_thread(work) is shared
        assert sentinels.primary.client().get("through") == b"the primary"
    finally:
        runtime.reset()
        sentinels.cleanup()
