"""The scripts of a job's life after its push: fetch, requeue, file in retry or dead, orphans, quarantine."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ._base import Script, _add_remove_trim, _queue_index
from .lanes import LANES, PUSH_END, STRICT_STEP

# KEYS[1] = source zset (schedule or retry), KEYS[2] = queues set,
# KEYS[3] = destination queue list.
# ARGV[1] = the raw entry as stored, ARGV[2] = queue name, ARGV[3] = the new
# payload (built in Python, not re-encoded by cjson, which rounds large
# integers). Returns 1 when moved, 0 when another process took it first. A job with a lane goes to
# the end the fetch takes next (lanes.py's PUSH_END).
# Push, then remove; the queues listing is best-effort.
CLAIM_AND_REQUEUE = Script(PUSH_END + """
if not redis.call("ZSCORE", KEYS[1], ARGV[1]) then
  return 0
end
redis.call(push_end(ARGV[3]), KEYS[3], ARGV[3])
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
# ARGV[3..m+2] = raw payloads of finished jobs to acknowledge first, ARGV[m+3] = the seconds a
# priority step is worth (lanes.py; absent: STRICT_STEP).
# Reliable fetch: acknowledges what finished since the last fetch (LREM: acks
# ride on the fetch, so a busy process makes about one round trip per batch
# instead of one more per job), then moves up to ARGV[1] jobs, each atomically,
# from the queues (a queue with lanes: in its turns, lanes.py) into the in-progress list. A queue
# holding the wrong type is skipped (pcall)
# and reported, never allowed to abort the script after earlier moves: a job
# moved by an aborted script would sit in the in-progress list unknown to us.
# Returns a flat list: index (1-based into the queues), raw, index, raw, ...
# and, for a queue that errored, -index, message.
FETCH_RELIABLE = Script("""
local m = tonumber(ARGV[2])
for i = 3, m + 2 do
  redis.call("LREM", KEYS[1], 1, ARGV[i])
end
local dst = KEYS[1]
local step = tonumber(ARGV[m + 3]) or """ + repr(STRICT_STEP) + """
""" + LANES + """
local out = {}
local want = tonumber(ARGV[1])
local got = 0
for i = 2, #KEYS do
  local n, err = take_queue(KEYS[i], i - 1, want - got, out)
  got = got + n
  if err then
    out[#out + 1] = -(i - 1)
    out[#out + 1] = err
  end
  if got >= want then break end
end
return out
""")

# KEYS[1..n] = queue lists, in the order to try. ARGV[1] = how many at most, ARGV[2] = the seconds
# a priority step is worth (absent: STRICT_STEP).
# Basic fetch's non-blocking batch pop (a queue with lanes: in its turns, lanes.py); same output
# shape as FETCH_RELIABLE.
FETCH_BASIC = Script("""
local dst = false
local step = tonumber(ARGV[2]) or """ + repr(STRICT_STEP) + """
""" + LANES + """
local out = {}
local want = tonumber(ARGV[1])
local got = 0
for i = 1, #KEYS do
  local n, err = take_queue(KEYS[i], i, want - got, out)
  got = got + n
  if err then
    out[#out + 1] = -i
    out[#out + 1] = err
  end
  if got >= want then break end
end
return out
""")

# KEYS[1] = the in-progress list (reliable fetch; absent for basic fetch), KEYS[last] = the queue
# list it came from. ARGV[1] = a queue-list entry a blocking wait took (BLMOVE, BRPOP): a grouped
# or prioritized job, or a doorbell (lanes.py); ARGV[2] = the seconds a priority step is worth.
# The blocking call can't place such an entry; this script does (a doorbell is dropped), then takes
# the queue's next job in turn, as FETCH_* would: the reply is FETCH_*'s (index 1). Pushed back to
# the list instead, the entry went straight to the next fetcher blocked on it, which pushed it back
# again, for seconds on end. An entry that can't be placed (a lane key of the wrong type) is
# returned as an ordinary job; one no longer on the in-progress list (reconciled meanwhile, or this
# call sent again after a lost reply) is left alone: nothing.
UNTAKE = Script("""
local qk = KEYS[#KEYS]
local dst = #KEYS == 2 and KEYS[1]
local step = tonumber(ARGV[2]) or """ + repr(STRICT_STEP) + """
""" + LANES + """
local v = ARGV[1]
if dst and not redis.call("LPOS", dst, v) then
  return {}
end
local kind = lane_kind(v)
if not (kind and route(qk, v, kind)) then
  return {1, v}
end
if dst then
  redis.call("LREM", dst, 1, v)
end
local out = {}
local _, err = take_queue(qk, 1, 1, out)
if err then
  out[#out + 1] = -1
  out[#out + 1] = err
end
return out
""")


