"""The scripts of limiters (django_cogworker/features/limits/): take a place, give it back, keep a lease.

Each limiter key has six keys (:class:`~..keys.LimitKeys`), in one slot, taken as KEYS six per
limiter in the order of the ARGV specs. "now" is Redis's clock (TIME), the one every host shares: a
limit is fleet-wide only if every process measures it with the same clock.

What each kind keeps:

* concurrent: ``holders``, a sorted set of holder tokens scored by their lease's end. A holder
  killed -9 stops renewing its lease (the heartbeat renews it, LIMIT_RENEW), and the next take
  after that end removes it (counted as ``expired``). ``waiting`` and ``parked``: the jobs it
  refused, by jid, with their due time and their payload as rescheduled (LIMIT_PARK): each place
  given back pops the first, for the releasing process to move it to its queue at once (held.py's
  ``wake``): a freed place is taken in milliseconds, not at the end of a backoff. A job is
  unparked by jid when granted or refused again (its payload then differs from the one parked).
* bucket: ``state`` fields ``bn`` (the bucket: floor(now / per), clock-aligned) and ``bc`` (its
  starts so far).
* window: ``starts``, a sorted set of start tokens scored by when: a sliding window.
* leaky: ``state`` field ``tat``, the theoretical arrival time of GCRA: each start moves it on by
  per / size; a start is refused while that would put it more than ``per`` ahead of now.

Counts per key in ``stats``: granted, over (refusals), rescheduled and failed (what the refused
job was sent to: ARGV[2]), expired (lapsed leases), and a ring of the last 60 minutes' over and
rescheduled counts (fields ``o<m % 60>``, ``r<m % 60>`` and ``m<m % 60>``, the minute each slot
counts), read by the admin as its recent figures: no key per minute to build or expire.

A key of the wrong type stops a take before its first write (``check``; met partway, the writes
before it were kept, no rollback, and counted again by the take run again), for the caller to
quarantine it and run it again (broker/quarantine.py). A release run again finds its place gone.

The fetcher's calls take many jobs (LIMIT_TAKE_MANY) and give back many places
(LIMIT_RELEASE_MANY) at once, each limiter key named once (held.py's Packing); LIMIT_TAKE and
LIMIT_RELEASE are the one-job forms (``within``, a job's own take, a cluster's key-by-key takes).
"""

from __future__ import annotations

from ...broker.scripts._base import Script

KEYS_PER_LIMIT = 6

_COMMON = r"""
local t = redis.call("TIME")
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local minute = math.floor(now / 60)

local function count_recent(stats, field)
  local slot = minute % 60
  if redis.call("HGET", stats, "m" .. slot) ~= tostring(minute) then
    redis.call("HSET", stats, "m" .. slot, minute, "o" .. slot, 0, "r" .. slot, 0)
  end
  redis.call("HINCRBY", stats, field .. slot, 1)
end
"""

# A limiter of a take or a release: {k = its six KEYS' offset, its spec from ARGV[a + 1 .. a + 4]}.
_LIMITER = r"""
local function limiter(k, a)
  return {k = k, kind = ARGV[a + 1], size = tonumber(ARGV[a + 2]), per = tonumber(ARGV[a + 3]),
          lease = tonumber(ARGV[a + 4])}
end
"""

