-- broadcast.lua: last writer wins; a key with an owner takes only its owner's reports.
-- Data hash: 'value' (the last report's payload). Key meta: 'writer', 'writer_incarnation'.
-- (the Python twin: redisync/store/semantics/broadcast.py; shared.lua says what each function does)

local function check(item, spec, decl, resumed, fold)
  local name, payload, kd, width = item.name, item.payload, item.data, decl.width
  local owner = decl.owner
  if owner ~= '' and owner ~= fold.shard then
    return reject('not_owner', name, 'shard ' .. fold.shard .. ' may not write a key owned by shard ' .. tostring(owner))
  end
  local kt = redis.call('TYPE', kd)['ok']
  if kt ~= 'none' and kt ~= 'hash' then return reject('corrupt_state', name, not_hash(kd)) end
  local why = check_payload(name, payload, width, 0, width)
  if why then return reject(why[1], why[2], why[3]) end
end

local function apply(item, fold)
  redis.call('HSET', item.data, 'value', item.payload)
  redis.call('HSET', item.meta, 'version', string.format('%d', item.version), 'updated_at_us', fold.now_s,
    'writer', fold.shard, 'writer_incarnation', fold.inc)
end

return {check = check, apply = apply, pull = pull_value}
