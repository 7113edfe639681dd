"""The fairness feature's scripts: a group paused and resumed in one of its queue's lanes
(broker/keys/families.py's LaneKeys). Each is safe to run again (the quarantine guard runs a script
again after moving a key of the wrong type aside: broker/quarantine.py): SADD, SREM and LREM are.
"""

from __future__ import annotations

from ...broker.scripts import Script

# KEYS[1] = the queue's paused groups (set), KEYS[2] = its ring (list).
# ARGV[1] = the group id.
# Returns 1 if the group wasn't paused, else 0.
# The group leaves the ring at once (not at its next turn): a fetch between the SADD and its turn
# would otherwise have taken one more job of a group the admin had just paused. Its jobs stay in
# its list, and those pushed meanwhile join it (the fetch checks the paused set before it puts a
# group in the ring). A ring left holding "" alone (the ungrouped jobs' turn) is deleted, as the
# fetch deletes it: a ring's existence is what tells the fetch a queue has groups to take turns.
PAUSE_GROUP = Script("""
local added = redis.call("SADD", KEYS[1], ARGV[1])
redis.call("LREM", KEYS[2], 0, ARGV[1])
local left = redis.call("LRANGE", KEYS[2], 0, 1)
if #left == 1 and left[1] == "" then
  redis.call("DEL", KEYS[2])
end
return added
""")

# KEYS[1] = the queue's paused groups (set), KEYS[2] = its ring (list), KEYS[3] = the group's list,
# KEYS[4] = the queue's list.
# ARGV[1] = the group id, ARGV[2] = a doorbell payload ({"lane":"bell","queue":"<q>"}).
# Returns 1 if the group was paused, else 0.
# A group with jobs waiting goes back in the ring (made with "" first if the queue had no other
# group: the ungrouped jobs keep their turn), at the left end: it takes its turn after the groups
# already waiting, as a group new to the ring would. A fetcher blocked on an empty queue list
# would not see the ring change: the doorbell, LPUSHed into the list only when it is empty (a
# fetcher is then blocked, or soon will be), wakes it; the fetch drops the bell and takes a turn.
RESUME_GROUP = Script("""
local removed = redis.call("SREM", KEYS[1], ARGV[1])
if redis.call("EXISTS", KEYS[3]) == 1 then
  if redis.call("EXISTS", KEYS[2]) == 0 then
    redis.call("LPUSH", KEYS[2], "")
  end
  if not redis.call("LPOS", KEYS[2], ARGV[1]) then
    redis.call("LPUSH", KEYS[2], ARGV[1])
  end
  if redis.call("LLEN", KEYS[4]) == 0 then
    redis.call("LPUSH", KEYS[4], ARGV[2])
  end
end
return removed
""")

# KEYS[1] = the queue's ring (list), KEYS[2] = its paused groups (set).
# ARGV[1] = the prefix of its groups' lists (LaneKeys.group_prefix: the queue's slot), ARGV[2..] =
# group ids whose lists a SCAN found.
# Returns how many groups were put back in the ring.
# A group is in the ring while its list holds jobs and it isn't paused; a push adds it as its list
# goes from empty to not (broker/scripts/lanes.py). A ring lost (deleted by hand, evicted, moved to
# quarantine for holding the wrong type) left its groups' jobs waiting for ever: each such group
# goes back at the left end, the ring made with "" first (the ungrouped jobs' turn).
REPAIR_RING = Script("""
local back = 0
for i = 2, #ARGV do
  local g = ARGV[i]
  local list = ARGV[1] .. g
  if redis.call("TYPE", list).ok == "list" and redis.call("SISMEMBER", KEYS[2], g) == 0
      and not redis.call("LPOS", KEYS[1], g) then
    if redis.call("EXISTS", KEYS[1]) == 0 then
      redis.call("RPUSH", KEYS[1], "")
    end
    redis.call("LPUSH", KEYS[1], g)
    back = back + 1
  end
end
return back
""")
