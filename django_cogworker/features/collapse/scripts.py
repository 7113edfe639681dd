"""The collapse feature's scripts: one per push (COLLAPSE_PUSH), the start and end of a run
(RUN_BEGINS, RUN_ENDED) and the running states' refresh (STILL_RUNNING).

The state of the pushes that collapse under one digest is the hash ``collapse:<digest>`` (home slot,
beside the schedule: broker/keys/): ``mode`` (which mode wrote it: a state another mode wrote, a
class changed between deploys, is begun again), ``jid`` (the job the pushes collapse into), ``said``
and ``other`` (what that job's push was answered: a push sent again by redis-py after a lost reply
finds its jid here and gets the same answer, as the core PUSH's receipt does), ``raw`` (debounce:
that job's schedule entry, what a later push removes), ``out:<jid>`` (debounce: a job replaced while
it waited in its queue, dropped as it starts: "1", then the time, ms, of its first drop; kept after
it, for a start again after its worker died before the ack, until a start of the job the state names
finds it that TTL old), ``running`` (keep_last_if_active: its run began),
``next``, ``next_jid``, ``next_at``, ``next_said``, ``next_other`` (keep_last_if_active: the follow-up
kept for after the run, the time its push asked for, what its push was answered).

TTLs: debounce, until the job is due plus UNIQUE_LOCK_TTL (it goes as the job starts: what bounds it
is a fleet whose pollers are all down that long); throttle, the window; keep_last_if_active,
UNIQUE_LOCK_TTL from the last push, the last run's start or the last refresh of a run under way
(STILL_RUNNING, after each heartbeat), or the retry's due time plus UNIQUE_LOCK_TTL. Never
shortened by a keep_last or debounce write (``extend``): a push while the job waits in retry
doesn't cut the state short of the retry.

Each script writes the job first and the state second (a script stopped by an error keeps what it
wrote before: a state naming a job never written would drop the pushes after it).
"""

from __future__ import annotations

from ...broker.scripts import Script
from ...broker.scripts.lanes import PUSH_END
from ...broker.scripts.push import MARK_TTL

# Writes one job (ARGV[3]) to KEYS[2] (LPUSH to a queue, or ZADD to the schedule at ARGV[4]), with
# the queues listing (KEYS[3], if given) and the schedule's wake-up (ARGV[7], if scheduled). A job
# with a lane (grouped, prioritized) goes to the end of the queue list the fetch takes next, which
# routes it into its lane at once (broker/scripts/lanes.py's PUSH_END): pushed at the far end, it
# waited behind every job already in the queue.
_WRITE = PUSH_END + """
local function write(dest, raw, score, queue, wake, listing)
  local r
  if score == "" then
    r = redis.pcall(push_end(raw), dest, raw)
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

# Sets a key's TTL to at least ``ms`` (never shortens it: a retry's due time may have set it longer).
_EXTEND = """
local function extend(key, ms)
  ms = tonumber(ms)
  if not ms or ms <= 0 then
    return
  end
  ms = math.min(ms, 315360000000)  -- (ten years: a retry_in past that is a bug, not a TTL for PEXPIRE to refuse)
  local left = redis.call("PTTL", key)
  if left < ms then  -- (-1: none yet, a state just written)
    redis.call("PEXPIRE", key, math.floor(ms))
  end
end
"""

# KEYS[1] = the state (collapse:<digest>), KEYS[2] = where a job goes: its queue (a list) or the
# schedule (a zset: always for debounce), KEYS[3] = the outbox marks of the home slot
# (keys.outbox_marks(), read and written only for an outbox job), KEYS[4] (optional) = the queues set
# (a queue's job).
# ARGV[1] = the mode ("debounce", "throttle", "keep_last"), ARGV[2] = the jid, ARGV[3] = the payload,
# ARGV[4] = its score in the schedule ("": the queue), ARGV[5] = the state's TTL (ms),
# ARGV[6] = the queue's name, ARGV[7] = the schedule's wake-up channel ("": none), ARGV[8] = the time
# the push asked for (perform_in/perform_at; "": none), kept with a keep_last follow-up, ARGV[9] =
# "1" for an outbox job (a row handed over at commit or by a relay): its mark there, not run out, says
# it was handed over before (a relay pushing a row again after its pusher died before deleting it):
# answered "dropped", nothing written; else the mark is written with whatever the push came to, as
# the core PUSH does (broker/scripts/push.py, MARK_TTL).
# Returns {status, jid, other}: "pushed" (jid written; for a keep_last follow-up, other: the running
# job it waits for), "replaced" (jid took the place of other: a debounced job's schedule entry, or
# one waiting in its queue, dropped as it starts; or a keep_last follow-up), "dropped" (nothing
# written: the jid standing for it, in jid); or {"wrongtype", error} (the state is no hash: the
# caller quarantines it and pushes again). A destination Redis refuses is an error reply, nothing
# written. A push sent again (its jid already in the state) gets the answer the first got.
COLLAPSE_PUSH = Script(_WRITE + _EXTEND + """
local state = redis.pcall("HMGET", KEYS[1], "mode", "jid", "raw", "running", "next_jid", "said", "other",
                          "next_said", "next_other")
