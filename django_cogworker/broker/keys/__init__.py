"""Every Redis key name django-cogworker uses, built in this one place (``Keys``; the groups of
one batch's or one limiter key's keys, and the type each must hold: ``families.py``).

All keys start with the configured prefix (``cogworker:`` by default; ``{cogworker}:`` on a Redis
Cluster, where the config wraps it in a hash tag: cluster.py).

On a cluster (``spread``) the keys of a queue live in that queue's own slot, so different queues
land on different shards: the queue list and the in-progress lists of that queue take the
**queue prefix** ``{cogworker:q:<q>}:`` (the prefix's tag with ``:q:<q>`` added inside), as
``{cogworker:q:<q>}:queue`` and ``{cogworker:q:<q>}:in_progress:<identity>`` (one list per
identity AND queue), and a quarantined one is moved to ``{cogworker:q:<q>}:quarantine:<key>:...``
(a RENAME stays in one slot). Every other key stays in the **home slot**, the prefix's.
Without a cluster the names are those of the table, one in-progress list per identity.

============================  ======  ======================================================  =========
key                           type    meaning                                                 TTL
============================  ======  ======================================================  =========
queues                        set     names of queues ever pushed to                          -
queue:<q>                     list    waiting payloads; LPUSH to enqueue, fetch pops the       -
                                      right end (RPUSH puts a job back to run next);
                                      cluster: ``{cogworker:q:<q>}:queue`` (queue slot)
paused_queues                 set     queues no process fetches from                          -
schedule                      zset    payloads scored by the time they are due                -
retry                         zset    failed payloads scored by their next attempt            -
dead                          zset    payloads that won't run without a human; capped         -
in_progress:<identity>        list    reliable fetch: taken by that process, not settled      -
                                      cluster: ``{cogworker:q:<q>}:in_progress:<identity>``,
                                      one per queue it fetches from (queue slot)
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
                                      (cluster, a key in a slot of its own, a queue's, a
                                      batch's, a limiter key's: ``{cogworker:q:<q>}:quarantine:
                                      <key>:<t>:<rand>``, in the key's slot); by the key
                                      guard, or a feature's key by whoever meets it
                                      (quarantine.py), noted ``lost:<name>`` in a batch's
                                      meta or a limiter key's stats
periodic:*                    -       see the periodic package (schedule, disabled,           -
                                      enabled_at, locks)
unique:<digest>               string  unique-job lock                                         set
collapse:<digest>             hash    pushes that collapse (features/collapse/scripts.py:     mode's
                                      mode, jid, said, raw, out:*, running, next...); the     (scripts
                                      digest unique jobs' or a ``dedup_key``'s                .py)
push_receipt:<pusher>         string  a pushing thread's last push: its token and the reply   10 min
                                      (PUSH), so that a retry of it writes nothing again;
                                      cluster: one per slot pushed to (home, or the queue's)
outbox_marks                  zset    jid -> when its mark runs out: the jobs the outbox      10 min
                                      handed to Redis (PUSH adds them with the jobs, trims
                                      the run-out ones): a second hand-over of a row (a relay
                                      killed before it deleted the row) writes nothing;
                                      cluster: in the slot pushed to (home, or the queue's);
                                      one of the wrong type is quarantined by the push that
                                      finds it
outbox_pushed:unit-<id>       string  how many steps of an outbox unit are done (units.py)   10 min
result:<jid>                  hash    a job's result (opt-in: tasks, ``result_ttl``):          result
                                      status, times, return value, errors, worker ids         _ttl
progress:<jid>                hash    a job's progress (``Job.progress``: done, total, note,  1 day
                                      updated, started, eta; features/progress/), written at  refreshed
                                      most once a second; deleted when the job succeeds or
                                      dies for good, kept across its retries
iteration:<jid>               hash    an iterable job's saved state (features/iteration/):   DEAD_
                                      cursor (JSON; sealed when its arguments are), done,     TIMEOUT
                                      runtime, executions, started_at; deleted when the job   refreshed
                                      succeeds or ends out of the dead set (cancelled)        each save
iteration:longest             hash    job class -> seconds of its longest single iteration    -
                                      (a worker warns at startup of those past
                                      SHUTDOWN_TIMEOUT)
batches                       zset    bid -> created_at of every batch (for listing; pruned   -
                                      of expired ones as it is read)
batch_closing                 zset    bid -> when a jobs() block began closing it; taken off  -
                                      once its callbacks are delivered (a sweep delivers
                                      those of a closer that died: features/batches/delivery.py)
batch:<bid>:*                 -       one batch (batches/): meta (hash), jobs, pending, open  BATCH_TTL
                                      (sets), failed (hash), dead (set), outbox (list);       refreshed
                                      cluster: ``{cogworker:b:<bid>}:batch:*`` (its own       each step
                                      slot); all seven refreshed together (by the steps of
                                      successes that fire nothing, once it ran down 1 min)
batch_delivered:<jid>         string  a batch callback delivered to its queue (once only);    BATCH_TTL
                                      cluster: in that queue's slot
limits                        zset    limiter key -> when last used (heartbeats write it)     -
limit_specs                   hash    limiter key -> JSON kind, size, per, lease, family      -
limit:<key>:*                 -       one limiter key (features/limits/): holders, starts, state,      state,
                                      stats, waiting, parked; cluster:                        starts:
                                      ``{cogworker:l:<key>}:limit:*`` (its own slot)           ~per
cancels                       hash    jid -> JSON {at, interrupt}: cancel requests, read by   a day
                                      every heartbeat (running jobs asked to stop)
stat:cancelled, stat:expired  string  jobs cancelled; jobs dropped at fetch, expired          -
stat:replaced                 hash    reason (memory, jobs, rolling) -> worker processes      -
                                      that exited to be replaced (engine/process/caps.py)
metrics:m:<yyyymmddHHMM>      hash    metrics history, one UTC minute (features/history/):    72 h past
                                      ``<queue>|<class>|p`` runs, ``|f`` failed, ``|ms``       its end
                                      run time summed, ``|b<i>`` runs in bucket i (queue and
                                      class percent-encoded); HINCRBYed by each heartbeat
metrics:h:<yyyymmddHH>        hash    the same, one UTC hour (written at the same flush)      30 d past
metrics:total                 hash    ``<class>|ms``, ``<class>|b<i>`` since counting began   -
                                      (the Prometheus run-time histogram)
metrics:marks                 zset    deploy marks: JSON {label, id} -> Redis time (30 d)     -
profile:<id>                  hash    a run profiled on request (features/profiling/):       1 day
                                      label, jid, class, times, error, top functions, HTML
profiles                      zset    profile id -> its start (a day's, 500 at most)          -
============================  ======  ======================================================  =========

"presence": :func:`presence_ttl` of the process's HEARTBEAT_INTERVAL (60 s with the default 5 s).

One pub/sub channel, not a key (channels are shared by every database of a server):
``schedule:wake``: each scheduled push publishes its due time (epoch seconds) there; the
pollers subscribe, and wake for it.
"""

