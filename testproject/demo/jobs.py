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
from django_cogworker.push.runtime import get_redis

from .marks import append_line as _append_line
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

    def retry_in(self, count, exc):
        # The demo shows the retry within seconds; the default backoff would wait 15 s or more.
        return 3

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


class ReceiptsSent(Job):
    """A batch's success callback: logs the batch's status."""

    def perform(self, status, orders):
        log.info("ReceiptsSent: batch %s succeeded: %d receipts sent (orders %s)", status["bid"], status["total"],
                 orders)


class Tally(Job):
    """A chain step: adds `n` to the previous step's value (when given one) and logs it."""

    def perform(self, *values):
        total = sum(values)
        log.info("Tally %s: %s = %d", self.jid, " + ".join(map(str, values)), total)
        return total


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


class ConnectionJob(Job):
    """RPUSH onto `key` whether this job's ``get_redis()`` holds a connection of its own ("own": a
    worker's processor thread on a lone Redis) or checks one out per command ("pool")."""

    def perform(self, key):
        client = get_redis()
        client.rpush(key, "own" if client.connection is not None else "pool")


class LogJob(Job):
    """Log `message` at INFO and WARNING through this module's logger, as a project's job does."""

    def perform(self, message):
        log.info("info: %s", message)
        log.warning("warning: %s", message)


class LoggerJob(Job):
    """Log `message` at INFO on the logger named `name` (one the project's LOGGING may route nowhere)."""

    def perform(self, name, message):
        logging.getLogger(name).info("%s", message)


class SleepJob(Job):
    """RPUSH key "start:<jid>", sleep `seconds`, RPUSH key "end:<jid>" (shutdown/orphan tests)."""

    def perform(self, seconds, key):
        _record(key, f"start:{self.jid}")
        time.sleep(seconds)
        _record(key, f"end:{self.jid}")


class SpinJob(Job):
    """Keep its thread running Python for `seconds` (wall time), then INCR `key`: a few at once
    keep a worker bound by its GIL (tests/workers/test_affinity.py)."""

    def perform(self, seconds, key):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
        get_redis().incr(key)


class GatedJob(Job):
    """RPUSH key "start:<jid>", wait until the Redis key `gate` exists (`seconds` at most), RPUSH
    key "end:<jid>" (kill -9 tests: a run that lasts until the test opens the gate, however long
    the machine takes to start another worker meanwhile, and that ends at once when run again)."""

    def perform(self, gate, key, seconds=60.0):
        _record(key, f"start:{self.jid}")
        deadline = time.monotonic() + seconds
        while not get_redis().exists(gate) and time.monotonic() < deadline:
            time.sleep(0.05)
        _record(key, f"end:{self.jid}")


class ProgressJob(Job):
    """Report 0 of `total`, then `done` of `total` with `note` every 50 ms until the Redis key `gate`
    exists (`seconds` at most): a running job with a bar, a note and an ETA (issue 45; the admin's
    busy page in tests/workers/test_progress_browser.py)."""

    def perform(self, gate, done, total, note="", seconds=60.0):
        self.progress(0, total)
        deadline = time.monotonic() + seconds
        while not get_redis().exists(gate) and time.monotonic() < deadline:
            self.progress(done, total, note)
            time.sleep(0.05)


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


class RecordThenSleepJob(Job):
    """RPUSH this job's jid onto `key`, then sleep `seconds`: a run recorded before it finishes.

    The shutdown tests count a jid recorded twice as a duplicate run (the run was cut short by
    the shutdown deadline and requeued).
    """

    def perform(self, key, seconds=0.0):
        _record(key, self.jid)
        time.sleep(seconds)


class FileMarkJob(Job):
    """Append "start <jid> <pid>", sleep `seconds`, append "end <jid> <pid>" to the file `path`.

    Touches no Redis, so it runs (and records) the same while Redis is down: the Redis fault
    tests tell what ran from this file, not from the server they kill.
    """

    def perform(self, path, seconds=0.0):
        _append_line(path, f"start {self.jid} {os.getpid()}")
        time.sleep(seconds)
        _append_line(path, f"end {self.jid} {os.getpid()}")


class PeriodicSlotJob(Job):
    """Periodic tests: RPUSH onto `key` JSON {"event": "start", "slot", "jid", "pid", "t"}, sleep `seconds`,
    then the same with "event": "end". `slot` is the payload's `periodic_slot` (None when not periodic)."""

    def perform(self, key, seconds=0.0):
        mark = {"slot": self.payload.get("periodic_slot"), "jid": self.jid, "pid": os.getpid()}
        _record(key, json.dumps({"event": "start", "t": time.time(), **mark}))
        time.sleep(seconds)
        _record(key, json.dumps({"event": "end", "t": time.time(), **mark}))


class ListFolderJob(Job):
    """Raises ValueError(f"cannot process {name}") for the first file in `folder`.

    With a file name that isn't UTF-8 (b"caf\\xe9.bad"), ``os.listdir`` gives a string holding a
    lone surrogate ("caf\\udce9.bad"), which no UTF-8 writer accepts: the message of the failure.
    """

    retry = 1

    def perform(self, folder):
        for name in sorted(os.listdir(folder)):
            raise ValueError(f"cannot process {name}")


