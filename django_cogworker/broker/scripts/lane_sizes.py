"""LANE_SIZES: what a queue's lanes hold, counted inside Redis (api/lanes.py runs it for the admin,
the CLI, the dashboard and the metrics).

Read from Python, a queue of 100,000 groups cost one LLEN per group: 100,007 commands and 3.8 s for
the admin's page of 25, 400,058 commands and 13.4 s for a scrape (past Prometheus's 10 s timeout).
Here the lengths are summed, and the busiest groups picked, where the lists are.

A call walks at most BUDGET members (ring first, then the paused set), then returns a cursor for
the next call: Redis serves nothing else while a script runs, and a walk of all 100,000 groups in
one call held it for 250 ms to over a second (3 to 12 µs a group, the more when it also picks the
busiest; docs/fairness.md has the figures). At BUDGET a call, a queue of 100,000 groups is read in
51 calls of about 6 to 25 ms each. The price of paging: the ring turns (a fetch takes a turn)
and groups join and leave between two calls, so with more than BUDGET groups a group moved across
the cursor meanwhile may be counted twice or missed (as many as turns were taken between the calls:
a few per million groups a call); the groups' and paused groups' counts are read whole, in the first
call. Up to BUDGET groups, one call: exact.

Group lists are named in Lua from the prefix given (``LaneKeys.group_prefix``), as the fetch scripts
name them (broker/scripts/lanes.py's docstring): they share the queue key's slot.
"""

from __future__ import annotations

from ._base import Script

BUDGET = 2_000  # ring or paused members one call visits (an LLEN each): a call holds Redis ~6-25 ms
POISONED_MAX = 100  # groups of the wrong type named per call (each also flagged among the busiest)

# KEYS[1] = the queue's ring (list), KEYS[2] = its paused groups (set), KEYS[3] = its priorities (zset).
# ARGV[1] = the prefix of its groups' lists, ARGV[2] = how many of the busiest groups to return (0:
# none), ARGV[3] = the cursor ("" for the first call; then what the last call returned), ARGV[4] = the
# most members to visit (BUDGET).
# Returns {cursor ("" when done), groups, paused groups, prioritized jobs (these three in the first
# call only, else 0), grouped jobs among the members visited, {ring, paused, prio: what each holds
# instead of its type, "" if nothing wrong}, {group id, what it holds, ...} (its list of the wrong
# type, at most POISONED_MAX), {group id, waiting, paused (0/1), what it holds ("" if fine), ...} (the
# ARGV[2] busiest of those visited, in no order)}.
# A key of the wrong type is counted as empty and said (never an error: the key guard moves it). A
# ring member also in the paused set is counted in the paused walk only.
LANE_SIZES = Script(f"""
local prefix, top, cursor, budget = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local function wrong(kind, want)
  if kind == want or kind == "none" then return "" end
  return "holds another type"
end
local ringType = redis.call("TYPE", KEYS[1]).ok
local pausedType = redis.call("TYPE", KEYS[2]).ok
local prioType = redis.call("TYPE", KEYS[3]).ok
local errors = {{wrong(ringType, "list"), wrong(pausedType, "set"), wrong(prioType, "zset")}}
local groups, paused, prioritized = 0, 0, 0
if cursor == "" then
  if ringType == "list" then
    groups = redis.call("LLEN", KEYS[1])
    if redis.call("LPOS", KEYS[1], "") then groups = groups - 1 end
  end
  if pausedType == "set" then
    paused = redis.call("SCARD", KEYS[2])
    groups = groups + paused
  end
  if prioType == "zset" then prioritized = redis.call("ZCARD", KEYS[3]) end
  cursor = "r0"
end
-- Ties go to the smaller id, byte by byte, as the listings sort them in Python. Lua's `<` on strings
-- is strcoll, the server's locale: byte order under C or C.UTF-8 (checked here on ids that a
-- language's collation orders otherwise: case, punctuation), else a loop a byte at a time.
local bytewise = "-" < "." and "." < "0" and "9" < ":" and "=" < "@" and "@" < "A" and "Z" < "_"
  and "_" < "a" and "B" < "a" and "a-c" < "ab" and "a" < "a-" and "aB" < "ab"
local function greater(x, y)  -- x after y, byte by byte
  if bytewise then return x > y end
  for i = 1, math.min(#x, #y) do
    local p, q = string.byte(x, i), string.byte(y, i)
    if p ~= q then return p > q end
  end
  return #x > #y
end
local function after(a, b)  -- a ranks after b: fewer jobs, or as many and a greater id
  if a[2] ~= b[2] then return a[2] < b[2] end
  return greater(a[1], b[1])
end
local heap = {{}}  -- the busiest so far; heap[1] the one that ranks last
local function offer(g, n, isPaused, err)
  local size = #heap
  if size < top then
    size = size + 1
    heap[size] = {{g, n, isPaused, err}}
    local i = size
    while i > 1 do
      local p = math.floor(i / 2)
      if not after(heap[i], heap[p]) then break end
      heap[i], heap[p] = heap[p], heap[i]
      i = p
    end
    return
  end
  local last = heap[1]  -- (most groups rank after it: one comparison, nothing made)
  if size == 0 or n < last[2] or (n == last[2] and not greater(last[1], g)) then return end
  heap[1] = {{g, n, isPaused, err}}
  local i = 1
  while true do
    local l, r, w = 2 * i, 2 * i + 1, i
    if l <= size and after(heap[l], heap[w]) then w = l end
    if r <= size and after(heap[r], heap[w]) then w = r end
    if w == i then break end
    heap[i], heap[w] = heap[w], heap[i]
    i = w
  end
end
local grouped, poisoned = 0, {{}}
local function visit(g, isPaused)
  local n = redis.pcall("LLEN", prefix .. g)
  local err = ""
  if type(n) == "table" then
    err = string.find(n.err or "", "WRONGTYPE", 1, true) and "holds another type" or string.sub(n.err or "", 1, 80)
    n = 0
    if #poisoned < 2 * {POISONED_MAX} then
      poisoned[#poisoned + 1] = g
      poisoned[#poisoned + 1] = err
    end
  end
  grouped = grouped + n
  if top > 0 then offer(g, n, isPaused, err) end
end
while budget > 0 and cursor ~= "" do
  if string.sub(cursor, 1, 1) == "r" then
    local start = tonumber(string.sub(cursor, 2))
    local members = {{}}
    if ringType == "list" then members = redis.call("LRANGE", KEYS[1], start, start + budget - 1) end
    for _, g in ipairs(members) do
      if g ~= "" and not (pausedType == "set" and redis.call("SISMEMBER", KEYS[2], g) == 1) then visit(g, 0) end
    end
    if #members < budget then cursor = "p0" else cursor = "r" .. (start + #members) end
    budget = budget - #members
  elseif pausedType ~= "set" then
    cursor = ""
  else
    local reply = redis.call("SSCAN", KEYS[2], string.sub(cursor, 2), "COUNT", budget)
    for _, g in ipairs(reply[2]) do visit(g, 1) end
    budget = budget - math.max(#reply[2], 1)
    if reply[1] == "0" then cursor = "" else cursor = "p" .. reply[1] end
  end
end
local busiest = {{}}
for _, e in ipairs(heap) do
  busiest[#busiest + 1] = e[1]
  busiest[#busiest + 1] = e[2]
  busiest[#busiest + 1] = e[3]
  busiest[#busiest + 1] = e[4]
end
return {{cursor, groups, paused, prioritized, grouped, errors, poisoned, busiest}}
""")
