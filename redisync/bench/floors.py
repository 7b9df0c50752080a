"""Two folds the exact one is measured against, on the same encoded report (``redisync bench
--instructions --fleet``): what a report costs a server that does the least a fold must.

- `FLOOR_ADD`: decode each payload, add it element by element into one stored vector of doubles,
  encode the sum back and store it: no slots, no validation, no exactness — the floor of any fold
  that keeps a sum inside Redis.
- `PLAIN_FOLD`: a correct fold that is not exact: the aggregate less the shard's previous slot plus
  its new payload (each float64 as it rounds), the slot replaced; no validation, no life cycle.

Each is a Lua script loaded once (``SCRIPT LOAD``) and called with the payloads a ``publish()`` of
the stated report sends, one per key; its ratio to the fold is printed beside the fold's figures,
so the ratio is measured again whenever the fold changes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# (each vector decoded and encoded in one struct call, as few as Lua allows: unpack takes at most about
# 8 000 values, so a longer one goes in pieces of 7 900)
_HELPERS = """
local function fmt(n) return '<' .. string.rep('d', n) end
local function decode(s)
  local n = #s / 8
  if n <= 7900 then
    local v = {struct.unpack(fmt(n), s)}
    v[n + 1] = nil
    return v
  end
  local out = {}
  for first = 1, n, 7900 do
    local len = math.min(7900, n - first + 1)
    local got = {struct.unpack(fmt(len), s, 8 * (first - 1) + 1)}
    for k = 1, len do out[first + k - 1] = got[k] end
  end
  return out
end
local function encode(v)
  local n = #v
  if n <= 7900 then return struct.pack(fmt(n), unpack(v)) end
  local pieces = {}
  for first = 1, n, 7900 do
    local len = math.min(7900, n - first + 1)
    pieces[#pieces + 1] = struct.pack(fmt(len), unpack(v, first, first + len - 1))
  end
  return table.concat(pieces)
end
"""

FLOOR_ADD = (
    _HELPERS
    + """
-- KEYS[i]: one hash per reported key; ARGV[i]: its payload
for i = 1, #KEYS do
  local p = decode(ARGV[i])
  local stored = redis.call('HGET', KEYS[i], 'agg')
  if stored then
    local a = decode(stored)
    for k = 1, #p do p[k] = p[k] + a[k] end
  end
  redis.call('HSET', KEYS[i], 'agg', encode(p))
end
return 1
"""
)

PLAIN_FOLD = (
    _HELPERS
    + """
-- KEYS[i]: one hash per reported key; ARGV[1]: the shard's slot field; ARGV[1 + i]: its payload
local slot = ARGV[1]
for i = 1, #KEYS do
  local p = decode(ARGV[i + 1])
  local got = redis.call('HMGET', KEYS[i], 'agg', slot)
  local a = got[1] and decode(got[1]) or {}
  local old = got[2] and decode(got[2]) or {}
  for k = 1, #p do a[k] = (a[k] or 0.0) - (old[k] or 0.0) + p[k] end
  redis.call('HSET', KEYS[i], 'agg', encode(a), slot, ARGV[i + 1])
end
return 1
"""
)


def payloads(report: dict[str, dict[str, Any]]) -> list[bytes]:
    """The report's payloads as the fold receives them: each key's parts (count, sum, sums of squares)
    as little-endian float64, in order."""
    out = []
    for parts in report.values():
        flat = [np.atleast_1d(np.asarray(parts[p], dtype="<f8")) for p in ("count", "sum", "sumsq") if p in parts]
        out.append(np.concatenate(flat).tobytes())
    return out