if state.err then
  return {"wrongtype", state.err}
end
local mode, jid, ttl = ARGV[1], ARGV[2], ARGV[5]
local function answer(status, who, other)
  if ARGV[9] == "1" then
    local t = redis.call("TIME")
    local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
    -- (pcall: the job is written already; a marks key of the wrong type costs the mark, not the push)
    redis.pcall("ZADD", KEYS[3], now + """ + str(MARK_TTL) + """, jid)
    redis.pcall("ZREMRANGEBYSCORE", KEYS[3], "-inf", now)
    redis.pcall("EXPIRE", KEYS[3], """ + str(MARK_TTL) + """)
  end
  return {status, who, other}
end
if ARGV[9] == "1" and state[2] ~= jid and state[5] ~= jid then
  local t = redis.call("TIME")
  local marked = redis.pcall("ZSCORE", KEYS[3], jid)
  if type(marked) == "string" and tonumber(marked) > tonumber(t[1]) then
    return {"dropped", jid, ""}
  end
end
if state[1] and state[1] ~= mode then
  redis.call("DEL", KEYS[1])
  state = {}
end
local held = state[2]
if held == jid then
  return {state[6] or "pushed", jid, state[7] or ""}
elseif state[5] == jid then
  return {state[8] or "pushed", jid, state[9] or ""}
end
if mode == "keep_last" and held and (state[4] or state[5]) then
  local status, other = "pushed", held
  if state[5] then
    status, other = "replaced", state[5]
  end
  redis.call("HSET", KEYS[1], "next", ARGV[3], "next_jid", jid, "next_at", ARGV[8], "next_said", status,
             "next_other", other)
  extend(KEYS[1], ttl)
  return answer(status, jid, other)
end
if held and mode ~= "debounce" then
  return answer("dropped", held, "")
end
local err = write(KEYS[2], ARGV[3], ARGV[4], ARGV[6], ARGV[7], KEYS[4])
if err then
  return redis.error_reply(err)
end
if mode == "debounce" then
  local status, other = "pushed", ""
  if held then
    -- Still in the schedule: removed. Gone from it but the state still names it: the poller moved
    -- it to its queue and it hasn't started (its start clears the state), so it is marked to be
    -- dropped as it starts: this push's job, due later, takes its place. (Its ZREM only removes an
    -- entry that is there, so a job already moved is never lost without this mark.)
    status, other = "replaced", held
    if not state[3] or redis.call("ZREM", KEYS[2], state[3]) == 0 then
      redis.call("HSET", KEYS[1], "out:" .. held, "1")
    end
  end
  redis.call("HSET", KEYS[1], "mode", mode, "jid", jid, "raw", ARGV[3], "said", status, "other", other)
  extend(KEYS[1], ttl)
  return answer(status, jid, other)
end
redis.call("DEL", KEYS[1])
redis.call("HSET", KEYS[1], "mode", mode, "jid", jid)
redis.call("PEXPIRE", KEYS[1], ttl)
return answer("pushed", jid, "")
""")

# KEYS[1] = the state. ARGV[1] = the jid whose run starts, ARGV[2] = the state's TTL (ms), ARGV[3] =
# its mode ("keep_last", "debounce").
# keep_last: marks the run begun if the state still names this jid (a push now keeps a follow-up), its
# TTL at least ARGV[2]. debounce: a job marked replaced in its queue is to be dropped (its mark kept,
# stamped with the time of its first drop: the job back after its worker died is dropped again); the
# job the state names lets it go (a push now starts a new job), keeping the marks of others that are
# pending or dropped less than ARGV[2] ago, the state gone when none is.
# Returns 2 (debounce: replaced, drop it), 1 (marked, or let go), 0 (the state names another job, or
# none), or the error (a state of the wrong type).
RUN_BEGINS = Script(_EXTEND + """
local held = redis.pcall("HGET", KEYS[1], "jid")
if type(held) == "table" then
  return held