# One job's take: a place in every limiter of ``lims``, or in none (LIMIT_TAKE's reply). ``memo``
# (one per call, by key offset) keeps what the call read and will write of each limiter key: its
# holders swept and counted once, a rate state read once, it and ``granted`` written once at the
# end (``flush``): ten takes of one key ran five to eight commands each, mostly re-reading.
_TAKE = _COMMON + _LIMITER + r"""
-- Each key its kind touches (a TYPE costs about a command) of its type or absent, each kind known.
local TYPES = {"zset", "zset", "hash", "hash", "zset", "hash"}
local TOUCHED = {concurrent = {1, 4, 5, 6}, window = {2, 4}, bucket = {3, 4}, leaky = {3, 4}}
local function check(lims)
  for _, l in ipairs(lims) do
    local touched = TOUCHED[l.kind]
    if not touched then return redis.error_reply("unknown limiter kind " .. tostring(l.kind)) end
    for _, j in ipairs(touched) do
      local got = redis.call("TYPE", KEYS[l.k + j]).ok
      if got ~= "none" and got ~= TYPES[j] then
        return redis.error_reply("WRONGTYPE " .. KEYS[l.k + j] .. " holds a " .. got .. ", not a " .. TYPES[j])
      end
    end
  end
end

local function memo_of(memo, l)
  local m = memo[l.k]
  if m then return m end
  local k = l.k
  m = {l = l, granted = 0, expired = 0}
  if l.kind == "concurrent" then
    m.expired = redis.call("ZREMRANGEBYSCORE", KEYS[k + 1], "-inf", now)
    if m.expired > 0 then redis.call("HINCRBY", KEYS[k + 4], "expired", m.expired) end
    m.count = redis.call("ZCARD", KEYS[k + 1])
    -- (None parked: no jid to unpark, for any take of the call. Read with commands of their types,
    -- so that a key of the wrong type stops the take, as its ZREM and HDEL did.)
    m.waiting = redis.call("ZCARD", KEYS[k + 5]) + redis.call("HLEN", KEYS[k + 6]) > 0
  elseif l.kind == "bucket" then
    local bn = math.floor(now / l.per)
    local s = redis.call("HMGET", KEYS[k + 3], "bn", "bc")
    m.bn, m.used = bn, (tonumber(s[1]) == bn) and tonumber(s[2]) or 0
  elseif l.kind == "leaky" then
    m.tat = tonumber(redis.call("HGET", KEYS[k + 3], "tat") or "0")
  end
  memo[k] = m
  return m
end

local function take(lims, token, refusal, parked, memo)
  local n = #lims
  local expired = 0
  if parked ~= "" then  -- (granted, or parked again as it is now: its old entry goes either way)
    for i = 1, n do
      if lims[i].kind == "concurrent" and memo_of(memo, lims[i]).waiting then
        redis.call("ZREM", KEYS[lims[i].k + 5], parked)
        redis.call("HDEL", KEYS[lims[i].k + 6], parked)
      end
    end
  end
  local plans = {}
  for i = 1, n do
    local l = lims[i]
    local kind, size, per, k = l.kind, l.size, l.per, l.k
    local m = memo_of(memo, l)
    local stats = KEYS[k + 4]
    local refused, after = false, ""
    if kind == "concurrent" then
      expired = expired + m.expired
      m.expired = 0  -- (counted once, by the take that swept them)
      refused = m.count >= size and redis.call("ZSCORE", KEYS[k + 1], token) == false
      if refused then after = tonumber(redis.call("HGET", stats, "hold") or "") or "" end
    elseif kind == "bucket" then
      refused = m.used >= size
      after = (m.bn + 1) * per - now
    elseif kind == "window" then
      redis.call("ZREMRANGEBYSCORE", KEYS[k + 2], "-inf", now - per)
      if redis.call("ZCARD", KEYS[k + 2]) >= size then
        refused = true
        local oldest = redis.call("ZRANGE", KEYS[k + 2], 0, 0, "WITHSCORES")
        after = tonumber(oldest[2]) + per - now
      end
    else
      local tat = m.tat
      if tat < now then tat = now end
      local next_tat = tat + per / size
      refused = next_tat - now > per + 1e-9
      after = next_tat - per - now
      plans[i] = next_tat
    end
    if refused then
      redis.call("HINCRBY", stats, "over", 1)
      count_recent(stats, "o")
      if refusal == "reschedule" then
        redis.call("HINCRBY", stats, "rescheduled", 1)
        count_recent(stats, "r")
      elseif refusal == "fail" then
        redis.call("HINCRBY", stats, "failed", 1)
      end
      if after ~= "" then after = string.format("%.6f", math.max(after, 0)) end
      return {0, i, after}
    end
  end
  for i = 1, n do
    local l = lims[i]
    local m = memo[l.k]
    if l.kind == "concurrent" then
      m.count = m.count + redis.call("ZADD", KEYS[l.k + 1], now + l.lease, token)
    elseif l.kind == "bucket" then
      m.used, m.dirty = m.used + 1, true
    elseif l.kind == "window" then
      redis.call("ZADD", KEYS[l.k + 2], now, token .. ":" .. i)
      redis.call("PEXPIRE", KEYS[l.k + 2], math.ceil(l.per * 1000) + 1000)
    else
      m.tat, m.dirty = plans[i], true
    end
    m.granted = m.granted + 1
  end
  return {1, expired}
end

-- Write what the takes of the call kept in ``memo``: each key's grants counted, a bucket's or
-- leaky's state.
local function flush(memo)
  for k, m in pairs(memo) do
    local l = m.l
    if m.dirty and l.kind == "bucket" then
      redis.call("HSET", KEYS[k + 3], "bn", m.bn, "bc", m.used)
      redis.call("PEXPIRE", KEYS[k + 3], math.ceil(l.per * 2000) + 1000)
    elseif m.dirty then
      redis.call("HSET", KEYS[k + 3], "tat", string.format("%.6f", m.tat))
      redis.call("PEXPIRE", KEYS[k + 3], math.ceil(l.per * 1000) + 1000)
    end
    if m.granted > 0 then redis.call("HINCRBY", KEYS[k + 4], "granted", m.granted) end
  end
end
"""

