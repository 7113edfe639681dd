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
