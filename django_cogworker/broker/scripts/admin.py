"""The scripts of the admin's object model (api): bulk requeues, quarantine restore, bounded reads, pruning."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._base import Script, _queue_index
from .lanes import PUSH_END

# KEYS[1] = source zset (schedule, retry or dead), KEYS[2] = queues set,
# KEYS[3..n] = destination queue lists.
# ARGV = groups of four: the raw entry as stored, the index in KEYS of its
# queue list (3-based), the queue's name, the payload to push (built in Python:
# cjson would round large integers in args).
# retry_all, one batch per call: each entry that is still there is pushed,
# then removed. A push that fails (its queue key of the wrong type) leaves
# that entry where it is and goes on with the others (a job with a lane: to the end the fetch takes
# next, lanes.py's PUSH_END). Returns {moved, failed}.
REQUEUE_FROM_ZSET_BATCH = Script(PUSH_END + """
local moved, failed = 0, 0
for i = 1, #ARGV, 4 do
  if redis.call("ZSCORE", KEYS[1], ARGV[i]) then
    local pushed = redis.pcall(push_end(ARGV[i + 3]), KEYS[tonumber(ARGV[i + 1])], ARGV[i + 3])
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

# KEYS[1] = a sorted set (schedule, retry or dead).
# ARGV[1] = where to start: "rank" (at the rank ARGV[2]) or "after" (after the
# entry scored ARGV[2] whose member is ARGV[3], which may have left the set
# since), ARGV[4] = how many entries at most, ARGV[5] = stop after an entry that
# takes the bytes read past this (a call reads at least one entry).
# retry_all's walk through a set that changes under it: each call finds anew
# the place after the last entry looked at, in the set's own order (score, then
# member bytes). Walked by rank, each entry that left the set in front of that
# rank (a stuck entry deleted meanwhile, one the poller took) shifted the rest
# down by one, and the entry that slid into the rank went on from was skipped.
# Lua compares strings by the server's locale (strcoll), so the bytes are
# compared here one by one, as the set orders them (memcmp).
# Returns {the set's size, the rank of the first entry after (or at) the
# start, then per entry read: the member, whole, and its score}.
ENTRIES_AFTER = Script("""
local function follows(a, b)
  local n, i = math.min(#a, #b), 1
  while i + 63 <= n and string.sub(a, i, i + 63) == string.sub(b, i, i + 63) do
    i = i + 64
  end
  while i <= n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x > y
    end
    i = i + 1
  end
  return #a > #b
end
local size, first = redis.call("ZCARD", KEYS[1]), 0
if ARGV[1] == "rank" then
  first = tonumber(ARGV[2])
else
  local score, member = ARGV[2], ARGV[3]
  local now = redis.call("ZSCORE", KEYS[1], member)
  if now and tonumber(now) == tonumber(score) then
    first = redis.call("ZRANK", KEYS[1], member) + 1
  else
    -- Gone (or re-scored): past the entries scored below it, and past those of
    -- its score whose member sorts before it (a binary search among them).
    first = redis.call("ZCOUNT", KEYS[1], "-inf", "(" .. score)
    local last = redis.call("ZCOUNT", KEYS[1], "-inf", score)
    while first < last do
      local mid = math.floor((first + last) / 2)
      if follows(redis.call("ZRANGE", KEYS[1], mid, mid)[1], member) then
        last = mid
      else
        first = mid + 1
      end
    end
  end
end
local out, copied = {size, first}, 0
for i = first, math.min(first + tonumber(ARGV[4]), size) - 1 do
  if copied >= tonumber(ARGV[5]) then
    break
  end
  local row = redis.call("ZRANGE", KEYS[1], i, i, "WITHSCORES")
  local n = #out
  out[n + 1], out[n + 2] = row[1], row[2]
  copied = copied + #row[1]
end
return out
""")

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

# KEYS[1] = queues set, KEYS[2] = paused_queues set, then four keys a queue: its list, its lanes'
#   ring, its priorities (zset) and its paused groups (set) (broker/keys/families.py's LaneKeys).
# ARGV = the queues' names, in the order of their keys.
# Takes off `queues` each name whose list is empty and that isn't paused: with
# one queue per tenant, `queues` grew to 100,000 names, most of them empty, and
# every page listing them paid for each. Atomic, so a push can't land between
# the check and the SREM; the next push finds the list empty and lists the name again.
# A queue whose lanes hold jobs (a ring while any group waits, priorities) or paused groups
# (whose lists are out of the ring) keeps its name: its own list is empty while 5,000 of its
# grouped jobs wait, and a name off the list vanished from every page.
# A list key of the wrong type is left alone. Returns how many were removed.
PRUNE_QUEUES = Script("""
local removed = 0
for i = 3, #KEYS, 4 do
  local name = ARGV[(i - 3) / 4 + 1]
  local length = redis.pcall("LLEN", KEYS[i])
  if length == 0 and redis.call("SISMEMBER", KEYS[2], name) == 0
      and redis.call("EXISTS", KEYS[i + 1], KEYS[i + 2], KEYS[i + 3]) == 0 then
    removed = removed + redis.call("SREM", KEYS[1], name)
  end
end
return removed
""")
