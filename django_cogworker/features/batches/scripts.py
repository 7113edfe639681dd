"""The scripts of batches (django_cogworker/features/batches/): every step that moves a batch's counters.

Every script takes the batch's seven keys as KEYS[1..7], in :class:`~..keys.BatchKeys` order
(meta, jobs, pending, failed, dead, open, outbox), all in the batch's one slot. A step that
makes an event due (complete, success, death) writes its callbacks to the batch's outbox in the
same script, once: the event's ``done_<event>`` stamp is set in that step, right after, so no
later step can fire it again. The outbox is then delivered to the callbacks' queues by
BATCH_DELIVER, once per callback whatever the retries (features/batches/delivery.py).

A job's step is idempotent by its jid: a success removes it from ``pending`` (a second one finds
it gone and moves nothing), a failure records it in ``failed`` only while it is pending. So a job
run again after its process died between the step and its ack moves no counter twice.

A key of the wrong type stops a script at its first command on it, keeping the writes made
before (Redis has no rollback); the caller moves that key to quarantine and runs the script
again (broker/quarantine.py). So each script is safe to run again from wherever it stopped: an
event's callbacks are written to the outbox before its ``done_<event>`` stamp (stamped first, an
outbox of the wrong type lost the callback: the run again found the event done), a success
takes its jid off ``failed`` and ``dead`` before ``pending``, a block's owner goes into ``open``
before a new batch's meta is written. A move is noted in ``meta`` (``lost:<name>``); once
``pending`` or ``open`` was lost, complete and success never fire: the batch can no longer tell
when every job ran or succeeded (a lost ``failed`` only holds complete back until the failing
jobs fail again: what it then counts is true).
"""

from __future__ import annotations

from ...broker.scripts._base import Script
from ...broker.scripts.lanes import PUSH_END
from ..tracing.carried import LINKS_FIELD, LINKS_MAX, TRACEPARENT_LENGTH

# The trace links' constants, formatted in from their one home (features/tracing/carried.py): the
# members' traces a batch keeps for its callbacks at most, the length of each (a W3C traceparent),
# and the callback's payload field that names them.
_TRACES = f'local TRACES_MAX, TP_LEN, LINKS_FIELD = {LINKS_MAX:d}, {TRACEPARENT_LENGTH:d}, "{LINKS_FIELD}"\n'