# Take a place in every limiter of the spec list, or in none.
# KEYS: six per limiter (holders, starts, state, stats, waiting, parked), in spec order.
# ARGV[1] = holder token (unique per run: JSON of jid, process, since, run)
# ARGV[2] = what a refusal means for the counts: "reschedule", "fail" or "" (a within() that waits)
# ARGV[3] = the jid of a job refused before, to unpark (granted now, or parked anew); or ""
# ARGV[4..] = four per limiter: kind, size, per (seconds; "" for concurrent), lease (seconds; "")
# Returns {1, expired} when every limiter granted (expired: lapsed leases removed on the way), or
# {0, i, retry_after} when limiter i (from 1) refused: retry_after in seconds as a string. A
# concurrency limit frees when a holder ends, which nobody can tell in advance: its retry_after is
# how long a place has been held lately (``hold`` in stats, kept by LIMIT_RELEASE), "" before any.
LIMIT_TAKE = Script(_TAKE + r"""
local lims, memo = {}, {}
for i = 1, (#ARGV - 3) / 4 do lims[i] = limiter((i - 1) * 6, (i - 1) * 4 + 3) end
local wrong = check(lims) if wrong then return wrong end
local reply = take(lims, ARGV[1], ARGV[2], ARGV[3], memo)
flush(memo)
return reply
""")

# The takes of the jobs one fetch brings, in one call: each job's as LIMIT_TAKE's, one after the
# other. Each limiter key is named once however many jobs take it: the arguments a worker packs
# (redis-py's per-argument cost, about 3 µs each, was most of a take's worker CPU) are four a job,
# not thirteen. A key's memo is by its number: the caller gives a key one spec a call (gate.py).
#
# KEYS: six per limiter key (holders, starts, state, stats, waiting, parked), each key once.
# ARGV[1] = m, how many limiter keys; ARGV[2 .. 1 + 4m] = four per key (as LIMIT_TAKE's);
# then one per job, four lines: its limiters (the numbers, from 1, of their keys separated by
# commas, in the order of the job's ``limits``), refusal, holder token, parked (as LIMIT_TAKE's
# ARGV[2], ARGV[1], ARGV[3]; only the jid may hold a line break: it is last).
# Returns one LIMIT_TAKE reply per job, in order.
LIMIT_TAKE_MANY = Script(_TAKE + r"""
local m, keyed = tonumber(ARGV[1]), {}
for j = 1, m do keyed[j] = limiter((j - 1) * 6, (j - 1) * 4 + 1) end
local wrong = check(keyed) if wrong then return wrong end
local out, memo = {}, {}
for a = 2 + 4 * m, #ARGV do
  local nums, refusal, token, parked = string.match(ARGV[a], "^([^\n]*)\n([^\n]*)\n([^\n]*)\n(.*)$")
  local lims = {}
  for j in string.gmatch(nums, "%d+") do lims[#lims + 1] = keyed[tonumber(j)] end
  out[#out + 1] = take(lims, token, refusal, parked, memo)
end
flush(memo)
return out
""")