from __future__ import annotations

import math
from typing import Any

from ..cluster import has_hash_tag, is_cluster_url
from .families import BATCH_TYPES, LIMIT_TYPES, BatchKeys, LaneKeys, LimitKeys, Want, glob_escape, lane_keys

__all__ = ["BATCH_TYPES", "LIMIT_TYPES", "PRESENCE_BEATS", "PRESENCE_TTL_MIN", "BatchKeys", "Keys", "LaneKeys",
           "LimitKeys", "Want", "for_config", "glob_escape", "presence_ttl"]

PRESENCE_TTL_MIN = 60
PRESENCE_BEATS = 6


def presence_ttl(heartbeat_interval: float) -> int:
    """Seconds a process's hash (and workers hash, and signals) live past its last beat.

    Several beats' worth, and never under a minute: a fixed 60 s let the hashes of a process
    beating every 90 s expire between beats, so it dropped out of ``processes`` and the admin,
    and, its last-beat stamp lost as well, could be taken for dead.
    """
    return max(PRESENCE_TTL_MIN, math.ceil(PRESENCE_BEATS * heartbeat_interval))


def for_config(config: Any) -> Keys:
    """The key names of ``config``: spread over the cluster's slots when its Redis is a cluster."""
    return Keys(config.key_prefix, spread=is_cluster_url(config.redis_url))


