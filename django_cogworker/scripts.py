"""Every Lua script, each with its KEYS/ARGV header.

All keys come in KEYS (never built inside Lua), so the scripts stay cluster
safe. Run through :class:`Script`: EVALSHA, reloaded on NOSCRIPT (a Redis
restart or SCRIPT FLUSH forgets them).

The rule from cogworker 0.5.0 for every script that moves a job: write the
destination first, remove the source second. A script stopped by an error keeps
the writes made before it, so a remove followed by a failing push (the
destination holding the wrong type) lost the job.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import redis


class Script:
    """A Lua script registered once per client; EVALSHA with NOSCRIPT reload."""

    def __init__(self, source: str):
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, client: Any, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        try:
            # (What client.evalsha does, less its two wrapper calls: every push runs a script.)
            return client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            return client.eval(self.source, len(keys), *keys, *args)

    def in_pipeline(self, pipe: Any, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> None:
        """Queue on a pipeline, as EVAL: a NOSCRIPT reply in a pipeline can't be retried alone."""
        pipe.eval(self.source, len(keys), *keys, *args)


def _add_remove_trim(remove: str, below: int, cap: int) -> str:
    """Lua: the tail four scripts share (filing a job in a sorted set).

    Adds ARGV[3] to the sorted set KEYS[2] at score ARGV[2]; removes ARGV[1]
    from KEYS[1] (``remove``: "ZREM" from a sorted set, "LREM" from a list);
    then trims KEYS[2] of the entries scored below ARGV[``below``] and of all
    but the ARGV[``cap``] highest scored ("" in either skips that trim). Add
    first, remove second: the rule at the top of this module.
    """
    drop = {"ZREM": 'redis.call("ZREM", KEYS[1], ARGV[1])', "LREM": 'redis.call("LREM", KEYS[1], 1, ARGV[1])'}
    return f"""redis.call("ZADD", KEYS[2], ARGV[2], ARGV[3])
{drop[remove]}
if ARGV[{below}] ~= "" then
  redis.call("ZREMRANGEBYSCORE", KEYS[2], "-inf", "(" .. ARGV[{below}])
end
if ARGV[{cap}] ~= "" then
  redis.call("ZREMRANGEBYRANK", KEYS[2], 0, -tonumber(ARGV[{cap}]) - 1)
end
"""


def _queue_index(keys: list[str], index: dict[str, int], queue_key: str) -> int:
    """The position of ``queue_key`` in KEYS as Lua counts (from 1), appended on first sight."""
    if queue_key not in index:
        keys.append(queue_key)
        index[queue_key] = len(keys)
    return index[queue_key]


# KEYS[1] = queues set, KEYS[2] = the queue list.
# ARGV[1] = queue name, ARGV[2] = the payload.
# Enqueues one job (Client._write): LPUSH, then lists the queue, in one command
# where a pipeline of the two cost a second command's parsing and reply on
# both ends of every push. A queue key of the wrong type returns its error
# (nothing written). The listing is best-effort (the key guard repairs it):
# its error is returned as a string for the caller to log, since a push that
# went through must not look failed (the caller would push it again).
# Returns the queue's new length, or that string.
PUSH = Script("""
local pushed = redis.pcall("LPUSH", KEYS[2], ARGV[2])
if type(pushed) == "table" then
  return pushed
end
local listed = redis.pcall("SADD", KEYS[1], ARGV[1])
if type(listed) == "table" then
  return listed.err
end
return pushed
""")

# KEYS[1] = source zset (schedule or retry), KEYS[2] = queues set,
# KEYS[3] = destination queue list.
# ARGV[1] = the raw entry as stored, ARGV[2] = queue name, ARGV[3] = the new
# payload (built in Python, not re-encoded by cjson, which rounds large
# integers). Returns 1 when moved, 0 when another process took it first.
# Push, then remove; the queues listing is best-effort.
CLAIM_AND_REQUEUE = Script("""
if not redis.call("ZSCORE", KEYS[1], ARGV[1]) then
  return 0
end
redis.call("LPUSH", KEYS[3], ARGV[3])
redis.call("ZREM", KEYS[1], ARGV[1])
redis.pcall("SADD", KEYS[2], ARGV[2])
return 1
""")

