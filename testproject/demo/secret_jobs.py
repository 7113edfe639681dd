"""Jobs that encrypt their arguments (tests/test_encryption_workers.py).

None writes its clear argument anywhere: what it records is a SHA-256 of it (``seen``), so that
a test that dumps every Redis key can assert the clear text is nowhere, and still check that the
job was handed the right value.
"""

import hashlib
import json
import time

from django_cogworker import Job
from django_cogworker.push.runtime import get_redis


def seen(secret: str) -> str:
    """What these jobs record of a secret they were given."""
    return hashlib.sha256(secret.encode()).hexdigest()


class SecretJob(Job):
    """RPUSHes {jid, seen(secret), attempt, its payload's args} as JSON onto `key`; ``hold``: then waits
    until `key`:go exists (30 s at most); fails its first `fails` attempts (-1: all), with an error
    message that doesn't hold the secret."""

    encrypt = True
    retry = 2

    def retry_in(self, count, exc):
        return 0.5

    def perform(self, key, secret, fails=0, hold=False):
        redis = get_redis()
        attempt = redis.hincrby(f"{key}:attempts", self.jid, 1)
        redis.rpush(key, json.dumps({"jid": self.jid, "seen": seen(secret), "attempt": attempt,
                                     "payload_args": self.payload.get("args")}))
        if hold:
            for _ in range(300):
                if redis.exists(f"{key}:go"):
                    break
                time.sleep(0.1)
        if fails < 0 or attempt <= fails:
            raise RuntimeError(f"failing on purpose (attempt {attempt})")


class SecretCallback(Job):
    """A batch callback that encrypts: RPUSHes {event, seen(options["secret"])} onto `key`."""

    encrypt = True

    def perform(self, status, key, secret):
        get_redis().rpush(key, json.dumps({"event": status["event"], "bid": status["bid"], "seen": seen(secret)}))
