"""Jobs of the fleet tests (tests/test_fleet.py): memory caps and rolling restarts."""

import os
import time

from django_cogworker import Job
from django_cogworker.push.runtime import get_redis

# What LeakJob keeps: held for the process's life, as a leak is.
_LEAKED: list[bytearray] = []


class LeakJob(Job):
    """Keep `mb` MB more for good (a leak), sleep `seconds`, then count this run: HINCRBY `key` <jid> 1
    and SADD `key`:pids <pid>. A jid counted twice ran twice.

    The memory is written (``bytearray(...) * n`` fills every page), so it is resident: a zeroed
    allocation (``bytes(n)``) may be untouched pages the RSS never counts.
    """

    def perform(self, key, mb=4, seconds=0.0):
        _LEAKED.append(bytearray(b"\x01") * (mb << 20))
        time.sleep(seconds)
        pipe = get_redis().pipeline()
        pipe.hincrby(key, self.jid, 1)
        pipe.sadd(f"{key}:pids", os.getpid())
        pipe.execute()
