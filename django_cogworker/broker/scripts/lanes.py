"""The Lua the fetch scripts share to take a queue's jobs in turns: its groups round-robin, its
prioritized jobs by score (docs/fairness.md; the keys: broker/keys/families.py's LaneKeys).

A queue with no grouped or prioritized job waiting has no lanes, and its fetch is the plain one:
each job taken pays one byte compared (``lane_kind``), nothing else. A queue with lanes is served
a job a turn: the ring's right end is taken and put back at its left (LMOVE ring ring RIGHT LEFT);
a group's turn takes its list's oldest job, the turn of "" (the queue's ungrouped jobs) takes the
better of the queue list's oldest job (priority 0, ranked by its ``enqueued_at``) and the best
prioritized one (scored ``enqueued_at - priority * step`` at its push: a job ``step`` seconds
older ranks as one a step higher, PRIORITY_AGING).

Where a job joins its lane: a push writes a grouped job to its group's list (the group joining the
ring) and a prioritized one to the queue's ``prio`` set, in its one script (broker/scripts/push.py),
ringing a doorbell into the queue list when that list is empty. Every other way back into a queue
(a retry due, a scheduled job, orphan recovery, a hand-back at shutdown, the admin's "retry now")
writes the queue list, at the end the fetch takes next for a job with a lane (PUSH_END), and the
fetch routes what it finds there (``route``, up to ROUTE_MAX a call): a retried or recovered job
comes back to its group, and to its priority, with no writer having to know of either. A payload
is recognised by its first key (``{"group":"`` or ``{"priority":``), which the push puts first
(features/fairness/); one whose routing fails (a lane key of the wrong type) stays an ordinary job,
run in the queue's turn: never lost. A doorbell (``{"lane":"bell",...}``) wakes a fetcher blocked
on the queue list, and is dropped wherever it is taken; a blocking wait that takes a lane's entry
hands it to UNTAKE (broker/scripts/jobs.py), which places it and takes the next job in turn.

Lane keys are named inside the script from the queue key it is given (``<queue key> lane:...``),
the one exception to "every key comes in KEYS": a group's list can't be named before its turn
comes. They share the queue key's slot (its hash tag, on a cluster), so the script stays cluster
safe.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# The most queue-list entries one fetch call moves into lanes (each an LPUSH or a ZADD, about 2 us
# of Redis's time): a burst of 100,000 grouped pushes is routed over many calls, none holding Redis
# for more than a few milliseconds.
ROUTE_MAX = 1000
# The step of a priority without aging (PRIORITY_AGING = 0): larger than any wait (1e9 s is 31
# years), so priority alone decides; scores (up to 1e11 and some) stay exact to 0.02 ms.
STRICT_STEP = 1e9
# Seconds between the scores of the jobs of one bulk push of a priority (pushed in one instant): they
# run in the order pushed, where equal scores would have been ordered by their payloads' bytes.
BULK_TIE_STEP = 1e-4
# The characters of a group id, as a Lua pattern's class (the fairness feature checks the same).
GROUP_ID = "[%w_%.:@/%+=%-]"

# What a queue-list entry that belongs in a lane starts with: a grouped job, a prioritized one, a
# doorbell.
LANE_PREFIXES = (b'{"group":', b'{"priority":', b'{"lane":')


LANE_FIELDS = frozenset({"group", "priority"})  # (a payload's first key that gives it a lane)
GROUP_ID_TEXT = re.compile(r"[A-Za-z0-9_.:@/+=-]{1,100}\Z")  # (GROUP_ID's class, and a length)


def lane_of(payload: Mapping[str, Any]) -> str | None:
    """Which lane a payload about to be pushed goes to: "g" (its first key a valid group id), "p" (its
    first key a priority, a nonzero int), or None (the queue list, as any job). What the fetch scripts
    read from its opening text, decided here the same way."""
    first = next(iter(payload), None)
    if first == "group":
        group = payload["group"]
        return "g" if isinstance(group, str) and GROUP_ID_TEXT.match(group) else None
    if first == "priority":
        priority = payload["priority"]
        return "p" if isinstance(priority, int) and not isinstance(priority, bool) and priority else None
    return None


def in_lane(raw: bytes | str) -> bool:
    """Whether queue-list entry ``raw`` belongs in a lane (LANE_PREFIXES)."""
    data = raw.encode() if isinstance(raw, str) else raw
    return data[:2] == b'{"' and data.startswith(LANE_PREFIXES)


# The end of a queue list a job coming back (from the schedule, the retry set, the admin) is pushed
# to: a job with a lane at the end the fetch takes next, so that the next fetch routes it at once (a
# prioritized job then takes its place by priority, not behind every job already waiting), any
# other job at the far end, as a push.
PUSH_END = r"""
local function push_end(v)
  if string.byte(v, 2) == 34 and (string.sub(v, 1, 9) == '{"group":' or string.sub(v, 1, 12) == '{"priority":') then
    return "RPUSH"
  end
  return "LPUSH"