# KEYS[1] = in-progress list, KEYS[2] = queues set, KEYS[3..] = destination
# queue lists; on a cluster, where the queues set is in another slot, KEYS[2..]
# are the queue lists (one: the list's own queue's) and the caller lists them.
# ARGV[1] = n, the number of acks that follow; ARGV[2..n+1] = raw payloads
# finished and only waiting for their ack; then quadruples: raw payload on the
# in-progress list, payload to push (may differ: the orphan count), index of
# its queue key in KEYS, and the queue's name for the queues set ("": not
# listed here, the cluster's case).
# Drops the acks and puts every other listed job back at the end its queue is
# popped from (so it runs next), in one atomic step: a separate ack pass that
# failed used to leave finished jobs to be requeued and run again. A job no
# longer on the list is skipped. Push first, then remove. A queue that can't
# be pushed to (the wrong type) leaves its job on the list, for orphan
# recovery once the key guard has moved that key aside: it used to abort the
# script and cost every job after it its requeue (and fail the whole orphan
# check). Returns how many were requeued.
# (One script for both: the cluster's copy of it, pairs and no listing, was
# the same loop written again.)
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
      if ARGV[i + 3] ~= "" then
        redis.pcall("SADD", KEYS[2], ARGV[i + 3])
      end
      moved = moved + 1
    end
  end
end
return moved
""")


def requeue_args(in_progress: str | bytes, queues: str | None, acks: Sequence[Any],
                 moves: Iterable[tuple[Any, Any, str | bytes, str | bytes]]) -> tuple[list[Any], list[Any]]:
    """KEYS and ARGV of REQUEUE: drop ``acks`` from ``in_progress``, and push back each of ``moves``,
    ``(raw on the list, payload to push, queue key, queue name)`` (``queues``: the queues set, or
    None where the caller lists the queues: a cluster's)."""
    keys: list[Any] = [in_progress] if queues is None else [in_progress, queues]
    index: dict[Any, int] = {}
    args: list[Any] = [len(acks), *acks]
    for raw, payload, queue_key, queue in moves:
        args.extend((raw, payload, _queue_index(keys, index, queue_key), "" if queues is None else queue))
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

# KEYS[1..n-3] = the identity's in-progress lists, KEYS[n-2] = in_progress_identities,
# KEYS[n-1] = last_beat hash, KEYS[n] = orphan lock of that identity.
# ARGV[1] = identity. Forgets an identity (orphaned, or leaving) once its lists
# are empty. On a cluster its lists are in their queues' slots: the caller has
# seen them empty and names none, and the registry (home slot) forgets.
FORGET_IDENTITY = Script("""
for i = 1, #KEYS - 3 do
  if redis.call("LLEN", KEYS[i]) > 0 then
    return 0
  end
end
redis.call("SREM", KEYS[#KEYS - 2], ARGV[1])
redis.call("HDEL", KEYS[#KEYS - 1], ARGV[1])
redis.call("DEL", KEYS[#KEYS])
return 1
""")

# KEYS[1] = this process's orphan lock, KEYS[2] = last_beat, KEYS[3] = in_progress_identities,
# KEYS[4] = its in-progress list (none on a cluster, where the list is in its queue's slot).
# ARGV[1] = identity, ARGV[2] = the raw payload taken, ARGV[3] = this host's time (where TIME is refused).
# A process that may have been taken for dead (it stalled) asks before it starts a job it took
# earlier: 0 while another process recovers its list (holding the lock), or once the job is off
# the list (requeued). Else its beat is stamped first, so that a recovery taking the lock after
# this sees it alive (orphans.py), and 1. (A registry or stamp of the wrong type fails every
# orphan check until the key guard moves it aside: no recovery to fend off, so no error here.)
CONFIRM_HELD = Script("""
if redis.call("EXISTS", KEYS[1]) == 1 then
  return 0
end
local now = ARGV[3]
local t = redis.pcall("TIME")
if type(t) == "table" and t[1] then
  now = t[1] .. "." .. string.format("%06d", tonumber(t[2]))
end
redis.pcall("HSET", KEYS[2], ARGV[1], now)
redis.pcall("SADD", KEYS[3], ARGV[1])
if #KEYS < 4 or redis.call("LPOS", KEYS[4], ARGV[2]) then
  return 1
end
return 0
""")

# KEYS[1] = the key, KEYS[2] = its quarantine name, KEYS[3] (optional) a hash where the move is
# noted (in the key's slot: a batch's meta, a limiter key's stats).
# ARGV[1] = expected type, ARGV[2] = quarantine TTL in seconds; with KEYS[3]: ARGV[3] = the
# note's field, ARGV[4] = its value (the time), ARGV[5] = the TTL of a hash the note makes ("":
# none).
# Re-checked here, atomically with the move, so a key fixed (or recreated)
# in between is left alone. The note is written before the move (a note into a hash of the
# wrong type fails the script with nothing moved), or after it when the hash is the key moved
# (into its fresh copy). Returns 1 when moved.
QUARANTINE = Script("""
local actual = redis.call("TYPE", KEYS[1])["ok"]
if actual == "none" or actual == ARGV[1] then
  return 0
end
local function note()
  local made = redis.call("EXISTS", KEYS[3]) == 0
  redis.call("HSET", KEYS[3], ARGV[3], ARGV[4])
  if made and ARGV[5] ~= "" then
    redis.call("EXPIRE", KEYS[3], ARGV[5])
  end
end
if KEYS[3] and KEYS[3] ~= KEYS[1] then
  note()
end
redis.call("RENAME", KEYS[1], KEYS[2])
redis.call("EXPIRE", KEYS[2], ARGV[2])
if KEYS[3] == KEYS[1] then
  note()
end
return 1
""")
