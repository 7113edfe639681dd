"""Every Redis key name django-cogworker uses, built in this one place.

All keys start with the configured prefix (``cogworker:`` by default; ``{cogworker}:`` on a Redis
Cluster, where the config wraps it in a hash tag so every key below shares one slot: cluster.py).

============================  ======  ======================================================  =========
key                           type    meaning                                                 TTL
============================  ======  ======================================================  =========
queues                        set     names of queues ever pushed to                          -
queue:<q>                     list    waiting payloads; LPUSH to enqueue, fetch pops the       -
                                      right end (RPUSH puts a job back to run next)
paused_queues                 set     queues no process fetches from                          -
schedule                      zset    payloads scored by the time they are due                -
retry                         zset    failed payloads scored by their next attempt            -
dead                          zset    payloads that won't run without a human; capped         -
in_progress:<identity>        list    reliable fetch: taken by that process, not settled      -
in_progress_identities        set     processes that own an in-progress list                  -
last_beat                     hash    identity -> Redis TIME of its last heartbeat            -
orphan_lock:<identity>        string  a live process recovering that identity's list          max(thr, 60 s)
processes                     set     live process identities                                 -
process:<identity>            hash    info (JSON), busy, quiet, beat (Redis time)             presence
workers:<identity>            hash    thread name -> JSON of the job that thread runs         presence
signals:<identity>            list    remote signals for that process (quiet, stop, dump);    presence
                                      popped by its heartbeat, deleted at its clean exit
repeat_orphans                list    jobs sent to dead for being orphaned MAX_ORPHANINGS      1,000
                                      times (a record for humans)                             entries
unsettled                     list    jobs that ran but whose retry/dead filing failed        -
stat:processed[:<day>]        string  processed counter (total, per UTC day)                  day: 1 y
stat:failed[:<day>]           string  failed counter (total, per UTC day)                     day: 1 y
stat:class:processed          hash    job class -> runs (failed ones too)                     -
stat:class:failed             hash    job class -> failed runs                                -
stat:class:seconds            hash    job class -> seconds its runs took, summed              -
quarantine:<key>:<t>:<rand>   any     a key found holding the wrong type, moved aside         30 days
periodic:*                    -       see the periodic package (schedule, disabled,           -
                                      enabled_at, locks)
unique:<digest>               string  unique-job lock                                         set
result:<jid>                  hash    a job's result (opt-in: tasks, ``result_ttl``):          result
                                      status, times, return value, errors, worker ids         _ttl
============================  ======  ======================================================  =========

"presence": :func:`presence_ttl` of the process's HEARTBEAT_INTERVAL (60 s with the default 5 s).

One pub/sub channel, not a key (channels are shared by every database of a server):
``schedule:wake``: each scheduled push publishes its due time (epoch seconds) there; the
pollers subscribe, and wake for it.
"""

from __future__ import annotations

import math
import re

PRESENCE_TTL_MIN = 60
PRESENCE_BEATS = 6


def presence_ttl(heartbeat_interval: float) -> int:
    """Seconds a process's hash (and workers hash, and signals) live past its last beat.

    Several beats' worth, and never under a minute: a fixed 60 s let the hashes of a process
    beating every 90 s expire between beats, so it dropped out of ``processes`` and the admin,
    and, its last-beat stamp lost as well, could be taken for dead.
    """
    return max(PRESENCE_TTL_MIN, math.ceil(PRESENCE_BEATS * heartbeat_interval))


def glob_escape(text: str) -> str:
    """Escape Redis MATCH's special characters: ``text`` is matched literally."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


class Keys:
    """Key names for one prefix. Cheap to build; engine objects hold one."""

    def __init__(self, prefix: str = "cogworker:"):
        self.prefix = prefix
        p = prefix
        self.queues = p + "queues"
        self.paused_queues = p + "paused_queues"
        self.schedule = p + "schedule"
        self.retry = p + "retry"
        self.schedule_wake = p + "schedule:wake"  # (a pub/sub channel)
        self.dead = p + "dead"
        self.in_progress_identities = p + "in_progress_identities"
        self.last_beat = p + "last_beat"
        self.processes = p + "processes"
        self.repeat_orphans = p + "repeat_orphans"
        self.unsettled = p + "unsettled"
        self.stat_processed = p + "stat:processed"
        self.stat_failed = p + "stat:failed"
        self.stat_class_processed = p + "stat:class:processed"
        self.stat_class_failed = p + "stat:class:failed"
        self.stat_class_seconds = p + "stat:class:seconds"
        self.periodic_schedule = p + "periodic:schedule"
        self.periodic_disabled = p + "periodic:disabled"
        self.periodic_enabled_at = p + "periodic:enabled_at"
        self.quarantine_prefix = p + "quarantine:"

    def queue(self, name: str) -> str:
        return f"{self.prefix}queue:{name}"

    def queue_name(self, key: str) -> str:
        """Invert :meth:`queue`."""
        return key[len(self.prefix) + len("queue:"):]

    def in_progress(self, identity: str) -> str:
        return f"{self.prefix}in_progress:{identity}"

    def in_progress_identity(self, key: str) -> str:
        """Invert :meth:`in_progress`."""
        return key[len(self.prefix) + len("in_progress:"):]

    @property
    def in_progress_match(self) -> str:
        """The SCAN MATCH pattern of every in-progress list."""
        return glob_escape(self.in_progress("")) + "*"

    def orphan_lock(self, identity: str) -> str:
        return f"{self.prefix}orphan_lock:{identity}"

    def process(self, identity: str) -> str:
        return f"{self.prefix}process:{identity}"

    def signals(self, identity: str) -> str:
        return f"{self.prefix}signals:{identity}"

    def workers(self, identity: str) -> str:
        return f"{self.prefix}workers:{identity}"

    def stat(self, name: str, day: str | None = None) -> str:
        base = f"{self.prefix}stat:{name}"
        return f"{base}:{day}" if day else base

    def quarantine(self, key: str, stamp: int, rand: str) -> str:
        return f"{self.quarantine_prefix}{key}:{stamp}:{rand}"

    def periodic_last_slot(self, pjid: str) -> str:
        return f"{self.prefix}periodic:last_slot:{pjid}"

    def periodic_lock(self, pjid: str, slot: int) -> str:
        return f"{self.prefix}periodic:lock:{pjid}:{slot}"

    def periodic_running(self, pjid: str) -> str:
        return f"{self.prefix}periodic:running:{pjid}"

    def unique(self, digest: str) -> str:
        return f"{self.prefix}unique:{digest}"

    def result(self, jid: str) -> str:
        return f"{self.prefix}result:{jid}"

    def fixed_types(self) -> dict[str, str]:
        """The fixed keys and the Redis type each must hold (for the key guard)."""
        return {
            self.schedule: "zset", self.retry: "zset", self.dead: "zset",
            self.queues: "set", self.processes: "set", self.paused_queues: "set",
            self.in_progress_identities: "set", self.last_beat: "hash",
            self.repeat_orphans: "list", self.unsettled: "list",
            self.periodic_schedule: "hash", self.periodic_disabled: "set", self.periodic_enabled_at: "hash",
            self.stat_processed: "string", self.stat_failed: "string",
            self.stat_class_processed: "hash", self.stat_class_failed: "hash", self.stat_class_seconds: "hash",
        }