# KEYS[1] = source zset, KEYS[2] = destination zset.
# ARGV[1] = raw entry in the source, ARGV[2] = new score, ARGV[3] = new payload,
# ARGV[4] = trim: drop entries scored below this (or "" for none),
# ARGV[5] = cap: keep at most this many (or "" for none).
# Moves one entry between sorted sets (retry -> dead from the admin, a
# poisoned schedule entry -> dead). Returns 1 when moved.
MOVE_BETWEEN_ZSETS = Script("""
if not redis.call("ZSCORE", KEYS[1], ARGV[1]) then
  return 0
end
""" + _add_remove_trim("ZREM", below=4, cap=5) + """return 1
""")

# KEYS[1] = in-progress list (reliable fetch; for basic fetch a key that
# doesn't exist), KEYS[2] = target zset (retry or dead).
# ARGV[1] = the raw payload as fetched, ARGV[2] = score, ARGV[3] = new payload,
# ARGV[4] = trim below score or "", ARGV[5] = cap or "".
# Files a failed job and acknowledges it in one step: a crash between the two
# would either lose it or run it again.
FILE_FAILURE = Script("""
""" + _add_remove_trim("LREM", below=4, cap=5) + """return 1
""")

# KEYS[1] = in-progress list, KEYS[2..n] = queue lists, in the order to try.
# ARGV[1] = how many jobs at most, ARGV[2] = m, the number of acks that follow,
# ARGV[3..m+2] = raw payloads of finished jobs to acknowledge first.
# Reliable fetch: acknowledges what finished since the last fetch (LREM: acks
# ride on the fetch, so a busy process makes about one round trip per batch
# instead of one more per job), then moves up to ARGV[1] jobs, each atomically,
# from the queues into the in-progress list. A queue holding the wrong type is skipped (pcall)
# and reported, never allowed to abort the script after earlier moves: a job
# moved by an aborted script would sit in the in-progress list unknown to us.
# Returns a flat list: index (1-based into the queues), raw, index, raw, ...
# and, for a queue that errored, -index, message.
FETCH_RELIABLE = Script("""
for i = 3, tonumber(ARGV[2]) + 2 do
  redis.call("LREM", KEYS[1], 1, ARGV[i])
end
local out = {}
local want = tonumber(ARGV[1])
local got = 0
for i = 2, #KEYS do
  while got < want do
    local v = redis.pcall("LMOVE", KEYS[i], KEYS[1], "RIGHT", "LEFT")
    if type(v) == "table" and v.err then
      out[#out + 1] = -(i - 1)
      out[#out + 1] = v.err
      break
    end
    if not v then break end
    got = got + 1
    out[#out + 1] = i - 1
    out[#out + 1] = v
  end
  if got >= want then break end
end
return out
""")

# KEYS[1..n] = queue lists, in the order to try. ARGV[1] = how many at most.
# Basic fetch's non-blocking batch pop; same output shape as FETCH_RELIABLE.
FETCH_BASIC = Script("""
local out = {}
local want = tonumber(ARGV[1])
local got = 0
for i = 1, #KEYS do
  while got < want do
    local v = redis.pcall("RPOP", KEYS[i])
    if type(v) == "table" and v.err then
      out[#out + 1] = -i
      out[#out + 1] = v.err
      break
    end
    if not v then break end
    got = got + 1
    out[#out + 1] = i
    out[#out + 1] = v
  end
  if got >= want then break end
end
return out
""")

