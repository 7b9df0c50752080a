-- claim.lua: a new incarnation for a shard id, issued by the server (never by a host's clock).
--
-- KEYS[1]   the run's meta hash
-- KEYS[2]   the run's shards hash
-- ARGV[1]   the shard id (a decimal integer)
-- ARGV[2]   '1' to take the shard over from a live holder, '0' to refuse while its lease is fresh
-- returns {'claimed', incarnation} | {'no_run'} | {'in_use', incarnation, remaining lease ms}
--
-- The incarnation is the server's time in microseconds, or one above the shard's current (and
-- last claimed) incarnation if that is larger: every claim outranks every earlier one, whatever
-- the collectors' clocks say. It becomes the shard's current incarnation at once, so a process
-- still running under an earlier claim is refused as a zombie at its next publish.
-- (the library's function redisync_claim_<version>, see library.py: KEYS and ARGV are the FCALL's keys and arguments)

local function claim(KEYS, ARGV)
  if not redis.call('HGET', KEYS[1], 'epoch') then return {'no_run'} end
  local shard = ARGV[1]

  local function newer(a, b) -- decimal strings without leading zeros: is a > b?
    if #a ~= #b then return #a > #b end
    return a > b
  end

  local function plus_one(s) -- a decimal string + 1, exact beyond 2^53
    local digits, i = {}, #s
    for k = 1, #s do digits[k] = string.byte(s, k) - 48 end
    while i >= 1 do
      if digits[i] < 9 then digits[i] = digits[i] + 1; break end
      digits[i] = 0
      i = i - 1
    end
    local out = table.concat(digits)
    return i == 0 and '1' .. out or out
  end

  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local new = string.format('%.0f', now)
  -- a live holder renews its lease (lease.lua); a dead one's runs out within the lease
  local held = redis.call('HMGET', KEYS[2], shard .. ':incarnation', shard .. ':lease_until_us')
  if ARGV[2] ~= '1' and tonumber(held[2] or '0') > now then
    return {'in_use', held[1] or '', string.format('%.0f', (tonumber(held[2]) - now) / 1000)}
  end
  for _, field in ipairs({shard .. ':incarnation', shard .. ':claimed'}) do
    local cur = redis.call('HGET', KEYS[2], field)
    if cur and string.match(cur, '^[1-9]%d*$') and not newer(new, cur) then new = plus_one(cur) end
  end
  redis.call('HSET', KEYS[2], shard .. ':incarnation', new, shard .. ':seq', 0, shard .. ':claimed', new)
  return {'claimed', new}
end

export('claim', claim)