end
if ARGV[3] == "debounce" then
  local clock = redis.call("TIME")
  local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
  local mark = "out:" .. ARGV[1]
  local seen = redis.call("HGET", KEYS[1], mark)
  if seen then
    -- Kept, not deleted: a worker killed between this answer and its ack has the job back by
    -- orphan recovery, and its next start must be dropped again (deleted here, it ran: both the
    -- replaced job and its replacement). "1" becomes the time of the first drop: pruned below.
    if seen == "1" then
      redis.call("HSET", KEYS[1], mark, now)
    end
    return 2
  end
  if held ~= ARGV[1] then
    return 0
  end
  redis.call("HDEL", KEYS[1], "jid", "raw", "said", "other")
  -- What's left is "mode" and marks. A mark dropped its job more than the TTL ago is done with
  -- (orphan recovery brings a killed worker's job back long before): it goes, or a digest pushed
  -- for ever (its state never expiring) would gather one per replaced job. A mark not yet seen
  -- ("1": its job still waits in its queue) keeps the state; none left, the state goes.
  local fields = redis.call("HGETALL", KEYS[1])
  local left = 0
  for i = 1, #fields, 2 do
    if string.sub(fields[i], 1, 4) == "out:" then
      local at = tonumber(fields[i + 1])
      if fields[i + 1] ~= "1" and at and at + (tonumber(ARGV[2]) or 3600000) < now then
        redis.call("HDEL", KEYS[1], fields[i])
      else
        left = left + 1
      end
    end
  end
  if left == 0 then
    redis.call("DEL", KEYS[1])
  end
  return 1
end
if held ~= ARGV[1] then
  return 0
end
redis.call("HSET", KEYS[1], "running", "1")
extend(KEYS[1], ARGV[2])
return 1
""")

# KEYS = the states of the keep_last runs under way in this process; ARGV[1] = the TTL (ms), then
# one jid per key. Keeps each state that still names its run alive at least ARGV[1] more: a run
# longer than UNIQUE_LOCK_TTL keeps its follow-up. Returns how many were refreshed.
STILL_RUNNING = Script(_EXTEND + """
local n = 0
for i, key in ipairs(KEYS) do
  local held = redis.pcall("HGET", key, "jid")
  if held == ARGV[i + 1] then
    extend(key, ARGV[1])
    n = n + 1
  end
end
return n
""")

# KEYS[1] = the state, KEYS[2] = the schedule, KEYS[3] and KEYS[4] (not on a cluster) = the job's queue
# and the queues set. ARGV[1] = the jid whose run ended, ARGV[2] = "1" if it ended for good (success,
# dead, died off its path), "0" if it runs again (retry, rescheduled), ARGV[3] = not for good: when it
# is due again (epoch seconds; "": unknown), ARGV[4] = the state's TTL (ms; "": keep the state's own,
# for a death the worker didn't see), ARGV[5] = the queue's name, ARGV[6] = the wake-up channel.
# For good: the follow-up, if one was kept, is written (to its queue, or to the schedule at the time
# its push asked for when that is later; on a cluster the schedule, due now) and the state names it
# (waiting); else the state goes. Not for good: the state says waiting again, kept at least until
# the job is due again plus its TTL. A state naming another job (this end seen before: a settlement
# run again after a crash) is left alone. "Now" is Redis's TIME, as the poller's.
# Returns 2 (follow-up written), 1 (state released or marked waiting), 0 (not this job's), or
# {"wrongtype", error}.
RUN_ENDED = Script(_WRITE + _EXTEND + """
local state = redis.pcall("HMGET", KEYS[1], "jid", "next", "next_jid", "next_at", "next_said", "next_other")
if state.err then
  return {"wrongtype", state.err}
end
if state[1] ~= ARGV[1] then
  return 0
end
local clock = redis.call("TIME")
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local ttl = tonumber(ARGV[4])
if ARGV[2] == "0" then
  redis.call("HDEL", KEYS[1], "running")
  local due = tonumber(ARGV[3])
  if ttl and due and due > now then
    extend(KEYS[1], ttl + math.ceil((due - now) * 1000))
  elseif ttl then
    extend(KEYS[1], ttl)
  end
  return 1
end
if not state[2] then
  redis.call("DEL", KEYS[1])
  return 1
end
local at = tonumber(state[4] or "")
local dest, score, listing = KEYS[2], string.format("%.6f", now), nil
local later = 0
if at and at > now then
  score, later = state[4], math.ceil((at - now) * 1000)
elseif KEYS[3] then
  dest, score, listing = KEYS[3], "", KEYS[4]
end
local err = write(dest, state[2], score, ARGV[5], ARGV[6], listing)
if err then
  return redis.error_reply(err)
end
if not ttl then
  ttl = redis.call("PTTL", KEYS[1])
  if ttl <= 0 then
    ttl = 3600000
  end
end
redis.call("DEL", KEYS[1])
redis.call("HSET", KEYS[1], "mode", "keep_last", "jid", state[3], "said", state[5] or "pushed",
           "other", state[6] or "")
redis.call("PEXPIRE", KEYS[1], math.min(ttl + later, 315360000000))
return 2
""")
