-- clock.lua: the run's served clock, by which leases run out (shared by lease.lua and fold.lua).
--
-- A lease that ran out by the server's wall clock may only mean that the server could not serve its
-- renewal: a stall (DEBUG SLEEP, a fold of the largest key, a fork for a snapshot, a paused VM) or a
-- clock step. So leases are kept in a clock of the time the server spent serving the run: each
-- lease renewal and fold advances it by the wall time since the run's previous one, but by at most
-- the run's stall_after_s (the sixth field of the meta field 'limits', µs; 2 s when missing). A live
-- fleet calls every second (each Syncer renews its lease), so the clock keeps pace with the wall
-- clock; across a stall of any length it moves stall_after_s, and a shard that renews once the server
-- answers again loses nothing. A dead shard's lease runs out as the others' renewals go on.
--
-- meta fields: clock_wall_us (the server's time at the run's last call) and clock_stalled_us (the time
-- it did not serve the run: what gaps exceeded stall_after_s by, and clock steps back). The clock is the
-- server's time less clock_stalled_us, so a live fleet's calls write only clock_wall_us.

local STALL_CAPS = {}
local function stall_cap(limits_text)
  local cap = STALL_CAPS[limits_text or '']
  if cap then return cap end
  cap = tonumber(string.match(limits_text or '', '^[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|(%d+)$')) or 2000000
  STALL_CAPS[limits_text or ''] = cap
  return cap
end

-- the clock at a call at the server's time now (µs), from the meta fields' values; and clock_stalled_us's
-- new text when the call found a stall (or a clock step back), nil when it stays as it is
local function served_clock(wall_text, stalled_text, now, limits_text)
  local stalled, last = tonumber(stalled_text) or 0, tonumber(wall_text)
  if not last then return now - stalled, nil end
  local gap, cap = now - last, stall_cap(limits_text)
  if gap > cap then
    stalled = stalled + (gap - cap)
  elseif gap < 0 then
    stalled = stalled + gap
  else
    return now - stalled, nil
  end
  return now - stalled, string.format('%.0f', stalled)
end
