"""The collapse feature's scripts: one per push (COLLAPSE_PUSH), and the start and end of a
``keep_last_if_active`` run (RUN_STARTED, RUN_ENDED).

The state of the pushes that collapse under one digest is the hash ``collapse:<digest>`` (home slot,
beside the schedule: broker/keys/): ``mode`` (which mode wrote it: a state another mode wrote, a
class changed between deploys, is begun again), ``jid`` (the job the pushes collapse into),
``raw`` (debounce: that job's schedule entry, what a later push removes), ``running``
(keep_last_if_active: its run began), ``next`` and ``next_jid`` (keep_last_if_active: the follow-up
kept for after the run). Its TTL: debounce, the delay plus STATE_GRACE (past it the job was moved
to its queue: nothing left to replace); throttle, the window; keep_last_if_active,
UNIQUE_LOCK_TTL, set again by every write (a crash can't hold it for ever).

Each script writes the job first and the state second (a script stopped by an error keeps what it
wrote before: a state naming a job never written would drop the pushes after it). A push sent
again by redis-py (its reply lost) finds its own jid in the state and is answered "pushed",
nothing written twice.
"""

from __future__ import annotations

from ...broker.scripts import Script

# Seconds a debounced job's state outlives its due time (a poller's sweep moves it at most a
# few seconds late; past that a push finds it gone from the schedule anyway).
STATE_GRACE = 60

# Writes one job (ARGV[3]) to KEYS[2] (LPUSH to a queue, or ZADD to the schedule at ARGV[4]), with
# the queues listing (KEYS[3], if given) and the schedule's wake-up (ARGV[7], if scheduled).
_WRITE = """
local function write(dest, raw, score, queue, wake, listing)
  local r
  if score == "" then
    r = redis.pcall("LPUSH", dest, raw)
  else
    r = redis.pcall("ZADD", dest, score, raw)
  end
  if type(r) == "table" and r.err then
    return r.err
  end
  if listing then
    redis.pcall("SADD", listing, queue)
  end
  if score ~= "" and wake ~= "" then
    redis.pcall("PUBLISH", wake, score)
  end
  return nil
end
"""

# KEYS[1] = the state (collapse:<digest>), KEYS[2] = where a job goes: its queue (a list) or the
# schedule (a zset: always for debounce), KEYS[3] (optional) = the queues set (a queue's job).
# ARGV[1] = the mode ("debounce", "throttle", "keep_last"), ARGV[2] = the jid, ARGV[3] = the payload,
# ARGV[4] = its score in the schedule ("": the queue), ARGV[5] = the state's TTL (ms),
# ARGV[6] = the queue's name, ARGV[7] = the schedule's wake-up channel ("": none).
# Returns {status, jid, other}: "pushed" (jid written; for a keep_last follow-up, other: the running
# job it waits for), "replaced" (jid took the place of other: a debounced job's schedule entry, or
# a keep_last follow-up), "dropped" (nothing written, other... the jid standing for it, in jid);
# or {"wrongtype", error} (the state is no hash: the caller quarantines it and pushes again).
# A destination Redis refuses is an error reply, nothing written.
COLLAPSE_PUSH = Script(_WRITE + """
local state = redis.pcall("HMGET", KEYS[1], "mode", "jid", "raw", "running", "next_jid")
if state.err then
  return {"wrongtype", state.err}
end
local mode, jid, ttl = ARGV[1], ARGV[2], ARGV[5]
if state[1] and state[1] ~= mode then
  state = {}
end
local held = state[2]
if held == jid or state[5] == jid then
  return {"pushed", jid, ""}
end
local function fresh(...)
  redis.call("DEL", KEYS[1])
  redis.call("HSET", KEYS[1], "mode", mode, "jid", jid, ...)
  redis.call("PEXPIRE", KEYS[1], ttl)
end
if mode == "keep_last" and held and (state[4] or state[5]) then
  redis.call("HSET", KEYS[1], "next", ARGV[3], "next_jid", jid)
  redis.call("PEXPIRE", KEYS[1], ttl)
  if state[5] then
    return {"replaced", jid, state[5]}
  end
  return {"pushed", jid, held}
end
if held and mode ~= "debounce" then
  return {"dropped", held, ""}
end
local err = write(KEYS[2], ARGV[3], ARGV[4], ARGV[6], ARGV[7], KEYS[3])
if err then
  return redis.error_reply(err)
end
if mode == "debounce" then
  local status, other = "pushed", ""
  if held and state[3] and redis.call("ZREM", KEYS[2], state[3]) == 1 then
    status, other = "replaced", held
  end
  fresh("raw", ARGV[3])
  return {status, jid, other}
end
fresh()
return {"pushed", jid, ""}
""")

# KEYS[1] = the state. ARGV[1] = the jid whose run starts, ARGV[2] = the state's TTL (ms).
# Marks the run begun if the state still names this jid: a push now keeps a follow-up.
# Returns 1 (marked), 0 (the state names another job, or none), or the error (a state of the wrong type).
RUN_STARTED = Script("""
local held = redis.pcall("HGET", KEYS[1], "jid")
if type(held) == "table" then
  return held
end
if held ~= ARGV[1] then
  return 0
end
redis.call("HSET", KEYS[1], "running", "1")
redis.call("PEXPIRE", KEYS[1], ARGV[2])
return 1
""")

# KEYS[1] = the state, KEYS[2] = where the follow-up goes (its queue, or the schedule on a cluster),
# KEYS[3] (optional) = the queues set. ARGV[1] = the jid whose run ended, ARGV[2] = "1" if it ended
# for good (success, dead), "0" if it runs again (retry, rescheduled), ARGV[3] = the follow-up's
# score ("": the queue), ARGV[4] = the state's TTL (ms), ARGV[5] = the queue's name, ARGV[6] = the
# wake-up channel. Once for good: the follow-up, if one was kept, is written and the state names it
# (waiting); else the state goes. Not for good: the state says waiting again. A state naming another
# job (this end seen before: a settlement run again after a crash) is left alone.
# Returns 2 (follow-up written), 1 (state released or marked waiting), 0 (not this job's), or
# {"wrongtype", error}.
RUN_ENDED = Script(_WRITE + """
local state = redis.pcall("HMGET", KEYS[1], "jid", "next", "next_jid")
if state.err then
  return {"wrongtype", state.err}
end
if state[1] ~= ARGV[1] then
  return 0
end
if ARGV[2] == "0" then
  redis.call("HDEL", KEYS[1], "running")
  return 1
end
if not state[2] then
  redis.call("DEL", KEYS[1])
  return 1
end
local err = write(KEYS[2], state[2], ARGV[3], ARGV[5], ARGV[6], KEYS[3])
if err then
  return redis.error_reply(err)
end
redis.call("DEL", KEYS[1])
redis.call("HSET", KEYS[1], "mode", "keep_last", "jid", state[3])
redis.call("PEXPIRE", KEYS[1], ARGV[4])
return 2
""")