end
"""

# A queue's lanes, as Lua functions the fetch scripts call. Before it: ``dst`` (the in-progress list,
# or false for basic fetch, which pops), ``step`` (seconds a priority step is worth). ``take_queue``
# and ``take_lanes`` put the jobs taken into ``out`` as (index, raw) and return how many, and an
# error reply for the queue when one of its keys holds the wrong type.
# A group id is read from the payload's opening text with the pattern GROUP_ID: the characters the
# fairness feature allows (features/fairness/), no brace (on a cluster a "}" would make a group's list
# look like another key), no quote or escape. A payload whose group isn't such is an ordinary job.
LANES = r"""
local routed = 0
local function lane_kind(v)
  if string.byte(v, 2) ~= 34 then return nil end
  local c = string.byte(v, 3)
  if c == 103 and string.sub(v, 1, 9) == '{"group":' then return "g" end
  if c == 112 and string.sub(v, 1, 12) == '{"priority":' then return "p" end
  if c == 108 and string.sub(v, 1, 8) == '{"lane":' then return "b" end
  return nil
end
-- When v was pushed: its own "enqueued_at", the last one in it (a push writes it after the job's
-- arguments, where a dict with such a key would come first).
local function enqueued(v)
  local t
  for x in string.gmatch(v, '"enqueued_at":(%-?[%d%.]+[eE]?[%+%-]?%d*)') do t = x end
  return tonumber(t) or 0
end
-- Add group g of queue qk to the ring (made with "" if absent) unless it is paused; false if the
-- ring or the paused set holds the wrong type.
local function join_ring(qk, g)
  local paused = redis.pcall("SISMEMBER", qk .. " lane:paused", g)
  if type(paused) ~= "number" then return false end
  if paused == 1 then return true end
  local ring = qk .. " lane:ring"
  if redis.call("EXISTS", ring) == 0 and type(redis.pcall("RPUSH", ring, "")) ~= "number" then
    return false
  end
  return type(redis.pcall("LPUSH", ring, g)) == "number"
end
-- Put queue-list entry v into its lane (dropped: a doorbell); false if it stays an ordinary job.
local function route(qk, v, kind)
  if kind == "b" then return true end
  if kind == "g" then
    local g = string.match(v, '^{"group":"(GROUP_ID+)"')
    if not g or #g > 100 then return false end  -- (lane_of's bound: such a job was pushed as an ordinary one)
    local list = qk .. " lane:g:" .. g
    local n = redis.pcall("LPUSH", list, v)
    if type(n) ~= "number" then return false end
    if n == 1 and not join_ring(qk, g) then
      redis.call("LPOP", list)
      return false
    end
    return true
  end
  local p = tonumber(string.match(v, '^{"priority":(%-?%d+)[,}]'))
  if not p then return false end
  return type(redis.pcall("ZADD", qk .. " lane:prio", enqueued(v) - p * step, v)) == "number"
end
local function move(src)
  if dst then return redis.pcall("LMOVE", src, dst, "RIGHT", "LEFT") end
  return redis.pcall("RPOP", src)
