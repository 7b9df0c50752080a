-- shared.lua: what the fold's envelope (fold.lua) and the semantics' modules (semantics/*.lua) share:
-- the state of the fold being made, the rejection that records a refused report, and the helpers
-- that read and write float64 vectors.
--
-- A semantics' module returns its functions in one table, which the library puts in SEMANTICS under
-- the semantics' name (library.py makes that table from the Python registry):
--   reads(own)        the key-meta fields, beyond semantics, declared and version, that its check reads
--                     (the fold reads them in the same HMGET: spec[4], spec[5], ...; may return none)
--   check(item, spec, decl, resumed, fold)   nil, or the rejection: every check of the key before any
--                     write; it sets on the item every field its apply reads (the item tables are the
--                     VM's, reused from fold to fold)
--   apply(item, fold) the key's writes, once every key of the report has passed its check
--   pull(km, kd, shard)   what a pull hands the caller: the fleet value, and the caller's own slot and
--                     its incarnation where the semantics keeps one (nil otherwise)
--   slots             true where the key holds a slot per shard, named in its meta's 'writers' (the
--                     run forgets a departed shard id only once no such key holds it: lease.lua); the
--                     envelope then judges who has left before the check (lifecycle.lua: item.life),
--                     and its HMGET reads the life cycle's fields as spec[4] .. spec[6], the
--                     module's own after them
-- (item: the key's name, payload, meta and data hashes, next version, module; spec: the HMGET of the
-- key's meta hash; decl: its parsed declaration, see fold.lua's declaration)

-- (string constants are made once, when the library is loaded; a string made at run time costs its length)
local CHUNK = 32
local FMT = '<dddddddddddddddddddddddddddddddd'
local sunpack, spack -- struct's unpack and pack, taken at the first call (see struct_library)

-- One fold's own state. fold() sets it at the start of each call and the helpers below read it:
-- they are made once, when the library loads, not at every call (a closure costs ~500 instructions
-- per variable it captures each time it is made), and the server runs one call at a time.
local KEYS, ARGV, run, meta, shard, inc, seq, floor, resume
local nkeys, fleet_version, cur, now_s, now, server, epoch, limits
local served, stalled_s -- the run's served clock at this fold (clock.lua), and clock_stalled_us's new text
local clock_read -- whether this fold read the clock (only a fold of a key with a lease grace needs it)
local own -- the folding shard's field names (see shard_fields)

-- The run's served clock at this fold, read at its first use: a fold of keys without a grace (a key
-- declared without one) neither reads nor advances it (the leases' renewals and the other folds do).
local function run_clock()
  if not clock_read then
    local c = redis.call('HMGET', KEYS[1], 'clock_wall_us', 'clock_stalled_us')
    served, stalled_s = served_clock(c[1], c[2], now, meta[3])
    clock_read = true
  end
  return served
end

-- What a semantics' check and apply are passed of the fold being made (their last argument; a
-- semantics reads no variable of the fold's own state above). One table, made once and refilled by
-- each fold (fold.lua), as the items are:
--   shard, inc, seq   the folding shard's id, incarnation and sequence number (decimal texts)
--   now_s, now        the server's time at this fold in microseconds (a decimal text, a number)
--   own               the folding shard's field names (shard_fields)
--   run               the run's key names (run_keys: run.written, run.lease_ends, run.gave_up, ...)
--   run_meta, shards  the run's meta hash and its shards hash (the fold's KEYS[1] and KEYS[2])
--   clock()           the run's served clock at this fold (clock.lua), read at its first use
local FOLD = {clock = run_clock}

-- A run's new version announced on its versions channel, as a shard channel (SPUBLISH): on a Cluster
-- the message stays on the run's shard, where PUBLISH goes to every node of the cluster. A role that
-- may not SPUBLISH (an ACL of an earlier redisync) announces with PUBLISH; listeners follow both.
local function announce(channel, message)
  local sent = redis.pcall('SPUBLISH', channel, message)
  if type(sent) == 'table' and sent['err'] then redis.pcall('PUBLISH', channel, message) end
end

-- A register's fleet value (broadcast, maximum, minimum: the data hash's 'value'), for a pull.
local function pull_value(km, kd, caller)
  return redis.call('HGET', kd, 'value')
end

-- The refusal of the report being folded, recorded in the run's dead-letter stream.
local function reject(reason, key, detail)
  -- capped in entries and in bytes: an entry keeps at most dead_letter_max_bytes / dead_letter_maxlen
  -- bytes of the refused report's payloads
  local maxlen = limits.dead_letter_maxlen
  local entry = {'XADD', run.dead, 'MAXLEN', '~', maxlen, '*',
    'reason', reason, 'key', key, 'detail', detail, 'shard', shard, 'incarnation', inc, 'seq', seq}
  local budget = math.min(limits.max_report_bytes, math.floor(limits.dead_letter_max_bytes / maxlen))
  for i = 7, #ARGV, 2 do
    local name, payload = ARGV[i], ARGV[i + 1] or ''
    if #payload > budget then payload = string.sub(payload, 1, budget); name = name .. ' (truncated)' end
    budget = budget - #payload
    entry[#entry + 1] = 'report:' .. name
    entry[#entry + 1] = payload
  end
  local kind = redis.call('TYPE', run.dead)['ok']
  if kind ~= 'none' and kind ~= 'stream' then
    return {'rejected', reason, key, detail .. ' (not recorded: the dead-letter key is a ' .. kind .. ')'}
  end
  redis.call(unpack(entry))
  return {'rejected', reason, key, detail}
end

-- vector helpers: vectors are decoded CHUNK values at a time ----------------------------------------
local function fmt_of(len)
  return len == CHUNK and FMT or '<' .. string.rep('d', len)
end

local function g17(v) return string.format('%.17g', v) end

-- One string of many pieces. Redis' Lua hashes every byte of every string it makes, so a string
-- costs its length each time one is made: table.concat makes each byte several times over (its
-- buffer merges pieces in steps), one `..` of many operands makes it once.
-- BEGIN GENERATED join64
-- (written by scripts/generate_fold_pass.py --write: edit the generator, not these lines)
local function join64(t, i)
  return
    (t[i] or '') .. (t[i + 1] or '') .. (t[i + 2] or '') .. (t[i + 3] or '') .. (t[i + 4] or '') ..
    (t[i + 5] or '') .. (t[i + 6] or '') .. (t[i + 7] or '') .. (t[i + 8] or '') .. (t[i + 9] or '') ..
    (t[i + 10] or '') .. (t[i + 11] or '') .. (t[i + 12] or '') .. (t[i + 13] or '') .. (t[i + 14] or '') ..
    (t[i + 15] or '') .. (t[i + 16] or '') .. (t[i + 17] or '') .. (t[i + 18] or '') .. (t[i + 19] or '') ..
    (t[i + 20] or '') .. (t[i + 21] or '') .. (t[i + 22] or '') .. (t[i + 23] or '') .. (t[i + 24] or '') ..
    (t[i + 25] or '') .. (t[i + 26] or '') .. (t[i + 27] or '') .. (t[i + 28] or '') .. (t[i + 29] or '') ..
    (t[i + 30] or '') .. (t[i + 31] or '') .. (t[i + 32] or '') .. (t[i + 33] or '') .. (t[i + 34] or '') ..
    (t[i + 35] or '') .. (t[i + 36] or '') .. (t[i + 37] or '') .. (t[i + 38] or '') .. (t[i + 39] or '') ..
    (t[i + 40] or '') .. (t[i + 41] or '') .. (t[i + 42] or '') .. (t[i + 43] or '') .. (t[i + 44] or '') ..
    (t[i + 45] or '') .. (t[i + 46] or '') .. (t[i + 47] or '') .. (t[i + 48] or '') .. (t[i + 49] or '') ..
    (t[i + 50] or '') .. (t[i + 51] or '') .. (t[i + 52] or '') .. (t[i + 53] or '') .. (t[i + 54] or '') ..
    (t[i + 55] or '') .. (t[i + 56] or '') .. (t[i + 57] or '') .. (t[i + 58] or '') .. (t[i + 59] or '') ..
    (t[i + 60] or '') .. (t[i + 61] or '') .. (t[i + 62] or '') .. (t[i + 63] or '')
end
-- END GENERATED join64
local function join(t)
  local n = #t
  if n <= 1 then return t[1] or '' end
  if n == 2 then return t[1] .. t[2] end
  if n == 3 then return t[1] .. t[2] .. t[3] end
  local out = {}
  for i = 1, #t, 64 do out[#out + 1] = join64(t, i) end
  return join(out)
end

local NONE = {} -- an empty table read where nothing was read into one (never written)

-- HMGET of any number of fields (unpack fails past ~8000 values): fields[1 .. n], n = #fields unless
-- given; nil if the key is not a hash
local function hmget(key, fields, n)
  n = n or #fields
  if n <= 4096 then
    local got = redis.pcall('HMGET', key, unpack(fields, 1, n))
    return not got['err'] and got or nil
  end
  local out = {}
  for first = 1, n, 4096 do
    local got = redis.pcall('HMGET', key, unpack(fields, first, math.min(first + 4095, n)))
    if got['err'] then return nil end
    for k = 1, #got do out[first + k - 1] = got[k] end
  end
  return out
end

local function not_hash(key) return key .. ' is a ' .. redis.call('TYPE', key)['ok'] .. ', not a hash' end

-- Checks a new payload: finite everywhere, non-negative outside the signed part (signed_from, signed_to].
local function check_payload(name, payload, width, signed_from, signed_to)
  local pos, base = 1, 0
  while base < width do
    local len = math.min(CHUNK, width - base)
    local c = {sunpack(fmt_of(len), payload, pos)}
    for k = 1, len do
      local v, g = c[k], base + k
      if v - v ~= 0 then return {'non_finite', name, 'element ' .. (g - 1) .. ' is not finite'} end
      if v < 0 and (g <= signed_from or g > signed_to) then
        return {'negative', name, 'element ' .. (g - 1) .. ' is ' .. g17(v) .. ' in a count or sumsq part (must be >= 0)'}
      end
    end
    base = base + len
    pos = pos + len * 8
  end
  return nil
end
