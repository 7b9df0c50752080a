-- minimum.lua: a shrink-only register, the element-wise minimum of the stored value and every payload
-- (a value that is not smaller keeps the stored one, bit for bit); the key's version moves only when
-- the value shrinks. Data hash: 'value'. Its check and apply are extremum.lua's with grows = false.
-- (the Python twin: redisync/store/semantics/minimum.py; shared.lua says what each function does)

local function check(item, spec, decl)
  return check_extreme(item, decl, false)
end

return {check = check, apply = apply_extreme, pull = pull_value}