class HugeErrorJob(Job):
    """Raises RuntimeError with a message of `size` characters."""

    retry = 1

    def perform(self, size):
        raise RuntimeError("x" * size)


class ResultJob(Job):
    """Return {"sum": a + b}; keeps a result record (result_ttl) for an hour."""

    result_ttl = 3600
    retry = 0

    def perform(self, a, b):
        return {"sum": a + b}


class TimedJob(Job):
    """Busy-loop `seconds` (Python bytecode, so its timeout of 0.5 s interrupts it); no retries."""

    timeout = 0.5
    retry = 0

    def perform(self, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass


class StubbornJob(Job):
    """Busy-loop forever, catching every JobTimeout (RPUSH key "caught" each time); timeout 0.3 s."""

    timeout = 0.3
    retry = 0

    def perform(self, key):
        while True:
            try:
                _spin_forever()  # (in a function of its own: see CPython 3.13 in engine/run/timeouts.py)
            except BaseException:
                _record(key, "caught")


def _spin_forever():
    while True:
        pass


class TimedMarkJob(Job):
    """Append "start <jid> <time> <tag> <slot>", sleep `seconds`, append "end ..." the same to the file `path`.

    Like FileMarkJob (no Redis: its record survives a Redis failover), with the wall-clock time of each
    mark, the caller's `tag` and the payload's `periodic_slot` ("-" when none), for the failover test's
    counts of what was lost or run twice and when.
    """

    def perform(self, path, seconds=0.0, tag="-"):
        slot = self.payload.get("periodic_slot") or "-"
        _append_line(path, f"start {self.jid} {time.time():.6f} {tag} {slot}")
        time.sleep(seconds)
        _append_line(path, f"end {self.jid} {time.time():.6f} {tag} {slot}")


if os.environ.get("TESTPROJECT_NEW_CODE"):

    class NewlyDeployedJob(Job):
        """Exists only in a worker started with TESTPROJECT_NEW_CODE=1: a job class deployed after
        its first jobs were pushed (tests/test_worker.py). RPUSH this job's jid onto `key`."""

        def perform(self, key):
            _record(key, self.jid)


# --- batches and workflows (tests/test_batches.py, tests/test_workflows.py, tests/test_batch_chaos.py)


class BatchMemberJob(Job):
    """A job of a batch: INCRs `key`:runs:<jid>; fails its first `fails` attempts (counted in Redis
    per jid, so a kill -9 mid-run doesn't reset it; fails < 0: always), sleeping `seconds` first."""

    retry = 2

    def retry_in(self, count, exc):
        return 0.2

    def perform(self, key, fails=0, seconds=0.0):
        redis = get_redis()
        if seconds:
            time.sleep(seconds)
        attempt = redis.hincrby(f"{key}:attempts", self.jid, 1)
        if fails < 0 or attempt <= fails:
            raise RuntimeError(f"BatchMemberJob {self.jid}: failing on purpose (attempt {attempt})")
        redis.hincrby(f"{key}:done", self.jid, 1)


class BatchCallbackJob(Job):
    """A batch callback: RPUSHes {event, bid, options, status} as JSON onto `key`."""

    def perform(self, status, key, **options):
        _record(key, json.dumps({"event": status["event"], "bid": status["bid"], "options": options,
                                 "status": status}))


class AddToOwnBatchJob(Job):
    """A job of a batch that adds `count` BatchMemberJobs (on `key`) to its own batch."""

    def perform(self, key, count):
        with self.batch.jobs():
            for _ in range(count):
                BatchMemberJob.perform_async(key)


class ValueJob(Job):
    """Returns `value` (a workflow step); records `value` onto `key` first when given."""

    def perform(self, value, key=None):
        if key:
            _record(key, json.dumps(value))
        return value


class AddJob(Job):
    """A workflow step taking the previous value: records and returns previous + n (a list: its sum)."""

    def perform(self, previous, n, key):
        total = (sum(previous) if isinstance(previous, list) else previous) + n
        _record(key, json.dumps(total))
        return total


# Flow control's demo jobs live in their own module; imported here so that autodiscovery of
# jobs.py registers them.
from .async_jobs import AsyncBlockingJob, AsyncSleepJob, AsyncTimedJob, AsyncWaitJob  # noqa: E402,F401
from .collapse_jobs import DebouncedJob, KeepLastJob, ThrottledJob  # noqa: E402,F401
from .fair_jobs import PairedJob, RankJob, TurnJob  # noqa: E402,F401
from .fleet_jobs import LeakJob  # noqa: E402,F401
from .flow_jobs import (  # noqa: E402,F401
    CancellableJob,
    CustomerJob,
    ExpiringJob,
    MailJob,
    PairJob,
    PartnerCallJob,
    SoloJob,
)
from .long_jobs import FailOnceWalk, MarkedWalk, ThrottledWalk, TurnsWalk  # noqa: E402,F401
from .profiled_jobs import HotJob  # noqa: E402,F401
from .push_jobs import ChainStepJob, CountedChildJob, PushFiveJob, UniqueCountedChildJob  # noqa: E402,F401
from .secret_jobs import SecretCallback, SecretJob  # noqa: E402,F401
