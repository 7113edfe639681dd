"""The scripts of a cluster's crossings: each runs in ONE slot, home or a queue's (broker/keys/).

On a cluster a queue's list and in-progress lists live in the queue's slot, the sorted sets
and registries in the home slot, and no script may touch both. A move between them is two
steps (crossings.py), destination first, source second; these are the steps that need more
than one command to be safe and have no script of their own in :mod:`.jobs` (REQUEUE and
FORGET_IDENTITY serve a cluster too, given one slot's keys).
"""

from __future__ import annotations

from ._base import Script, _trim

# KEYS[1] = target zset (retry or dead; the home slot).
# ARGV[1] = score, ARGV[2] = payload, ARGV[3] = trim below score or "",
# ARGV[4] = cap or "".
# The first step of filing a job in retry or dead from a queue slot: add and trim
# as FILE_FAILURE does; the caller then removes it from its in-progress list.
ADD_TRIMMED = Script("""
redis.call("ZADD", KEYS[1], ARGV[1], ARGV[2])
""" + _trim("KEYS[1]", below=3, cap=4) + """return 1
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
