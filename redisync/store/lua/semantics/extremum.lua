-- extremum.lua: what maximum.lua and minimum.lua share, the element-wise extreme of the stored value
-- and the payload (the Python twin: redisync/store/semantics/extremum.py). Loaded after shared.lua,
-- before the semantics' modules.

-- maximum's and minimum's check and apply: the element-wise extreme of the stored value and the payload
-- (grows: the maximum, else the minimum; a value that does not move it keeps the stored one, bit for
-- bit); the key's version moves only when the value does.
local function check_extreme(item, decl, grows)
  local name, payload, width = item.name, item.payload, decl.width
  item.value, item.unchanged = false, false
  local why = check_payload(name, payload, width, 0, width)
  if why then return reject(why[1], why[2], why[3]) end
  local stored = redis.pcall('HGET', item.data, 'value')
  if type(stored) == 'table' then return reject('corrupt_state', name, not_hash(item.data)) end
  if not stored then item.value = payload return nil end
  if #stored ~= width * 8 then
    return reject('corrupt_state', name, 'stored value is ' .. #stored .. ' bytes, the key needs ' .. (width * 8))
  end
  local out, pos, base = {}, 1, 0
  while base < width do
    local len = math.min(CHUNK, width - base)
    local fmt = fmt_of(len)
    local p, s = {sunpack(fmt, payload, pos)}, {sunpack(fmt, stored, pos)}
    for k = 1, len do
      local v = s[k]
      if v - v ~= 0 then return reject('corrupt_state', name, 'stored element ' .. (base + k - 1) .. ' is not finite') end
      if grows then
        if p[k] > v then s[k] = p[k] end
      elseif p[k] < v then
        s[k] = p[k]
      end
    end
    out[#out + 1] = spack(fmt, unpack(s, 1, len))
    base = base + len
    pos = pos + len * 8
  end
  item.value = join(out)
  if item.value == stored then item.version, item.unchanged = item.version - 1, true end
end

local function apply_extreme(item, fold)
  if not item.unchanged then
    redis.call('HSET', item.data, 'value', item.value)
    redis.call('HSET', item.meta, 'version', string.format('%d', item.version), 'updated_at_us', fold.now_s)
  end
  item.value = false -- (the VM keeps the item: let go of the vector)
end
