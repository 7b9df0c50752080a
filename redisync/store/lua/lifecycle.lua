-- lifecycle.lua: who has left a key that keeps a slot per shard, judged by the envelope (fold.lua)
-- before the key's semantics folds the report, and the indexes that judgement keeps. The semantics
-- receives the ids gone and why (item.life), as the Python reference fold receives its shards'
-- leases (Fold.alive, Fold.ended, Fold.served_us): it reads no run-wide key itself.
--
-- A state key's slot leaves once it was not refreshed for stale_after_s, or once its shard's lease has
-- lapsed for longer than lease_grace_s (in the run's served clock, clock.lua: a stall of the server
-- runs out nobody's lease) or was given up (a clean stop). A history key's slot is retired (its
-- samples stay counted: the semantics moves it into its history) once its shard has been gone for
-- retire_after_s, a give-up found by its end in lease_ends (lease.lua scores it so, and keeps
-- <id>:ended_us). A fold of the shard after its lease ran out moved the lease's end to that fold (it
-- lived on), so whichever fold comes first, the slot's fate is the same. A shard that never leased is
-- not judged.
--
-- The key-meta fields it reads (the envelope's HMGET, spec[4] .. spec[6] for a key with slots):
-- 'writers' (shard ids, ascending, comma-separated, each without a leading zero), 'stale_seen' (when
-- the written index was last looked at) and 'lapse_seen' ('<served clock>,<gave_up_seq>' of the last
-- look at the lease indexes). It keeps the key's written index (written:<key>, each writer's last
-- write time) and seeds or moves entries of the run's lease_ends; each look only at what moved since
-- the last, so a fold costs what changed, not the fleet.

