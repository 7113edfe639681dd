"""Jobs of the demo project (autodiscovered by django_cogworker as `<app>/jobs.py`).

The first group is what `make demo` enqueues; the second is used by tests/ and must keep the
behaviour its docstrings describe.
"""

import json
import logging
import os
import signal
import time

from django.conf import settings
from django.utils import timezone

from django_cogworker import Job
from django_cogworker.runtime import get_redis

from .models import Receipt

log = logging.getLogger(__name__)


# --- demo jobs (make demo) ---------------------------------------------------------------


class SendReceipt(Job):
    """Succeeds: logs and writes a Receipt row."""

    queue = "mail"
    retry = 5

    def perform(self, order_id):
        receipt = Receipt.objects.create(order_id=order_id, sent_at=timezone.now())
        log.info("SendReceipt %s: sent %s", self.jid, receipt)


class FlakyJob(Job):
    """Raises on its first `fails` attempts, then succeeds on a retry.

    Attempts are counted in a file per jid under .cogworker/flaky/ (the jid survives retries),
    so the demo does not depend on the library's retry bookkeeping to show a retry working.
    """

    retry = 3

    def perform(self, fails=1):
        counter = settings.STATE_DIR / "flaky" / f"{self.jid}.attempts"
        counter.parent.mkdir(parents=True, exist_ok=True)
        attempt = (int(counter.read_text()) if counter.exists() else 0) + 1
        counter.write_text(str(attempt))
        if attempt <= fails:
            raise RuntimeError(f"FlakyJob {self.jid}: failing on purpose (attempt {attempt} of {fails + 1})")
        counter.unlink()
        log.info("FlakyJob %s: succeeded on attempt %d", self.jid, attempt)


class ScheduledHello(Job):
    """Logs a greeting; enqueued with perform_in by the demo to show the scheduled poller."""

    def perform(self, name="world"):
        log.info("ScheduledHello %s: hello, %s!", self.jid, name)


# --- used by tests/ ----------------------------------------------------------------------


def _record(key, value):
    get_redis().rpush(key, value)


class RecordJob(Job):
    """RPUSH `value` (or, when None, this job's jid) onto the Redis list `key`.

    str/int/float go in as Redis encodes them; anything else is stored as JSON.
    """

    def perform(self, key, value=None):
        if value is None:
            value = self.jid
        elif not isinstance(value, (str, int, float)) or isinstance(value, bool):
            value = json.dumps(value)
        _record(key, value)


class SleepJob(Job):
    """RPUSH key "start:<jid>", sleep `seconds`, RPUSH key "end:<jid>" (shutdown/orphan tests)."""

    def perform(self, seconds, key):
        _record(key, f"start:{self.jid}")
        time.sleep(seconds)
        _record(key, f"end:{self.jid}")


class FailJob(Job):
    """Always raises RuntimeError(message)."""

    retry = 2

    def perform(self, message="FailJob failed"):
        raise RuntimeError(message)


class BadStrError(Exception):
    """An exception whose str() itself raises: error filing must not depend on str(exc)."""

    def __str__(self):
        raise ValueError("BadStrError.__str__ refuses")


class BadStrJob(Job):
    def perform(self):
        raise BadStrError()


class KillSelfJob(Job):
    """SIGKILLs the worker process running it (orphan recovery tests)."""

    def perform(self):
        os.kill(os.getpid(), signal.SIGKILL)