# The status a callback receives, and what fires an event. ARGV[1] = bid, ARGV[2] = now (epoch
# seconds), ARGV[3] = TTL of the batch's keys (seconds), in every script below.
_COMMON = _TRACES + r"""
local bid, now, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local PLACEHOLDER = '"\\u0000cogworker-batch-status\\u0000"'

local function status(event)
  local m = redis.call("HMGET", KEYS[1], "description", "created_at")
  return cjson.encode({bid = bid, event = event, total = redis.call("SCARD", KEYS[2]),
    pending = redis.call("SCARD", KEYS[3]), failures = redis.call("HLEN", KEYS[4]),
    dead = redis.call("SCARD", KEYS[5]), created_at = tonumber(m[2]), description = m[1] or ""})
end

-- Writes the callbacks of `event` to the outbox (each stored at on(): [queue, jid, payload
-- template], the template's first argument a placeholder for the status).
local function fire(event)
  local stored = redis.call("HGET", KEYS[1], "cb:" .. event)
  if not stored then return end
  local st = status(event)
  local traces = redis.call("HGET", KEYS[1], "traces")
  for _, cb in ipairs(cjson.decode(stored)) do
    local s, e = string.find(cb[3], PLACEHOLDER, 1, true)
    local payload = string.sub(cb[3], 1, s - 1) .. st .. string.sub(cb[3], e + 1)
    if traces then  -- (the template is a JSON object: its last character is its "}")
      payload = string.sub(payload, 1, -2) .. ',"' .. LINKS_FIELD .. '":"' .. traces .. '"}'
    end
    redis.call("RPUSH", KEYS[7], cjson.encode({cb[1], cb[2], payload}))
  end
end

-- Keeps the trace contexts of the jobs that settled (`tps`: W3C traceparents, TP_LEN characters
-- each, checked by the caller, space-separated; "" for none), the first TRACES_MAX distinct ones, in
-- the meta's "traces" field: each callback fired gets them as its payload's LINKS_FIELD (its span
-- links to each member's trace: features/tracing/). Nothing without tracing (tps is ""). Once full,
-- its length says so (HSTRLEN, O(1)): a full batch's step never reads the value again, nor
-- searches it for each of its members' traces (that was 1.8 KB read and scanned a call).
local TRACES_FULL = TRACES_MAX * (TP_LEN + 1) - 1
local function traced(tps)
  if tps == nil or tps == "" then return end
  if redis.call("HSTRLEN", KEYS[1], "traces") >= TRACES_FULL then return end
  local have = redis.call("HGET", KEYS[1], "traces") or ""
  local before = #have
  for tp in string.gmatch(tps, "%S+") do
    if #have >= TRACES_FULL then break end
    if not string.find(have, tp, 1, true) then
      have = have == "" and tp or (have .. " " .. tp)
    end
  end
  if #have ~= before then redis.call("HSET", KEYS[1], "traces", have) end
end

-- Fires complete (every job ran: each pending one is failing) and success (none pending), once
-- each, when the batch is committed and no jobs() block is open on it; returns whether it fired
-- either. The counts first: while some pending job is not failing (every step but the last few),
-- neither can fire, and the step reads nothing more. `failing`: the count, when the caller knows it.
-- Neither fires once `pending` or `open` was lost (the module's header). Each is written to the
-- outbox before it is stamped done.
local function check(failing)
  local pending = redis.call("SCARD", KEYS[3])
  failing = failing or redis.call("HLEN", KEYS[4])
  if pending ~= failing and pending ~= 0 then return false end
  local m = redis.call("HMGET", KEYS[1], "committed", "done_complete", "done_success", "lost:pending", "lost:open")
  if m[1] ~= "1" or m[4] or m[5] or redis.call("SCARD", KEYS[6]) > 0 then return false end
  local fired = false
  if not m[2] and pending == failing then
    fire("complete")
    redis.call("HSET", KEYS[1], "done_complete", now)
    fired = true
  end
  if not m[3] and pending == 0 then
    fire("success")
    redis.call("HSET", KEYS[1], "done_success", now)
    fired = true
  end
  return fired
end

-- A job (or child batch) of the batch went to dead: its first such death fires death, once.
local function died(jid)
  redis.call("SADD", KEYS[5], jid)
  if redis.call("HEXISTS", KEYS[1], "done_death") == 0 then
    fire("death")
    redis.call("HSET", KEYS[1], "done_death", now)
  end
end

local function touch()
  for i = 1, 7 do
    redis.call("EXPIRE", KEYS[i], ttl)
  end
end
"""

# KEYS[1..7] = the batch's keys. ARGV[1..3] = bid, now, TTL; ARGV[4] = owner token of the
# jobs() block; ARGV[5] = "1" when the block runs inside a job of this very batch, else "0";
# ARGV[6] = "1" to create the batch when it doesn't exist; then field, value pairs to create it
# with (description, created_at, parent, cb:<event> ...).
# Opens a jobs() block: no event fires while a block is open. Refuses (-2) to open, from outside
# the batch, a batch whose every job has run (complete): jobs added then would run after its
# callbacks. Returns 1 opened (2: created), -1 no such batch (never created, or expired).
BATCH_OPEN = Script(_COMMON + """
if redis.call("EXISTS", KEYS[1]) == 0 then
  if ARGV[6] ~= "1" then return -1 end
  redis.call("SADD", KEYS[6], ARGV[4])
  redis.call("HSET", KEYS[1], unpack(ARGV, 7))
  touch()
  return 2
end
if ARGV[5] ~= "1" and redis.call("HEXISTS", KEYS[1], "done_complete") == 1 then
  return -2
end
redis.call("SADD", KEYS[6], ARGV[4])
touch()
return 1
""")