end
-- The turn of the queue's ungrouped jobs: the better of the queue list's end and the best priority.
local function take_ungrouped(qk)
  local v
  while true do
    v = redis.pcall("LINDEX", qk, -1)
    if type(v) == "table" then return nil, v.err end
    if not v then break end
    local kind = lane_kind(v)
    if not kind then break end
    if routed >= ROUTE_MAX then
      v = nil  -- (nothing ungrouped can be seen behind it this call: the prioritized jobs' turn)
      break
    end
    if not route(qk, v, kind) then break end  -- (it stays an ordinary job, taken as one)
    routed = routed + 1
    redis.call("RPOP", qk)
  end
  local prio = qk .. " lane:prio"
  local best = redis.pcall("ZRANGE", prio, 0, 0, "WITHSCORES")
  if best.err then return nil, best.err end
  if best[1] and (not v or tonumber(best[2]) < enqueued(v)) then
    if dst then redis.call("LPUSH", dst, best[1]) end
    redis.call("ZREM", prio, best[1])
    return best[1]
  end
  if not v then return nil end
  v = move(qk)
  if type(v) == "table" then return nil, v.err end
  return v
end
-- Group g's turn. A list of the wrong type leaves the ring (its error reported once; the key
-- guard moves the key aside): every turn of it would fail the whole queue.
local function take_group(qk, ring, g)
  local list = qk .. " lane:g:" .. g
  local v = move(list)
  local err
  if type(v) == "table" then v, err = nil, v.err end
  if err or redis.call("EXISTS", list) == 0 then
    redis.call("LREM", ring, 1, g)
    if redis.call("LLEN", ring) == 1 then redis.call("DEL", ring) end
  end
  return v, err
end
-- Up to want jobs of queue qk (index i in the reply), in turns.
local function take_lanes(qk, i, want, out)
  local ring = qk .. " lane:ring"
  local got, misses = 0, 0
  while got < want do
    local size = redis.pcall("LLEN", ring)
    if type(size) == "table" then return got, size.err end
    local member = ""
    if size > 0 then member = redis.call("LMOVE", ring, ring, "RIGHT", "LEFT") end
    local v, err
    if member == "" then v, err = take_ungrouped(qk) else v, err = take_group(qk, ring, member) end
    if err then return got, err end
    if v then
      got, misses = got + 1, 0
      out[#out + 1] = i
      out[#out + 1] = v
    else
      misses = misses + 1
      if misses > size then break end
    end
  end
  return got
end
-- Up to want jobs of queue qk: plain (a byte compared a job) until a lane is met or exists. A lane
-- key of the wrong type: its error, and the queue list's jobs taken as ordinary ones meanwhile, so
-- the queue isn't held up until the key guard moves the key aside.
local function take_queue(qk, i, want, out)
  local got, err = 0, nil
  if redis.call("EXISTS", qk .. " lane:ring", qk .. " lane:prio") > 0 then
    got, err = take_lanes(qk, i, want, out)
    if not err then return got end
  end
  while got < want do
    local v
    if dst then v = redis.pcall("LMOVE", qk, dst, "RIGHT", "LEFT") else v = redis.pcall("RPOP", qk) end
    if type(v) == "table" then return got, v.err end
    if not v then break end
    local c = string.byte(v, 3)
    local kind = (c == 103 or c == 112 or c == 108) and not err and lane_kind(v)
    if kind and route(qk, v, kind) then
      if dst then redis.call("LREM", dst, 1, v) end
      routed = routed + 1
      if kind ~= "b" then
        local more, failed = take_lanes(qk, i, want - got, out)
        return got + more, failed
      end
    elseif not (err and c == 108 and lane_kind(v) == "b") then
      got = got + 1
      out[#out + 1] = i
      out[#out + 1] = v
    elseif dst then
      redis.call("LREM", dst, 1, v)  -- (a doorbell)
    end
  end
  return got, err
end
""".replace("ROUTE_MAX", str(ROUTE_MAX)).replace("GROUP_ID", GROUP_ID)
