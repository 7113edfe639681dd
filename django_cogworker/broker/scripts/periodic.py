"""The scripts of periodic entries (slot claim, rollback, enable) and of locks held by a jid."""

from __future__ import annotations

from ._base import Script

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