# KEYS[1..7] = the batch's keys. ARGV[1..3] = bid, now, TTL; ARGV[4] = owner token.
# Closes a jobs() block: the batch is committed (its events may fire from now on) and fires
# what is due: an empty batch completes and succeeds here. Returns the outbox's length.
BATCH_CLOSE = Script(_COMMON + """
if redis.call("EXISTS", KEYS[1]) == 0 then return -1 end
redis.call("SREM", KEYS[6], ARGV[4])
redis.call("HSET", KEYS[1], "committed", "1")
check()
touch()
return redis.call("LLEN", KEYS[7])
""")

# KEYS[1..7] = the batch's keys. ARGV[1..3] = bid, now, TTL; ARGV[4] = "add" or "remove";
# ARGV[5..] = jids (or "b:<bid>" of child batches).
# Adds jobs to the batch before they are pushed, or removes those whose push failed or was
# stopped (a middleware, a unique job's duplicate): the batch never counts a job never pushed.
# A jid added again (a job that pushed it ran again) is pending again, and its new copy clears it.
# Each command takes every jid of the call (up to 1,000: the caller's chunks): three commands per
# call, not three per job (a perform_bulk in a batch cost Redis three commands a job).
# Returns 1, or -1 when the batch doesn't exist.
BATCH_ADD = Script(_COMMON + """
if redis.call("EXISTS", KEYS[1]) == 0 then return -1 end
if #ARGV >= 5 and ARGV[4] == "add" then
  redis.call("SADD", KEYS[2], unpack(ARGV, 5))
  redis.call("SADD", KEYS[3], unpack(ARGV, 5))
  redis.call("HDEL", KEYS[4], unpack(ARGV, 5))
elseif #ARGV >= 5 then
  redis.call("SREM", KEYS[2], unpack(ARGV, 5))
  redis.call("SREM", KEYS[3], unpack(ARGV, 5))
  redis.call("HDEL", KEYS[4], unpack(ARGV, 5))
  redis.call("SREM", KEYS[5], unpack(ARGV, 5))
end
if ARGV[4] ~= "add" then check() end
touch()
return 1
""")

# KEYS[1..7] = the batch's keys. ARGV[1..3] = bid, now, TTL; ARGV[4] = the job's jid (or
# "b:<bid>" of a child batch); ARGV[5] = its outcome: "success", "failure" (filed in retry, or
# discarded), "dead", or "death" (a child batch's job died; it fails when it completes);
# ARGV[6] = the failure's record (JSON) or "", ARGV[7] = a success's kept return value (JSON, for
# the next step of a chain: workflows.py) or "", ARGV[8] = its trace context (a W3C traceparent)
# or "" (none, or tracing off).
# A job of the batch settled: moves the counters and fires what is due, in one step (the module's
# header). Run before the job's ack or filing, and again with it until it goes through.
# Returns the outbox's length (the caller delivers it), or -1 when the batch doesn't exist.
BATCH_SETTLE = Script(_COMMON + """
if redis.call("EXISTS", KEYS[1]) == 0 then return -1 end
local jid, outcome = ARGV[4], ARGV[5]
traced(ARGV[8])
if outcome == "success" then
  if ARGV[7] ~= "" then
    redis.call("HSET", KEYS[1], "result:" .. jid, ARGV[7])
  end
  -- (off failed and dead first: a jid only ever is in them while pending)
  redis.call("HDEL", KEYS[4], jid)
  redis.call("SREM", KEYS[5], jid)
  redis.call("SREM", KEYS[3], jid)
elseif outcome == "death" then
  -- (a child batch had a job die: the parent's death fires, but the child is not failing until
  -- it completes: its other jobs may still run)
  if redis.call("SISMEMBER", KEYS[3], jid) == 1 then
    died(jid)
  end
elseif redis.call("SISMEMBER", KEYS[3], jid) == 1 then
  redis.call("HSET", KEYS[4], jid, ARGV[6])
  if outcome == "dead" then
    died(jid)
  end
end
check()
touch()
return redis.call("LLEN", KEYS[7])
""")