# One holder's give-back: its places in ``lims`` (LIMIT_RELEASE's). Adds to ``woken`` the jobs
# popped from ``waiting``; returns how many places were given back.
_GIVE = _LIMITER + r"""
local t = redis.call("TIME")
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function give(lims, token, undo, woken, memo)
  local given = 0
  for i = 1, #lims do
    local l = lims[i]
    local kind, size, per, k = l.kind, l.size, l.per, l.k
    local before = given
    if kind == "concurrent" then
      local gone = redis.call("ZREM", KEYS[k + 1], token)
      given = given + gone
      if gone == 1 and not undo then
        -- How long places are held, lately (a moving average): what a refused job waits, about.
        -- (Read once and written once a call, ``settle``; no ZPOPMIN once ``waiting`` is empty.)
        -- (Its "since", matched: in a token's JSON a quote inside a string is escaped, so only
        -- the field itself matches; cjson.decode was most of a release's time in Redis.)
        local since = tonumber(string.match(token, '"since":%s*(%-?[%d%.eE+]+)')) or now
        local held = math.min(math.max(now - since, 0), 3600)
        local m = memo[k]
        if not m then
          m = {old = tonumber(redis.call("HGET", KEYS[k + 4], "hold") or "")}
          memo[k] = m
        end
        m.old = m.old and m.old * 0.8 + held * 0.2 or held
        if not m.empty then
          local first = redis.call("ZPOPMIN", KEYS[k + 5])
          if first[1] then
            local job = redis.call("HGET", KEYS[k + 6], first[1])
            redis.call("HDEL", KEYS[k + 6], first[1])
            if job then
              table.insert(woken, job)
              table.insert(woken, first[2])
            end
          else
            m.empty = true
          end
        end
      end
    elseif undo and kind == "window" then
      given = given + redis.call("ZREM", KEYS[k + 2], token .. ":" .. i)
    elseif undo and kind == "bucket" then
      local m = redis.call("HMGET", KEYS[k + 3], "bn", "bc")
      if tonumber(m[1]) == math.floor(now / per) and tonumber(m[2] or "0") > 0 then  -- (its bucket still)
        redis.call("HINCRBY", KEYS[k + 3], "bc", -1)
        given = given + 1
      end
    elseif undo and kind == "leaky" then
      local tat = redis.call("HGET", KEYS[k + 3], "tat")
      if tat then
        redis.call("HSET", KEYS[k + 3], "tat", string.format("%.6f", tonumber(tat) - per / size))
        given = given + 1
      end
    end
    if undo and given > before then redis.call("HINCRBY", KEYS[k + 4], "granted", -1) end
  end
  return given
end

local function settle(memo)  -- (a stats hash of the wrong type failed give's HGET first: none here)
  for k, m in pairs(memo) do
    pcall(redis.call, "HSET", KEYS[k + 4], "hold", string.format("%.6f", m.old))
  end
end
"""

# Give back what LIMIT_TAKE took for ``token``: a concurrent place always (how long it was held goes
# into the ``hold`` average), and with ARGV[2] = "undo" a rate limiter's start too (on a cluster a
# job's limiters are taken a slot at a time: a later one refusing undoes the earlier ones' takes).
#
# KEYS: six per limiter (holders, starts, state, stats, waiting, parked), in spec order.
# ARGV[1] = holder token; ARGV[2] = "undo" or "release"; ARGV[3..] = four per limiter (as LIMIT_TAKE)
# Returns {places given back, then for each job popped from ``waiting`` (one per concurrent place
# released, while any wait) its payload and its due time}.
LIMIT_RELEASE = Script(_GIVE + r"""
local lims, woken, memo = {}, {}, {}
for i = 1, (#ARGV - 2) / 4 do lims[i] = limiter((i - 1) * 6, (i - 1) * 4 + 2) end
local given = give(lims, ARGV[1], ARGV[2] == "undo", woken, memo)
settle(memo)
return {given, unpack(woken)}
""")

