"""The scripts of a cluster's crossings: each runs in ONE slot, home or a queue's (keys.py).

On a cluster a queue's list and in-progress lists live in the queue's slot, the sorted sets
and registries in the home slot, and no script may touch both. A move between them is two
steps (crossings.py), destination first, source second; these are the steps that need more
than one command to be safe.
"""

from __future__ import annotations

from ._base import Script

# KEYS[1] = target zset (retry or dead; the home slot).
# ARGV[1] = score, ARGV[2] = payload, ARGV[3] = trim below score or "",
# ARGV[4] = cap or "".
# The first step of filing a job in retry or dead from a queue slot: add and trim
# as FILE_FAILURE does; the caller then removes it from its in-progress list.
ADD_TRIMMED = Script("""
redis.call("ZADD", KEYS[1], ARGV[1], ARGV[2])
if ARGV[3] ~= "" then
  redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", "(" .. ARGV[3])
end
if ARGV[4] ~= "" then
  redis.call("ZREMRANGEBYRANK", KEYS[1], 0, -tonumber(ARGV[4]) - 1)
end
return 1
""")

# KEYS[1] = source zset (schedule, retry or dead; the home slot).
# ARGV = pairs: the raw entry as stored, the score it was read with; then
# ARGV[#ARGV] = the lease: the score leased entries get.
# Leases entries about to be pushed to their queue (another slot): each one
# still scored as it was read is re-scored to the lease, so a second poller
# (or admin) that read it too finds it changed and leaves it, and one whose
# mover dies before removing it comes due again at the lease, to be moved then
# (a duplicate at worst, never a loss). Returns, per pair, 1 if leased, else 0.
LEASE = Script("""
local lease = ARGV[#ARGV]
local out = {}
for i = 1, #ARGV - 1, 2 do
  local score = redis.call("ZSCORE", KEYS[1], ARGV[i])
  if score and tonumber(score) == tonumber(ARGV[i + 1]) then
    redis.call("ZADD", KEYS[1], "XX", lease, ARGV[i])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
""")

# KEYS[1] = source zset (schedule, retry or dead; the home slot).
# ARGV = pairs: the raw entry as stored, the score it had before LEASE; then
# ARGV[#ARGV] = the lease LEASE gave it.
# Undoes LEASE for entries whose push failed: each still at that lease (no one
# has moved or re-scored it since) goes back to the score it had. Left leased, a
# refused push (a queue key of the wrong type, a queue's node away) moved the
# entry a minute on: a scheduled job's time, a retry's, a dead entry's place
# changed, where a lone Redis's one-script move leaves it as it was. Returns
# how many were put back.
UNLEASE = Script("""
local lease = ARGV[#ARGV]
local restored = 0
for i = 1, #ARGV - 1, 2 do
  local score = redis.call("ZSCORE", KEYS[1], ARGV[i])
  if score and tonumber(score) == tonumber(lease) then
    redis.call("ZADD", KEYS[1], "XX", ARGV[i + 1], ARGV[i])
    restored = restored + 1
  end
end
return restored
""")

# KEYS[1] = in-progress list, KEYS[2] = the queue list of the same queue (one slot).
# ARGV[1] = n, the number of acks that follow; ARGV[2..n+1] = raw payloads to
# drop; then pairs: raw payload on the list, payload to push.
# REQUEUE for one queue's in-progress list (a cluster: the queues listing is in
# another slot; the caller lists the queue after). Push first, then remove; a job
# no longer on the list is skipped; a queue of the wrong type leaves its jobs on
# the list (for orphan recovery). Returns how many were requeued.
REQUEUE_IN_SLOT = Script("""
local n = tonumber(ARGV[1])
for i = 2, n + 1 do
  redis.call("LREM", KEYS[1], 1, ARGV[i])
end
local moved = 0
for i = n + 2, #ARGV, 2 do
  if redis.call("LPOS", KEYS[1], ARGV[i]) then
    local pushed = redis.pcall("RPUSH", KEYS[2], ARGV[i + 1])
    if type(pushed) == "number" then
      redis.call("LREM", KEYS[1], 1, ARGV[i])
      moved = moved + 1
    end
  end
end
return moved
""")

# KEYS[1] = in_progress_identities, KEYS[2] = last_beat hash, KEYS[3] = the
# identity's orphan lock (all in the home slot). ARGV[1] = identity.
# FORGET_IDENTITY's registry half: the caller has seen every in-progress list
# of the identity empty (they are in other slots). A list filled again later
# (it can't be: its process is gone or leaving) would be found by discovery.
FORGET_REGISTRY = Script("""
redis.call("SREM", KEYS[1], ARGV[1])
redis.call("HDEL", KEYS[2], ARGV[1])
redis.call("DEL", KEYS[3])
return 1
""")
