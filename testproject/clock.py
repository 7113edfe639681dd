"""A test clock for periodic entries (COGWORKER["CLOCK"]): Redis key `testclock` if set, else real time.

Every worker process of a test reads the same key, so a test can drive cron slots across a fleet
without waiting for them.
"""

import time

from django_cogworker.push.runtime import get_redis


def redis_clock() -> float:
    value = get_redis().get("testclock")
    return float(value) if value is not None else time.time()