# KEYS[1] = in-progress list, KEYS[2] = queues set, KEYS[3..] = destination
# queue lists.
# ARGV[1] = n, the number of acks that follow; ARGV[2..n+1] = raw payloads
# finished and only waiting for their ack; then triples: raw payload on the
# in-progress list, payload to push (may differ: the orphan count), index of
# its queue key in KEYS (3-based), and the queue's name for the queues set.
# Drops the acks and puts every other listed job back at the end its queue is
# popped from (so it runs next), in one atomic step: a separate ack pass that
# failed used to leave finished jobs to be requeued and run again. A job no
# longer on the list is skipped. Push first, then remove. A queue that can't
# be pushed to (the wrong type) leaves its job on the list, for orphan
# recovery once the key guard has moved that key aside: it used to abort the
# script and cost every job after it its requeue (and fail the whole orphan
# check). Returns how many were requeued.
REQUEUE = Script("""
local n = tonumber(ARGV[1])
for i = 2, n + 1 do
  redis.call("LREM", KEYS[1], 1, ARGV[i])
end
local moved = 0
for i = n + 2, #ARGV, 4 do
  if redis.call("LPOS", KEYS[1], ARGV[i]) then
    local pushed = redis.pcall("RPUSH", KEYS[tonumber(ARGV[i + 2])], ARGV[i + 1])
    if type(pushed) == "number" then
      redis.call("LREM", KEYS[1], 1, ARGV[i])
      redis.pcall("SADD", KEYS[2], ARGV[i + 3])
      moved = moved + 1
    end
  end
end
return moved
""")


def requeue_args(in_progress: str, queues: str, acks: Sequence[Any],
                 moves: Iterable[tuple[Any, Any, str, str]]) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of REQUEUE: drop ``acks`` from ``in_progress``, and push back each of ``moves``,
    ``(raw on the list, payload to push, queue key, queue name)`` (``queues``: the queues set)."""
    keys = [in_progress, queues]
    index: dict[str, int] = {}
    args: list[Any] = [len(acks), *acks]
    for raw, payload, queue_key, queue in moves:
        args.extend((raw, payload, _queue_index(keys, index, queue_key), queue))
    return keys, args


# KEYS[1] = in-progress list, KEYS[2] = dead zset, KEYS[3] = repeat_orphans list.
# ARGV[1] = raw payload on the list, ARGV[2] = score, ARGV[3] = dead payload,
# ARGV[4] = record for repeat_orphans, ARGV[5] = trim below or "", ARGV[6] = cap or "".
# An orphaned job that has been orphaned too often goes to dead, recorded.
ORPHAN_TO_DEAD = Script("""
if not redis.call("LPOS", KEYS[1], ARGV[1]) then
  return 0
end
""" + _add_remove_trim("LREM", below=5, cap=6) + """redis.pcall("LPUSH", KEYS[3], ARGV[4])
redis.pcall("LTRIM", KEYS[3], 0, 999)
return 1
""")

# KEYS[1] = in-progress list, KEYS[2] = unsettled list.
# ARGV[1] = raw payload on the in-progress list, ARGV[2] = the unsettled record.
# At shutdown: hands a job that ran but couldn't be filed in retry/dead over
# to any live process, in the same step that takes it off our list.
PARK_UNSETTLED = Script("""
redis.call("LPUSH", KEYS[2], ARGV[2])
redis.call("LREM", KEYS[1], 1, ARGV[1])
return 1
""")

# KEYS[1] = unsettled list, KEYS[2] = target zset.
# ARGV[1] = the unsettled record, ARGV[2] = score, ARGV[3] = payload,
# ARGV[4] = trim below or "", ARGV[5] = cap or "".
# Files one handed-over job; 0 if another process filed it first.
FILE_UNSETTLED = Script("""
if not redis.call("LPOS", KEYS[1], ARGV[1]) then
  return 0
end
""" + _add_remove_trim("LREM", below=4, cap=5) + """return 1
""")

# KEYS[1] = the orphaned in-progress list, KEYS[2] = in_progress_identities,
# KEYS[3] = last_beat hash, KEYS[4] = orphan lock of that identity.
# ARGV[1] = identity. Forgets an orphaned identity once its list is empty.
FORGET_IDENTITY = Script("""
if redis.call("LLEN", KEYS[1]) > 0 then
  return 0
end
redis.call("SREM", KEYS[2], ARGV[1])
redis.call("HDEL", KEYS[3], ARGV[1])
redis.call("DEL", KEYS[4])
return 1
""")

# KEYS[1] = the key, KEYS[2] = its quarantine name.
# ARGV[1] = expected type, ARGV[2] = quarantine TTL in seconds.
# Re-checked here, atomically with the move, so a key fixed (or recreated)
# in between is left alone. Returns 1 when moved.
QUARANTINE = Script("""
local actual = redis.call("TYPE", KEYS[1])["ok"]
if actual == "none" or actual == ARGV[1] then
  return 0
