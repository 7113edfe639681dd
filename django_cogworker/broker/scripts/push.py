"""The script of a push: every job of one ``perform_*`` call, its unique lock and the pusher's receipt, in one step."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from ._base import Script, _queue_index

# How long a pushing thread's receipt answers a retry of its last push (PUSH). Enough for
# redis-py's retrying of one command (the cluster client's by default, a lone Redis's or
# Sentinel's when REDIS_OPTIONS sets ``retry``): 10 retries at redis-py's defaults, backing off
# up to 1 s, each attempt up to DEFAULT_OPTIONS' connect and read timeouts (5 s + 10 s), so
# about 3 minutes at the most. One key per pushing thread (per slot on a cluster), whatever the
# push rate: the TTL costs no memory.
RECEIPT_TTL = 600
# How long an outbox job's mark (in keys.outbox_marks) says it was handed to Redis: a row pushed
# again within it (by a relay, after the process that pushed it died before deleting it) writes
# nothing. It must outlast the longest a pushed row can stay in the table before another process
# may take it: a relay's claim (outbox/relay.py CLAIM, 60 s on SQLite; a row lock is let go as
# its holder's connection drops) and a commit-time hand-over's delete (one statement). One key
# per outbox job for this long: 600,000 of them (about 60 MB) at 1,000 jobs/s.
# The marks are the members (jids) of one sorted set (per slot on a cluster), each scored with the
# Redis time it runs out at: written with one variadic ZADD per push, trimmed of the run-out ones
# by each push (ZREMRANGEBYSCORE). A key per mark, SET with EX by the script, cost Redis ten
# times what a bulk's LPUSH did (about 9 us a job against 1 on this project's machine).
MARK_TTL = 600

# KEYS[1] = the pusher's receipt (keys.push_receipt); KEYS[2..] = the keys the layout names by
# their index in KEYS: queue lists, the schedule, the queues set, unique locks; all in one slot
# (on a cluster the client makes one call per slot).
# ARGV[1] = the push's token (its jid; a bulk's: a digest of its jids), ARGV[2] = its layout, in
# JSON (push_args): [index of the queues set (0: the caller lists the queues), the channel that
# wakes the pollers ("": none), then per destination: [its index, its queue name ("" for the
# schedule, a sorted set; [name, index of its queue list, a doorbell, "p"] for a queue's
# prioritized jobs, its lane's sorted set, scored as the schedule's are, or [name, index of its
# queue list, a doorbell, "g", group id] for a group's jobs, its list: broker/scripts/lanes.py), index of
# its outbox jobs' marks (0: none), then per job: 0 (a job for
# now), its score (a scheduled job's, as text) or, for a unique job, [index of its lock, its jid,
# the lock's TTL, its score if scheduled], or for an outbox job its jid (one for now without a
# lock: a string, in a queue's group) or [index of its lock or 0, its jid, the lock's TTL, its
# score or "", 1]]]; ARGV[3..] = the payloads, in the layout's order. (One JSON argument, not a few
# per job: redis-py packs each argument at about a microsecond, the cost of a whole LPUSH's
# packing for three of them, and decoding the layout costs Redis less than that. An outbox job
# of a bulk is a bare jid, and its group's marks are read with one ZMSCORE: a five-element
# table a job and a ZSCORE each cost it 2-3 us a job, a bulk's push with OUTBOX on over twice
# its push without.)
# Writes every job of one push, now (LPUSH, 1,000 at a time) or scheduled (ZADD), with its unique
# lock, in one step. The lock and the job were two round trips, a claim then a push: a push
# refused in between (a failover under min-replicas-to-write, a connection lost) left the lock
# with no job behind it, and every push of that job refused as its duplicate for unique_for.
# Here the lock is written only after its job (destination first), and a write Redis refuses
# (OOM, NOREPLICAS, READONLY: refused at a script's first write, and then for all of it) is this
# script's error reply, nothing written. A lock held by another jid makes its job a duplicate,
# not written (one without an expiry, a manual SET, is given the lock's TTL: code 2); one held by
# the job's own jid says it was pushed before (a retry), and it is not written again.
# An outbox job carries its mark (its jid in keys.outbox_marks): one there, not run out, says its
# row was handed over before (code 1), not written again; the mark is written with the job
# (scored with Redis's TIME + MARK_TTL).
# The receipt makes a push idempotent: redis-py sends a command again when the connection dropped
# before the reply (the cluster client's retry, on by default; any client's with a `retry`), which
# pushed the jobs twice when the first had been applied. Each pushing thread has a receipt key of
# its own (per slot), holding its last push's token and reply: a push whose token is there is
# answered with that reply, nothing written. One small key per thread, overwritten by its next
# push: no marker per job, no memory growing with the push rate.
# Returns 1 when every job was written (and listed, and announced), else {the listing's error or
# "", the wake-up's error or "", then for each job NOT written: its number (from 1, in ARGV order),
# a code, a detail}: 0 a duplicate (the jid holding the lock), 2 the same for a lock that had no
# expiry, 1 an outbox job pushed before (its jid), -1 its destination refused it (the error:
# WRONGTYPE), -2 its lock key holds the wrong type, -3 its mark does (the error; the caller
# quarantines the key and pushes again).
PUSH = Script(f"""
local stored = redis.pcall("GET", KEYS[1])
if stored == ARGV[1] then
  return 1
