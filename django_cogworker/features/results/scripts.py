"""The scripts of a job's result record (``result:<jid>``, a hash; see :mod:`.records`).

The lists in the record (``worker_ids``, ``errors``) are JSON arrays kept as text, appended to
here by string splicing of items the caller encoded: no cjson round trip of the record, which
would turn an empty ``args`` list into ``{}`` and reformat every float.
"""

from __future__ import annotations

from ...broker.scripts._base import Script

# Lua: append the JSON item ARGV[n] to the JSON array text in hash field `field` of KEYS[1].
_APPEND = """
local function append(field, item)
  local list = redis.call("HGET", KEYS[1], field)
  if not list or list == "" or list == "[]" then
    list = "[" .. item .. "]"
  else
    list = string.sub(list, 1, -2) .. "," .. item .. "]"
  end
  redis.call("HSET", KEYS[1], field, list)
end
"""

# KEYS[1] = result:<jid>.
# ARGV[1] = now (epoch seconds), ARGV[2] = this worker's id as a JSON string, ARGV[3] = TTL
# (seconds), ARGV[4..] = field, value pairs of the record as pushed (written only when there is
# no record: a class job's is made here, a task's READY record is kept as the client wrote it).
# Marks the record RUNNING for a new attempt: last_attempted_at (started_at on the first),
# the worker id appended, the TTL renewed. Returns the record (HGETALL).
RESULT_STARTED = Script(_APPEND + """
if #ARGV >= 5 and redis.call("EXISTS", KEYS[1]) == 0 then
  redis.call("HSET", KEYS[1], unpack(ARGV, 4))
end
redis.call("HSET", KEYS[1], "status", "RUNNING", "last_attempted_at", ARGV[1])
redis.call("HSETNX", KEYS[1], "started_at", ARGV[1])
append("worker_ids", ARGV[2])
redis.call("EXPIRE", KEYS[1], ARGV[3])
return redis.call("HGETALL", KEYS[1])
""")

# KEYS[1] = result:<jid>.
# ARGV[1] = status (SUCCESSFUL, FAILED, or READY for a failure that will be retried),
# ARGV[2] = finished_at ("" to leave it), ARGV[3] = TTL (seconds), ARGV[4] = the return value
# as JSON ("" for none), ARGV[5] = an error as a JSON object ("" for none).
# Records how an attempt ended. A record gone (expired, deleted) is not made again from
# half its fields: returns 0, else 1.
RESULT_FINISHED = Script(_APPEND + """
if redis.call("EXISTS", KEYS[1]) == 0 then
  return 0
end
redis.call("HSET", KEYS[1], "status", ARGV[1])
if ARGV[2] ~= "" then
  redis.call("HSET", KEYS[1], "finished_at", ARGV[2])
end
if ARGV[4] ~= "" then
  redis.call("HSET", KEYS[1], "return_value", ARGV[4])
end
if ARGV[5] ~= "" then
  append("errors", ARGV[5])
end
redis.call("EXPIRE", KEYS[1], ARGV[3])
return 1
""")