end
redis.call("RENAME", KEYS[1], KEYS[2])
redis.call("EXPIRE", KEYS[2], ARGV[2])
return 1
""")

# -- periodic entries ----------------------------------------------------------

# KEYS[1] = periodic:last_slot:<pjid>, KEYS[2] = periodic:lock:<pjid>:<slot>,
# KEYS[3] = periodic:running:<pjid>.
# ARGV[1] = slot (epoch seconds), ARGV[2] = slot lock TTL, ARGV[3] = jid of the
# run, ARGV[4] = "1" for until_executed, ARGV[5] = running lock TTL.
# Claims one slot fleet-wide: not if last_slot has reached it, not if another
# process holds its lock. An until_executed entry whose previous run still holds
# the running lock skips the slot (last_slot advances: skipped, not postponed).
# Returns {1, previous last_slot or ""} when claimed, {2, holder} when skipped
# for a run in flight, {0} otherwise.
# Every read comes before the first write: a key of the wrong type fails the
# script before it has taken the slot lock (which used to lose the slot). A
# last_slot that isn't a number counts as none (the claim writes a good one).
PERIODIC_CLAIM = Script("""
local last = redis.call("GET", KEYS[1])
if last and not tonumber(last) then
  last = false
end
if last and tonumber(last) >= tonumber(ARGV[1]) then
  return {0}
end
local holder = false
if ARGV[4] == "1" then
  holder = redis.call("GET", KEYS[3])
end
if not redis.call("SET", KEYS[2], ARGV[3], "NX", "EX", ARGV[2]) then
  return {0}
end
if holder then
  redis.call("SET", KEYS[1], ARGV[1])
  return {2, holder}
end
if ARGV[4] == "1" then
  redis.call("SET", KEYS[3], ARGV[3], "EX", ARGV[5])
end
redis.call("SET", KEYS[1], ARGV[1])
return {1, last or ""}
""")

# KEYS[1] = last_slot, KEYS[2] = slot lock, KEYS[3] = running lock.
# ARGV[1] = slot, ARGV[2] = previous last_slot ("" if none: then slot - 1, which
# still lets this slot fire, unlike deleting the key: with catch-up off, a
# missing last_slot would be re-primed to this very slot instead), ARGV[3] = the
# jid the claim took the running lock under.
# Undoes a won claim whose push then failed, so the slot isn't lost: puts
# last_slot back (only if it still is this slot: a later one may have been
# claimed since), drops the slot lock, and releases the running lock in the
# same step (as a separate call made first, its failure, Redis down being the
# usual reason the push failed, skipped the rollback altogether).
PERIODIC_ROLLBACK = Script("""
if redis.call("GET", KEYS[1]) == ARGV[1] then
  if ARGV[2] == "" then
    redis.call("SET", KEYS[1], tonumber(ARGV[1]) - 1)
  else
    redis.call("SET", KEYS[1], ARGV[2])
  end
end
redis.call("DEL", KEYS[2])
-- Best-effort: an entry without until_executed has no lock, and one of the
-- wrong type mustn't make an applied rollback count as failed forever.
if redis.pcall("GET", KEYS[3]) == ARGV[3] then
  redis.pcall("DEL", KEYS[3])