# KEYS[1..7] = the batch's keys. ARGV[1..3] = bid, now, TTL; ARGV[4] = their trace contexts (W3C
# traceparents, space-separated) or "" (tracing off); ARGV[5..] = the jids of jobs of the batch that
# succeeded (no result kept).
# BATCH_SETTLE's "success" step for each of them, in one call: a worker runs the steps of the jobs
# that finished since its last fetch together, before the fetch that carries their acks
# (engine/settle/outgoing.py, queue.py). Idempotent by jid as BATCH_SETTLE is.
# The common case costs Redis five commands per call, not seventeen per job: while nothing of the
# batch is failing, dead or waiting on the outbox, a success only takes its jid off pending (one
# SREM for them all), and a call that fires nothing writes no key, so it refreshes the keys' TTL
# (all seven together: half of what a job of a batch cost Redis) only once it ran down by a
# minute (or a hundredth of it, when less): a batch's data lives at least TTL - 1 min after its
# last step. Returns the outbox's length (the caller delivers it; 0 when it is known empty), or -1
# when the batch doesn't exist.
BATCH_SUCCEED = Script(_COMMON + """
local left = redis.call("TTL", KEYS[1])
if left == -2 then return -1 end
local quick = redis.call("EXISTS", KEYS[4], KEYS[5], KEYS[7]) == 0
traced(ARGV[4])  -- (traced: the meta written until it holds TRACES_MAX, then its length read once a call)
if not quick then  -- (off failed and dead first, as BATCH_SETTLE)
  redis.call("HDEL", KEYS[4], unpack(ARGV, 5))
  redis.call("SREM", KEYS[5], unpack(ARGV, 5))
end
redis.call("SREM", KEYS[3], unpack(ARGV, 5))
local fired = check(quick and 0 or nil)
if not quick or fired or left < ttl - math.min(60, math.floor(ttl / 100)) then
  touch()
end
if quick and not fired then return 0 end
return redis.call("LLEN", KEYS[7])
""")

# KEYS[1] = the callback's delivery mark (keys.batch_delivered, in its queue's slot), KEYS[2] =
# its queue list, KEYS[3] = the queues set (absent on a cluster: the caller lists the queue).
# ARGV[1] = the callback's payload, ARGV[2] = the mark's TTL (seconds), ARGV[3] = the queue name.
# Pushes a fired callback to its queue unless its mark says it was delivered before: the caller
# then takes it off the outbox (another slot on a cluster), and one that dies in between leaves it
# there for the next delivery, which finds the mark and only takes it off. Returns 1 pushed, 0 not.
# The push first, the mark second: marked first, a queue of the wrong type stopped the script
# between them, and the run again (once it was moved aside) took the callback for delivered. A
# mark of the wrong type is WRONGTYPE too (SET NX took any key for a mark: the callback lost).
BATCH_DELIVER = Script(PUSH_END + """
local mark = redis.call("TYPE", KEYS[1])["ok"]
if mark == "string" then
  return 0
elseif mark ~= "none" then
  return redis.error_reply("WRONGTYPE the delivery mark holds a " .. mark)
end
redis.call(push_end(ARGV[1]), KEYS[2], ARGV[1])  -- (a grouped or prioritized callback: to its lane's next fetch)
redis.call("SET", KEYS[1], "1", "EX", ARGV[2])
if KEYS[3] then
  redis.pcall("SADD", KEYS[3], ARGV[3])
end
return 1
""")

# KEYS[1] = batch_closing (the home slot). ARGV[1] = bid, ARGV[2] = its score as read.
# Forgets a closing once its callbacks are delivered, unless another block began closing the
# batch since (a new score): that one's callbacks may still have to be delivered.
BATCH_CLOSED = Script("""
local score = redis.call("ZSCORE", KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then
  return redis.call("ZREM", KEYS[1], ARGV[1])
end
return 0
""")