class Keys:
    """Key names for one prefix. Cheap to build; engine objects hold one.

    ``spread`` (a cluster; the prefix must hold a hash tag, which the config sees to): each
    queue's keys in that queue's own slot (the module's header). ``in_progress`` then needs the
    queue; without ``spread`` the queue given to it is ignored (one list per identity).
    """

    def __init__(self, prefix: str = "cogworker:", spread: bool = False):
        self.prefix = prefix
        self.spread = spread and has_hash_tag(prefix)
        if self.spread:
            # "{cogworker}:" -> "{cogworker:q:" + queue + "}:": the tag's first "}" closes it.
            close = prefix.index("}", prefix.index("{") + 2)
            self._head, self._tail = prefix[:close] + ":q:", prefix[close:]
            # (what every key in a slot of its own starts with: a queue's "q:", a batch's "b:", a
            # limiter key's "l:")
            self._own = prefix[:close] + ":"
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
        self.batches = p + "batches"
        self.batch_closing = p + "batch_closing"
        self.limits = p + "limits"
        self.limit_specs = p + "limit_specs"
        self.cancels = p + "cancels"
        self.stat_cancelled = p + "stat:cancelled"
        self.stat_expired = p + "stat:expired"
        self.stat_replaced = p + "stat:replaced"
        self.history_totals = p + "metrics:total"
        self.history_marks = p + "metrics:marks"
        self.iteration_longest = p + "iteration:longest"
        self.profiles = p + "profiles"

    def filed_in(self, target: str) -> str:
        """The sorted set a job is filed in: "retry", "dead" or "schedule" (a job over a limit)."""
        return {"retry": self.retry, "dead": self.dead, "schedule": self.schedule}[target]

    def queue_prefix(self, name: str) -> str:
        """The prefix of queue ``name``'s keys: its own slot on a cluster, else the prefix."""
        return f"{self._head}{name}{self._tail}" if self.spread else self.prefix

    def queue(self, name: str) -> str:
        if self.spread:
            return f"{self._head}{name}{self._tail}queue"
        return f"{self.prefix}queue:{name}"

    def lanes(self, name: str) -> LaneKeys:
        """The keys of queue ``name``'s groups and priorities (families.py's LaneKeys: its slot)."""
        return lane_keys(self.queue(name))

    def queue_member_key(self, member: bytes) -> bytes:
        """:meth:`queue` of a name as stored in ``queues`` (bytes, which may not be UTF-8)."""
        if self.spread:
            return self._head.encode() + member + (self._tail + "queue").encode()
        return self.queue("").encode() + member

    def queue_name(self, key: str) -> str:
        """Invert :meth:`queue`."""
        if self.spread:
            return key[len(self._head):-len(self._tail + "queue")]
        return key[len(self.prefix) + len("queue:"):]

    def in_progress(self, identity: str, queue: str | None = None) -> str:
        """The in-progress list of ``identity`` (on a cluster, of its fetches from ``queue``)."""
        if self.spread:
            if queue is None:
                raise ValueError("on a cluster an in-progress list belongs to a queue: name it")
            return f"{self._head}{queue}{self._tail}in_progress:{identity}"
        return f"{self.prefix}in_progress:{identity}"

    def in_progress_member_key(self, identity: str, member: bytes) -> bytes:
        """:meth:`in_progress` of a queue named as stored in ``queues`` (bytes, which may not be UTF-8)."""
        if self.spread:
            return self._head.encode() + member + f"{self._tail}in_progress:{identity}".encode()
        return self.in_progress(identity).encode()

    def in_progress_identity(self, key: bytes | str) -> str:
        return self.in_progress_parts(key)[0]  # (the identity)

    def in_progress_parts(self, key: bytes | str) -> tuple[str, bytes | None]:
        """Invert :meth:`in_progress` (and :meth:`in_progress_member_key`): (identity, the queue's
        name as stored in ``queues``, bytes, which may not be UTF-8; None without a cluster).

        Exact for any queue name: the identity is what follows the last ``}:in_progress:``, as a
        queue may be named with that text in it and an identity (host:pid:hex) never is. (Split
        at the first, ``a}:in_progress:b``'s list was read as queue ``a``'s of a process
        ``b}:in_progress:<identity>``; decoded as UTF-8 first, a name that isn't stopped discovery.)
        The identity is decoded with ``surrogateescape``: one not UTF-8 (no process of ours) reads.
        """
        name = key if isinstance(key, bytes) else key.encode()
        if self.spread:
            queue, _, identity = name[len(self._head.encode()):].rpartition(f"{self._tail}in_progress:".encode())
            return identity.decode("utf-8", "surrogateescape"), queue
        return name[len(self.in_progress("").encode()):].decode("utf-8", "surrogateescape"), None

    @property
    def in_progress_match(self) -> str:
        """The SCAN MATCH pattern of every in-progress list."""
        if self.spread:
            return glob_escape(self._head) + "*" + glob_escape(self._tail + "in_progress:") + "*"
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
        """Where ``key`` is moved aside: in its own slot (a RENAME can't cross slots)."""
        if self.spread and key.startswith(self._own) and "}" in key[len(self._own):]:
            # (the key's text up to its tag's "}": the same slot, whatever the queue's name holds)
            close = key.index("}", len(self._own))
            return f"{key[:close]}{self._tail}quarantine:{key}:{stamp}:{rand}"
        return f"{self.quarantine_prefix}{key}:{stamp}:{rand}"

    def quarantined_from(self, name: str) -> str | None:
        """Invert :meth:`quarantine`: the key ``name`` was moved from, or None if it names none."""
        if name.startswith(self.quarantine_prefix):
            rest = name[len(self.quarantine_prefix):]
        elif self.spread and name.startswith(self._own) and "}" in name[len(self._own):]:
            close = name.index("}", len(self._own))
            marker = self._tail + "quarantine:"
            if not name.startswith(marker, close):
                return None
            rest = name[close + len(marker):]
        else:
            return None
        parts = rest.rsplit(":", 2)
        return parts[0] if len(parts) == 3 else None

    @property
    def quarantine_match(self) -> str:
        """A SCAN MATCH pattern that every quarantined key's name matches (and a few others)."""
        if self.spread:  # (the home slot's and the queues' both start with the tag's opening)
            return glob_escape(self.prefix[:self.prefix.index("{") + 1]) + "*quarantine:*"
        return glob_escape(self.quarantine_prefix) + "*"

    def periodic_last_slot(self, pjid: str) -> str:
        return f"{self.prefix}periodic:last_slot:{pjid}"

    def periodic_lock(self, pjid: str, slot: int) -> str:
        return f"{self.prefix}periodic:lock:{pjid}:{slot}"

    def periodic_running(self, pjid: str) -> str:
        return f"{self.prefix}periodic:running:{pjid}"

    def unique(self, digest: str) -> str:
        return f"{self.prefix}unique:{digest}"

    def collapse(self, digest: str) -> str:  # (home slot: beside the schedule)
        return f"{self.prefix}collapse:{digest}"

    def push_receipt(self, pusher: str, queue: str | None = None) -> str:
        """The receipt of ``pusher``'s pushes: in the home slot, or (a cluster) in ``queue``'s."""
        return f"{self.prefix if queue is None else self.queue_prefix(queue)}push_receipt:{pusher}"

    def outbox_pushed(self, jid: str) -> str:
        """The progress of outbox unit ``jid`` (outbox/units.py): how many of its steps are done."""
        return f"{self.prefix}outbox_pushed:{jid}"

    def outbox_marks(self, queue: str | None = None) -> str:
        """The marks of the outbox jobs handed to Redis (PUSH): in the home slot, or (a cluster) in ``queue``'s."""
        return f"{self.prefix if queue is None else self.queue_prefix(queue)}outbox_marks"

    def result(self, jid: str) -> str:
        return f"{self.prefix}result:{jid}"

    def progress(self, jid: str) -> str:
        return f"{self.prefix}progress:{jid}"

    def history(self, stamp: str) -> str:
        """One minute (``m:<yyyymmddHHMM>``) or hour (``h:<yyyymmddHH>``) of the metrics history."""
        return f"{self.prefix}metrics:{stamp}"

    def profile(self, ident: str) -> str:
        return f"{self.prefix}profile:{ident}"

    def iteration(self, jid: str) -> str:
        """An iterable job's saved cursor and counts (features/iteration/state.py)."""
        return f"{self.prefix}iteration:{jid}"

    def batch(self, bid: str) -> BatchKeys:
        """The keys of batch ``bid``: all in one slot, the batch's own on a cluster."""
        if self.spread:
            base = f"{self._head[:-len(':q:')]}:b:{bid}{self._tail}batch:"
        else:
            base = f"{self.prefix}batch:{bid}:"
        return BatchKeys(*(base + name for name in BatchKeys._fields))

    def batch_delivered(self, queue: str, jid: str) -> str:
        """The mark of batch callback ``jid`` delivered to ``queue`` (in that queue's slot)."""
        return f"{self.queue_prefix(queue)}batch_delivered:{jid}"

    def limit(self, key: str) -> LimitKeys:
        """The keys of limiter key ``key``: all in one slot, the key's own on a cluster."""
        if self.spread:
            base = f"{self._head[:-len(':q:')]}:l:{key}{self._tail}limit:"
        else:
            base = f"{self.prefix}limit:{key}:"
        return LimitKeys(base + "holders", base + "starts", base + "state", base + "stats", base + "waiting",
                         base + "parked")

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
            self.batches: "zset", self.batch_closing: "zset",
            self.limits: "zset", self.limit_specs: "hash", self.cancels: "hash",
            self.stat_replaced: "hash", self.history_totals: "hash", self.history_marks: "zset",
            self.iteration_longest: "hash", self.profiles: "zset",
        }