end
return 1
""")

# KEYS[1] = periodic:disabled, KEYS[2] = periodic:enabled_at.
# ARGV[1] = pjid, ARGV[2] = now (epoch seconds).
# Enables a disabled entry and records when, in one step: a ticker that never
# saw it disabled (its process started meanwhile) reads the time and catches up
# no slot that fell due before it. The HSET comes first: a hash of the wrong
# type fails the script before the entry is enabled. Returns 1 if it was disabled.
PERIODIC_ENABLE = Script("""
if redis.call("SISMEMBER", KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call("HSET", KEYS[2], ARGV[1], ARGV[2])
redis.call("SREM", KEYS[1], ARGV[1])
return 1
""")

# KEYS[1] = a lock held by a jid (periodic:running:<pjid>, unique:<digest>).
# ARGV[1] = jid, ARGV[2] = TTL, or "" to release.
# Keeps alive (or releases) a lock, only while this jid holds it.
HELD_LOCK = Script("""
if redis.call("GET", KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == "" then
  redis.call("DEL", KEYS[1])
else
  redis.call("EXPIRE", KEYS[1], ARGV[2])
end
return 1
""")

# -- the admin's object model (api) ---------------------------------------------

# KEYS[1] = source zset (schedule, retry or dead), KEYS[2] = queues set,
# KEYS[3..n] = destination queue lists.
# ARGV = groups of four: the raw entry as stored, the index in KEYS of its
# queue list (3-based), the queue's name, the payload to push (built in Python:
# cjson would round large integers in args).
# retry_all, one batch per call: each entry that is still there is pushed,
# then removed. A push that fails (its queue key of the wrong type) leaves
# that entry where it is and goes on with the others. Returns {moved, failed}.
REQUEUE_FROM_ZSET_BATCH = Script("""
local moved, failed = 0, 0
for i = 1, #ARGV, 4 do
  if redis.call("ZSCORE", KEYS[1], ARGV[i]) then
    local pushed = redis.pcall("LPUSH", KEYS[tonumber(ARGV[i + 1])], ARGV[i + 3])
    if type(pushed) == "table" and pushed.err then
      failed = failed + 1
    else
      redis.call("ZREM", KEYS[1], ARGV[i])
      redis.pcall("SADD", KEYS[2], ARGV[i + 2])
      moved = moved + 1
    end
  end
end
return {moved, failed}
""")


def requeue_from_zset_batch_args(source: str, queues: str, moves: Iterable[tuple[Any, str, str, Any]]
                                 ) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of REQUEUE_FROM_ZSET_BATCH: move each of ``moves``, ``(raw entry in source,
    queue key, queue name, payload to push)``, from the sorted set ``source`` to its queue
    (``queues``: the queues set)."""
    keys = [source, queues]
    index: dict[str, int] = {}
    args: list[Any] = []
    for raw, queue_key, queue, payload in moves:
        args.extend((raw, _queue_index(keys, index, queue_key), queue, payload))
    return keys, args

# KEYS[1] = a quarantined key, KEYS[2] = the key it was moved from.
# Puts a quarantined key back, without the quarantine's expiry, only while
# the original name is free: never overwrites the fresh key work has carried
# on with. Returns 1 when restored, 0 when the original exists, -1 when the
# quarantined key is gone.
RESTORE_QUARANTINED = Script("""
if redis.call("EXISTS", KEYS[1]) == 0 then
  return -1
end
if redis.call("EXISTS", KEYS[2]) == 1 then
  return 0
end
redis.call("RENAME", KEYS[1], KEYS[2])
redis.call("PERSIST", KEYS[2])
return 1
""")

# KEYS[1] = a sorted set (schedule, retry or dead) or a list (queue:<q>).
# ARGV[1] = what to read: "rank" (a sorted set by rank, lowest score first),
# "revrank" (highest first), "score" (the entries holding one score, in rank
# order) or "list" (a list by index);
# ARGV[2] = the first rank or index (for "score": how many of that score's
# entries to skip), ARGV[3] = how many entries at most,
# ARGV[4] = bytes of each entry's head to return (0: the whole entry),
# ARGV[5] = bytes of its tail to return when the head doesn't hold it all,
# ARGV[6] = the score (for "score"), ARGV[7] = stop after an entry that takes
# the bytes read past this (a call reads at least one entry).
# The admin's pages read entries through this, so a page costs what it shows:
# ZRANGE and LRANGE sent every byte of fifty 10 MB entries to show their first
# line. Redis still copies each entry whole into Lua (about 3 ms a MB, nothing
# reads a part of a member), so a call stops at ARGV[7] bytes and the caller
# calls again: other clients are served in between.
# Returns {the key's size, how many positions were read, then per entry: head,
# score ("" for a list), its size in bytes, tail ("" when the head holds it all)}.
PREVIEW = Script("""
local mode, first, count = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local head, tail, budget = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[7])
local size
if mode == "list" then
  size = redis.call("LLEN", KEYS[1])
else
  size = redis.call("ZCARD", KEYS[1])
end
if mode == "score" then
  local below = redis.call("ZCOUNT", KEYS[1], "-inf", "(" .. ARGV[6])
  local here = redis.call("ZCOUNT", KEYS[1], ARGV[6], ARGV[6])
  count = math.min(count, here - first)
  first = below + first
end
local out, read, copied = {size, 0}, 0, 0
for i = first, math.min(first + count, size) - 1 do
  if copied >= budget then
    break
  end
  local member, score
  if mode == "list" then
    member, score = redis.call("LINDEX", KEYS[1], i), ""
  else
    local row
    if mode == "revrank" then
      row = redis.call("ZREVRANGE", KEYS[1], i, i, "WITHSCORES")
    else
      row = redis.call("ZRANGE", KEYS[1], i, i, "WITHSCORES")
    end
    member, score = row[1], row[2]
  end
  read = read + 1
  if member then
    local n, length = #out, #member
    copied = copied + length
    if head > 0 and length > head then
      out[n + 1], out[n + 4] = string.sub(member, 1, head), tail > 0 and string.sub(member, -tail) or ""
    else
      out[n + 1], out[n + 4] = member, ""
    end
    out[n + 2], out[n + 3] = score, length
  end
end
out[2] = read
return out
""")

# KEYS[1] = a sorted set (schedule, retry or dead).
# ARGV[1] = "rank" or "revrank", ARGV[2] = the first rank to look at,
# ARGV[3] = how many entries at most, ARGV[4] = stop after an entry that takes
# the bytes read past this, ARGV[5] = bytes of each entry's head to return,
# ARGV[6] = of its tail, ARGV[7] = bytes at each end of an entry a needle is
# looked for in, ARGV[8], ARGV[9] = text an entry must hold, matched literally
# ("" for none).
# One step of an admin filter, by rank. The ZSCAN MATCH it replaces sent each
# matching entry whole, and one call over fifty 10 MB entries outlasted the
# filter's 0.12 s budget 25 times (the budget is checked between calls, and
# ZSCAN can't be told to stop at a number of bytes). An entry larger than twice
# the window is searched in its first and last ARGV[7] bytes only.
# Returns {the next rank, the set's size, then per match: head, score, size in
# bytes, tail}.
SCAN_PREVIEW = Script("""
local first, count, budget = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local head, tail, window = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local function holds(member, needle)
  if needle == "" then
    return true
  end
  if #member <= 2 * window then
    return string.find(member, needle, 1, true) ~= nil
  end
  return string.find(string.sub(member, 1, window), needle, 1, true) ~= nil
    or string.find(string.sub(member, -window), needle, 1, true) ~= nil
end
local size = redis.call("ZCARD", KEYS[1])
local out, copied, rank = {0, size}, 0, first
while rank < math.min(first + count, size) and copied < budget do
  local row
  if ARGV[1] == "revrank" then
    row = redis.call("ZREVRANGE", KEYS[1], rank, rank, "WITHSCORES")
  else
    row = redis.call("ZRANGE", KEYS[1], rank, rank, "WITHSCORES")
  end
  rank = rank + 1
  local member = row[1]
  if member then
    local length = #member
    copied = copied + length
    if holds(member, ARGV[8]) and holds(member, ARGV[9]) then
      local n = #out
      out[n + 1] = length > head and string.sub(member, 1, head) or member
      out[n + 2], out[n + 3] = row[2], length
      out[n + 4] = (length > head and tail > 0) and string.sub(member, -tail) or ""
    end
  end
end
out[1] = rank
return out
""")

# KEYS[1] = queues set, KEYS[2] = paused_queues set, KEYS[3..n] = the queue lists.
# ARGV = the queues' names, in the order of KEYS[3..n].
# Takes off `queues` each name whose list is empty and that isn't paused: with
# one queue per tenant, `queues` grew to 100,000 names, most of them empty, and
# every page listing them paid for each. Atomic, so a push can't land between
# the check and the SREM; the next push lists the name again anyway (PUSH).
# A list key of the wrong type is left alone. Returns how many were removed.
PRUNE_QUEUES = Script("""
local removed = 0
for i = 3, #KEYS do
  local name = ARGV[i - 2]
  local length = redis.pcall("LLEN", KEYS[i])
  if length == 0 and redis.call("SISMEMBER", KEYS[2], name) == 0 then
    removed = removed + redis.call("SREM", KEYS[1], name)
  end
end
return removed
""")