elseif type(stored) == "string" then
  local ok, receipt = pcall(cmsgpack.unpack, stored)
  if ok and type(receipt) == "table" and receipt[1] == ARGV[1] then
    return receipt[2]
  end
end
local layout = cjson.decode(ARGV[2])
local listing, wake = layout[1], layout[2]
local out = {{"", ""}}
local function refuse(entry, code, detail)
  out[#out + 1] = entry
  out[#out + 1] = code
  out[#out + 1] = detail
end
local written = false
local holders = {{}}
local due, due_text
local entry = 0
local now
local marks = {{}}
for g = 3, #layout do
  local group = layout[g]
  local dest, queue, gmark = group[1], group[2], group[3]
  local lane = type(queue) == "table"
  local zset = queue == "" or (lane and queue[4] == "p")
  local group_written, fresh = false, false
  local batch = {{}}
  local seen, bad = {{}}, nil
  if gmark > 0 then
    -- The group's marks read with one ZMSCORE per 1,000 jobs (a ZSCORE a job cost more than its LPUSH).
    if not now then
      local t = redis.call("TIME")
      now = tonumber(t[1]) + tonumber(t[2]) / 1000000
    end
    local jids = {{}}
    for k = 4, #group do
      local job = group[k]
      if type(job) == "table" then
        if job[5] ~= 0 then
          jids[#jids + 1] = job[2]
        end
      elseif not zset and type(job) == "string" then
        jids[#jids + 1] = job
      end
    end
    for first = 1, #jids, 1000 do
      local last = math.min(first + 999, #jids)
      local scores = redis.pcall("ZMSCORE", KEYS[gmark], unpack(jids, first, last))
      if scores.err then
        bad = scores.err
        break
      end
      for i = 1, last - first + 1 do
        if scores[i] and tonumber(scores[i]) > now then
          seen[jids[first + i - 1]] = true
        end
      end
    end
  end
  for k = 4, #group do
    entry = entry + 1
    local job, e = group[k], {{entry = entry, payload = ARGV[entry + 2]}}
    local free = true
    if type(job) == "table" then
      e.lock, e.jid, e.ttl, e.score = job[1], job[2], job[3], job[4]
      if job[5] ~= nil and job[5] ~= 0 then
        e.mark = gmark
      end
      if e.lock == 0 then
        e.lock = nil
      end
    elseif not zset and type(job) == "string" then
      e.jid, e.mark = job, gmark
    end
    if e.mark then
      if bad then
        refuse(entry, -3, bad)
        free = false
      elseif seen[e.jid] then
        refuse(entry, 1, e.jid)
        free = false
      end
    end
    if type(job) == "table" then
      if free and e.lock then
        local holder, code = holders[e.lock], 0
        if holder == nil then
          holder = redis.pcall("GET", KEYS[e.lock])
          if type(holder) == "table" then
            refuse(entry, -2, holder.err)
            free, holder = false, nil
          elseif holder and redis.call("TTL", KEYS[e.lock]) == -1 then
            redis.pcall("EXPIRE", KEYS[e.lock], e.ttl)
            code = 2
          end
        end
        if holder then
          free = false
          holders[e.lock] = holder
          if holder ~= e.jid then
            refuse(entry, code, holder)
          end
        elseif free then
          holders[e.lock] = e.jid
        end
      end
    elseif zset then
      e.score = job
    end
    if free then
      batch[#batch + 1] = e
    end
  end
  for first = 1, #batch, 1000 do
    local last = math.min(first + 999, #batch)
    local values = {{}}
    for k = first, last do
      if zset then
        values[#values + 1] = batch[k].score
      end
      values[#values + 1] = batch[k].payload
    end
    local pushed = redis.pcall(zset and "ZADD" or "LPUSH", KEYS[dest], unpack(values))
    if type(pushed) == "table" then
      if not written and string.sub(pushed.err, 1, 9) ~= "WRONGTYPE" then
        return redis.error_reply(pushed.err)
      end
      for k = first, #batch do
        refuse(batch[k].entry, -1, pushed.err)
        if batch[k].lock and holders[batch[k].lock] == batch[k].jid then
          holders[batch[k].lock] = nil
        end
      end
      break
    end
    written, group_written = true, true
    if first == 1 and pushed == last then
      fresh = true  -- (a group's list that was empty: the group joins the ring)
    end
    for k = first, last do
      local e = batch[k]
      if e.lock then
        redis.call("SET", KEYS[e.lock], e.jid, "EX", e.ttl)
      end
      if e.mark then
        local m = marks[e.mark]
        if not m then
          m = {{}}
          marks[e.mark] = m
        end
        m[#m + 1] = now + {MARK_TTL}
        m[#m + 1] = e.jid
      end
      if zset and not lane and (not due or tonumber(e.score) < due) then
        due, due_text = tonumber(e.score), e.score
      end
    end
    if listing > 0 and (lane or not zset) and first == 1 then
      local listed = redis.pcall("SADD", KEYS[listing], lane and queue[1] or queue)
      if type(listed) == "table" then
        out[1] = listed.err
      end
    end
  end
  if lane and group_written and queue[4] == "g" and fresh then
    local qk = KEYS[queue[2]]
    if redis.pcall("SISMEMBER", qk .. " lane:paused", queue[5]) == 0 then
      local ring = qk .. " lane:ring"
      if redis.call("EXISTS", ring) == 0 then
        redis.pcall("RPUSH", ring, "")
      end
      redis.pcall("LPUSH", ring, queue[5])  -- (refused, a ring of the wrong type: lanes' repair re-adds it)
    end
  end
  if lane and group_written and redis.pcall("LLEN", KEYS[queue[2]]) == 0 then
    redis.pcall("LPUSH", KEYS[queue[2]], queue[3])  -- (a doorbell: wakes a fetcher blocked on the list)
  end
end
if not written then
  return out
end
for mark, m in pairs(marks) do
  for first = 1, #m, 2000 do
    redis.pcall("ZADD", KEYS[mark], unpack(m, first, math.min(first + 1999, #m)))
  end
  redis.pcall("ZREMRANGEBYSCORE", KEYS[mark], "-inf", now)
  redis.pcall("EXPIRE", KEYS[mark], {MARK_TTL})
end
if wake ~= "" and due_text then
  local woken = redis.pcall("PUBLISH", wake, due_text)
  if type(woken) == "table" then
    out[2] = woken.err
  end
end
if #out == 2 and out[1] == "" and out[2] == "" then
  redis.call("SET", KEYS[1], ARGV[1], "EX", {RECEIPT_TTL})
  return 1
end
redis.call("SET", KEYS[1], cmsgpack.pack({{ARGV[1], out}}), "EX", {RECEIPT_TTL})
return out
""")


_layout = json.JSONEncoder(separators=(",", ":")).encode


def push_args(receipt: str, token: str, queues: str | None, wake: str,
              groups: Iterable[tuple[str, str, Sequence[tuple[Any, Any, str | None, str, int, str | None]]]
                                 | tuple[str, str, Sequence[tuple[Any, Any, str | None, str, int, str | None]],
                                         tuple[str, ...] | None]],
              ) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of PUSH. ``queues``: the queues set, or None where the caller lists the queues;
    ``wake``: the pollers' channel, or ""; ``groups``: ``(destination key, queue name or "" for the
    schedule, jobs)``, each job ``(payload, score or None, lock key or None, jid, lock TTL, mark key
    or None)`` (the marks: keys.outbox_marks, for an outbox job), and optionally ``(queue list key,
    doorbell, "p")`` when the destination is that queue's prioritized jobs' set (a job then has a
    score), ``(queue list key, doorbell, "g", group id)`` when it is a group's list."""
    keys = [receipt]
    index: dict[str, int] = {}
    layout: list[Any] = [_queue_index(keys, index, queues) if queues else 0, wake]
    payloads: list[Any] = []
    for destination, queue, jobs, *lane in groups:
        named: Any = queue
        if lane and lane[0]:
            named = [queue, _queue_index(keys, index, lane[0][0]), *lane[0][1:]]
        group: list[Any] = [_queue_index(keys, index, destination), named, 0]
        for payload, score, lock, jid, ttl, mark in jobs:
            payloads.append(payload)
            if mark:
                group[2] = _queue_index(keys, index, mark)  # (one marks key per group: its slot's)
                if lock is None and score is None:
                    group.append(jid)
                else:
                    group.append([_queue_index(keys, index, lock) if lock else 0, jid, ttl,
                                  "" if score is None else score, 1])
            elif lock:
                group.append([_queue_index(keys, index, lock), jid, ttl, *([score] if score is not None else [])])
            else:
                group.append(0 if score is None else score)
        layout.append(group)
    return keys, [token, _layout(layout), *payloads]