-- A key's writers, parsed once per Lua VM and remembered by their own text: the ids as numbers, the
-- decimal name of each in NAMES. nil and the first id that is not one (a text changes only when the
-- writers do: a pattern match, a number made and a table grown per writer otherwise).
local WRITERS, nwriters, NAMES, WRITER_SETS = {}, 0, {}, {}
local function writers_of(text)
  local ids = WRITERS[text]
  if ids then return ids end
  ids = {}
  local set = {}
  local last = -1
  for w in string.gmatch(text, '[^,]+') do
    local id = not string.find(w, '^0%d') and not string.find(w, '%D') and tonumber(w)
    if not id or id <= last or #w > 9 then return nil, w end
    last = id
    ids[#ids + 1] = id
    set[id] = true
    NAMES[id] = w
  end
  if nwriters >= 256 then -- (a bound on what the VM keeps; NAMES then holds only the ids of texts kept)
    WRITERS, WRITER_SETS, nwriters = {}, {}, 0
    for id in pairs(NAMES) do NAMES[id] = nil end
    for k = 1, #ids do NAMES[ids[k]] = string.format('%d', ids[k]) end
  end
  WRITERS[text], WRITER_SETS[text], nwriters = ids, set, nwriters + 1
  return ids
end

-- The writers live after this fold, ascending, the folding shard among them (made once per fold, when
-- asked: the usual fold of a writer that stays, with nobody gone, needs none).
local function live(life)
  if life.live then return life.live end
  local out, n, me, gone, added = {}, 0, life.me, life.gone, false
  for _, id in ipairs(life.prior) do
    if not added and id > me then n = n + 1; out[n] = me; added = true end
    if id ~= me and not gone[id] then n = n + 1; out[n] = id end
  end
  if not added then out[n + 1] = me end
  life.live = out
  return out
end

-- (state keys) the writers whose last write fell out of stale_after_s: by the written index since
-- the last look, or (no look yet: a new key, a restore, an earlier redisync) every writer, the index
-- seeded from their stored write times
local function judge_stale(life, km, name, stale, seen_text, fold)
  local limit, now_us, me, set, idname, gone = stale * 1e6, fold.now, life.me, life.set, NAMES, life.gone
  local function judge(id, at) -- the rule, on the writer's stored write time
    if not gone[id] and now_us - (tonumber(at) or 0) > limit then gone[id] = 'stale' end
  end
  local seen = tonumber(seen_text)
  if seen then
    local cands = redis.call('ZRANGEBYSCORE', fold.run.written .. name, string.format('%.0f', seen - limit - 1),
      string.format('%.0f', now_us - limit + 1))
    local ask_ids, fields = {}, {}
    for _, text in ipairs(cands) do
      local id = tonumber(text)
      if id and id ~= me and set[id] then
        ask_ids[#ask_ids + 1] = id
        fields[#fields + 1] = 'slot:' .. idname[id] .. ':at_us'
      end
    end
    local at = #fields > 0 and hmget(km, fields) or NONE
    for j = 1, #ask_ids do
      judge(ask_ids[j], at[j])
      if not gone[ask_ids[j]] and at[j] then -- (an index entry behind its writer's last write: moved)
        life.rescore_written = life.rescore_written or {}
        life.rescore_written[#life.rescore_written + 1] = at[j]
        life.rescore_written[#life.rescore_written + 1] = idname[ask_ids[j]]
      end
    end
  else
    local fields, others, prior = {}, {}, life.prior
    for k = 1, #prior do
      if prior[k] ~= me then others[#others + 1] = prior[k]; fields[#fields + 1] = 'slot:' .. idname[prior[k]] .. ':at_us' end
    end
    local at = #fields > 0 and hmget(km, fields) or NONE
    life.seed_written = {}
    for j = 1, #others do
      judge(others[j], at[j])
      if at[j] then
        life.seed_written[#life.seed_written + 1] = at[j]
        life.seed_written[#life.seed_written + 1] = idname[others[j]]
      end
    end
  end
  life.stale_seen = string.format('%.0f', now_us)
end

-- the writers whose lease ended (or was given up) more than the grace ago: by the run's lease
-- indexes since the last look, or (no look yet) every writer, the lease index seeded
local function judge_lapsed(life, grace, seen_text, fold)
  local clock, span, me, set, idname, gone, history = fold.clock(), grace * 1e6, life.me, life.set, NAMES, life.gone,
    life.history
  local gave_up_seq = redis.call('HGET', fold.run_meta, 'gave_up_seq') or '0'
  local seen_served, seen_seq = string.match(seen_text or '', '^(%-?%d+),(%d+)$')
  local function judge(id, text, ended) -- the rule, on the shard's lease as it stands
    local u = tonumber(text)
    if u and u < 0 and history then u = tonumber(ended) end -- (given up: when, for a history key)
    if u and ((u < 0 and not history) or clock - u > span) then
      if not gone[id] then gone[id] = 'lapsed' end
      return true
    end
  end
  local others, from_index = {}, {}
  if seen_served then -- the shards whose lease ended, or that gave it up, since the last look
    local ended = redis.call('ZRANGEBYSCORE', fold.run.lease_ends,
      string.format('%.0f', tonumber(seen_served) - span - 1), string.format('%.0f', clock - span + 1))
    local stopped = not history and tonumber(gave_up_seq) > tonumber(seen_seq) and
      redis.call('ZRANGEBYSCORE', fold.run.gave_up, '(' .. seen_seq, gave_up_seq) or NONE
    for _, list in ipairs({ended, stopped}) do
      for _, text in ipairs(list) do
        local id = tonumber(text)
        if id and id ~= me and set[id] and not from_index[id] then
          others[#others + 1] = id
          from_index[id] = list == ended
        end
      end
    end
  else
    local prior = life.prior
    for k = 1, #prior do if prior[k] ~= me then others[#others + 1] = prior[k] end end
    life.seed_leases = {}
  end
  if #others > 0 then
    local fields, n = {}, #others
    for j = 1, n do fields[j], fields[n + j] = idname[others[j]] .. ':alive_until_us', history and idname[others[j]] .. ':ended_us' or nil end
    local leased = hmget(fold.shards, fields) or {}
    for j = 1, n do
      local lapsed = judge(others[j], leased[j], history and leased[n + j])
      local u = tonumber(leased[j])
      if not lapsed and u and u >= 0 and (life.seed_leases or from_index[others[j]]) then
        -- (seeded, or an index entry behind its lease's end, as an earlier redisync's renewal leaves it: moved)
        local list = life.seed_leases or life.rescore_leases or {}
        if not life.seed_leases then life.rescore_leases = list end
        list[#list + 1] = leased[j]
        list[#list + 1] = idname[others[j]]
      end
    end
  end
  life.lapse_seen = string.format('%.0f', clock) .. ',' .. gave_up_seq
end

-- The judgement of a key with slots, before its semantics' check: item.life, refilled (the item is the
-- VM's): me, idname (every id's decimal name), prior (the writers before this fold, ascending), was_writer,
-- gone (id -> 'stale' | 'lapsed'), forget (those ids, ascending), lapsed (how many lapsed), history
-- (a history key: its slots gone are retired, not dropped), writers (the writers' text after this fold),
-- and problem: a stored writers text that is not one (the semantics refuses the report with it, after
-- its payload's own problem; nothing else is judged then).
local function judge(item, spec, decl, fold)
  local life = item.life
  if not life then life = {}; item.life = life end
  life.live, life.seed_written, life.rescore_written, life.seed_leases, life.rescore_leases = false, false, false,
    false, false
  life.stale_seen, life.lapse_seen, life.problem, life.lapsed = false, false, false, 0
  local text = spec[4] or ''
  local prior, bad = writers_of(text)
  if not prior then
    life.problem = 'writers holds ' .. string.format('%q', bad) .. ' (shard ids, ascending)'
    return
  end
  local me = fold.shard + 0
  NAMES[me] = fold.shard
  life.me, life.idname, life.prior, life.set = me, NAMES, prior, WRITER_SETS[text]
  life.was_writer, life.was, life.writers = life.set[me] == true, spec[4], spec[4]
  life.history = decl.lifecycle ~= 'state'
  life.gone = {}
  -- a slot not refreshed for stale_after_s leaves a state key; a history key keeps it (its samples
  -- stay counted, as a fresh restart would retire them: the same whichever shard's fold notices it)
  if decl.stale and not life.history then judge_stale(life, item.meta, item.name, decl.stale, spec[5], fold) end
  if decl.grace then judge_lapsed(life, decl.grace, spec[6], fold) end
  local forget = {}
  for id, why in pairs(life.gone) do
    forget[#forget + 1] = id
    if why == 'lapsed' then life.lapsed = life.lapsed + 1 end
  end
  table.sort(forget)
  life.forget = forget
  if not life.was_writer or #forget > 0 then -- (the writers' text made again only when they change)
    local ids, names = live(life), {}
    for k = 1, #ids do names[k] = NAMES[ids[k]] end
    life.writers = table.concat(names, ',')
  end
end

-- The judgement's writes, once every key of the report has passed its check: the slots gone leave the
-- key meta (the semantics' apply lets go of their values) and are counted, the writers written where
-- they changed, this writer's write time and the entries seeded or moved in the indexes.
local function record(item, fold)
  local life, km = item.life, item.meta
  local forget, lapsed = life.forget, life.lapsed
  for _, id in ipairs(forget) do
    local name = string.format('%d', id) -- (not NAMES: a later key's judgement may have let it go)
    redis.call('HDEL', km, 'slot:' .. name .. ':incarnation', 'slot:' .. name .. ':seq', 'slot:' .. name .. ':at_us')
  end
  if life.history and #forget > 0 then redis.call('HINCRBY', km, 'retired_departed', #forget) end
  if not life.history and #forget > lapsed then redis.call('HINCRBY', km, 'dropped_stale', #forget - lapsed) end
  if not life.history and lapsed > 0 then redis.call('HINCRBY', km, 'dropped_lapsed', lapsed) end
  if life.writers ~= life.was then redis.call('HSET', km, 'writers', life.writers) end
  if life.stale_seen then
    local zw = fold.run.written .. item.name
    redis.call('ZADD', zw, fold.now_s, fold.shard)
    if life.seed_written and #life.seed_written > 0 then redis.call('ZADD', zw, unpack(life.seed_written)) end
    if life.rescore_written then redis.call('ZADD', zw, unpack(life.rescore_written)) end
    if #forget > 0 then
      local names = {}
      for j, id in ipairs(forget) do names[j] = string.format('%d', id) end
      redis.call('ZREM', zw, unpack(names))
    end
    redis.call('HSET', km, 'stale_seen', life.stale_seen)
  end
  if life.lapse_seen then
    local seeded = life.seed_leases or life.rescore_leases
    if seeded and #seeded > 0 then redis.call('ZADD', fold.run.lease_ends, unpack(seeded)) end
    redis.call('HSET', km, 'lapse_seen', life.lapse_seen)
  end
end

return {judge = judge, record = record, live = live, reads = {'writers', 'stale_seen', 'lapse_seen'}}
