-- maximum.lua: a grow-only register, the element-wise maximum of the stored value and every payload
-- (a value that is not greater keeps the stored one, bit for bit); the key's version moves only when
-- the value grows. Data hash: 'value'. Its check and apply are extremum.lua's with grows = true.
-- (the Python twin: redisync/store/semantics/maximum.py; shared.lua says what each function does)

local function check(item, spec, decl)
  return check_extreme(item, decl, true)
end

return {check = check, apply = apply_extreme, pull = pull_value}