# The releases held for one round trip, in one call: each holder's as LIMIT_RELEASE's, each key
# named once (as LIMIT_TAKE_MANY's). A key of the wrong type fails only the holders meeting it
# (pcall): stopping the call lost the jobs the others had popped from ``waiting``. The caller runs
# the failed ones again alone.
#
# KEYS: six per limiter key, each key once.
# ARGV[1] = "undo" or "release"; ARGV[2] = m, how many limiter keys; ARGV[3 .. 2 + 4m] = four
# per key (as LIMIT_TAKE's); then one per holder, two lines: its limiters' key numbers (from 1)
# separated by commas, in the order they were taken, and its token.
# Returns {places given back in all, the holders failed (their numbers from 1, separated by
# commas; "" for none), then the jobs woken, as LIMIT_RELEASE's}.
LIMIT_RELEASE_MANY = Script(_GIVE + r"""
local undo, m = ARGV[1] == "undo", tonumber(ARGV[2])
local keyed, woken, given, memo, failed = {}, {}, 0, {}, {}
for j = 1, m do keyed[j] = limiter((j - 1) * 6, (j - 1) * 4 + 2) end
for a = 3 + 4 * m, #ARGV do
  local nums, token = string.match(ARGV[a], "^([^\n]*)\n(.*)$")
  local lims = {}
  for j in string.gmatch(nums, "%d+") do lims[#lims + 1] = keyed[tonumber(j)] end
  local ok, n = pcall(give, lims, token, undo, woken, memo)
  if ok then given = given + n else failed[#failed + 1] = a - 2 - 4 * m end
end
settle(memo)
return {given, table.concat(failed, ","), unpack(woken)}
""")

# Renew the leases of the concurrent places a process holds (its heartbeat, every beat): a lease
# that ended meanwhile is not brought back (XX): its place may be someone else's by now.
#
# KEYS[1] = holders; ARGV[1] = lease (seconds); ARGV[2..] = the holder tokens
# Returns how many leases were renewed.
LIMIT_RENEW = Script(r"""
local t = redis.call("TIME")
local until_ = tonumber(t[1]) + tonumber(t[2]) / 1000000 + tonumber(ARGV[1])
local renewed = 0
for i = 2, #ARGV do
  if redis.call("ZSCORE", KEYS[1], ARGV[i]) then
    redis.call("ZADD", KEYS[1], "XX", until_, ARGV[i])
    renewed = renewed + 1
  end
end
return renewed
""")

# Park a job refused by a concurrency limit, by jid, with its due time and its payload as
# rescheduled (the first popped by the next release). Entries an hour past due are dropped: such a
# job ran, or was deleted, long ago (each is unparked when taken again, but not when cancelled or
# deleted), a hundred at a time.
#
# KEYS[1] = waiting, KEYS[2] = parked
# ARGV[1] = jid, ARGV[2] = the job's payload as filed in the schedule, ARGV[3] = its due time
LIMIT_PARK = Script(r"""
redis.call("ZADD", KEYS[1], ARGV[3], ARGV[1])
redis.call("HSET", KEYS[2], ARGV[1], ARGV[2])
local stale = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", tonumber(ARGV[3]) - 3600, "LIMIT", 0, 100)
if #stale > 0 then
  redis.call("ZREM", KEYS[1], unpack(stale))
  redis.call("HDEL", KEYS[2], unpack(stale))
end
return 1
""")

# Count what became of a job refused by a limit inside its run (an OverLimit raised by
# ``within``: its take counted the refusal, not the job's reschedule or failure).
#
# KEYS[1] = stats; ARGV[1] = "reschedule" or "fail"
LIMIT_COUNT = Script(_COMMON + r"""
if ARGV[1] == "reschedule" then
  redis.call("HINCRBY", KEYS[1], "rescheduled", 1)
  count_recent(KEYS[1], "r")
else
  redis.call("HINCRBY", KEYS[1], "failed", 1)
end
return 1
""")
