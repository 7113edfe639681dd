"""`make demo` (scripts/demo.sh) end to end, on the suite's Redis: it says its key prefix on its
first line and writes no key outside it, so on a machine whose 127.0.0.1:6379 other work uses, it
leaves that work's keys alone (it wrote under the library's default "cogworker:" before)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import redis
from helpers import FAST_ENV, REPO_ROOT, poll

PREFIX = "cogworker-demo:"


def test_make_demo_says_its_key_prefix_first_and_writes_no_key_outside_it(tmp_path, redis_url):
    # (A database of its own: a worker of an earlier test, still stopping, may write to db 0.)
    url = redis_url.rsplit("/", 1)[0] + "/7"
    r = redis.Redis.from_url(url, decode_responses=True)
    r.flushdb()
    env = {**os.environ, **FAST_ENV, "PY": sys.executable, "COGWORKER_REDIS_URL": url,
           "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}", "DJANGO_SETTINGS_MODULE": "testproject.settings",
           "PYTHONUNBUFFERED": "1"}
    env.pop("COGWORKER_KEY_PREFIX", None)
    log = tmp_path / "demo.log"
    with open(log, "wb") as out:
        demo = subprocess.Popen(["bash", "scripts/demo.sh"], cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        # (The six limited PartnerCallJobs, the demo's last to run but the scheduled ones.)
        ran = poll(lambda: r.llen(f"{PREFIX}partner-calls:done") == 6, timeout=90)
        # (The twenty async jobs on the event loop, and the five debounced pushes run once, the last.)
        awaited = poll(lambda: r.llen(f"{PREFIX}async-demo") == 20, timeout=30)
        debounced = poll(lambda: r.lrange(f"{PREFIX}debounce-demo", 0, -1) == ["5"], timeout=30)
        # (The groups' 43 jobs and the urgent one.)
        fair = poll(lambda: r.llen(f"{PREFIX}fair-demo") == 44, timeout=30)
    finally:
        demo.send_signal(signal.SIGTERM)  # (the worker: the script exec'd it)
        demo.wait(60)
    # (Its output read now: a message built before the wait was the empty log of a demo not yet started.)
    assert ran, f"the demo's jobs didn't run; its output:\n{log.read_text()}"
    assert awaited and debounced, f"the demo's async or debounced jobs didn't run; its output:\n{log.read_text()}"
    assert {entry.split()[1] for entry in r.lrange(f"{PREFIX}async-demo", 0, -1)} == {"cogworker-loop"}
    assert r.lrange(f"{PREFIX}debounce-demo", 0, -1) == ["5"]  # (still once, after the worker stopped)
    assert fair, f"the demo's grouped and prioritized jobs didn't run; its output:\n{log.read_text()}"
    order = r.lrange(f"{PREFIX}fair-demo", 0, -1)
    # Small's three ran in turns with big's, not after its forty; the urgent one before most of big's.
    assert order.index("small:2") < 15 and order.index("urgent") < 25, order
    lines = log.read_text().splitlines()
    assert lines[0] == (f'demo: every key under the prefix "{PREFIX}" (COGWORKER_KEY_PREFIX), so a Redis other '
                        f"work uses keeps its own keys")
    keys = r.keys("*")
    r.flushdb()
    r.close()
    assert keys and [key for key in keys if not key.startswith(PREFIX)] == []
