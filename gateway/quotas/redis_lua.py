"""Lua scripts of the Redis limiter (run atomically by Redis: one script at a time).

Each subject ``i`` (0-based) owns five keys, passed as ``KEYS[5i+1 .. 5i+5]``:
requests-per-minute tat, tokens-per-minute tat, concurrency lease set (sorted set, score =
lease expiry in microseconds), day budget counter, month budget counter. Times come from
Redis ``TIME`` so replicas with skewed clocks agree; GCRA tats are stored as integer
microseconds. The arithmetic is the one of :mod:`gateway.quotas.memory`
(GCRA).
"""

from __future__ import annotations

KEYS_PER_SUBJECT = 5
LIMITS_PER_SUBJECT = 5

# Denial kinds as returned by ADMIT (index into gateway.quotas.redis_backend._KINDS).
ADMIT = r"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local W = 60000000
local cost = tonumber(ARGV[1])
local lease = ARGV[2]
local lease_us = tonumber(ARGV[3])
local day_ttl = tonumber(ARGV[4])
local month_ttl = tonumber(ARGV[5])
local day_reset_us = tonumber(ARGV[6])
local month_reset_us = tonumber(ARGV[7])
local n = tonumber(ARGV[8])

local function stored(key)
  local v = redis.call('GET', key)
  if v then return tonumber(v) end
  return nil
end

local function remaining(tat, T)
  local r = math.floor((W - (tat - now)) / T + 1e-9)
  if r < 0 then return 0 end
  return r
end

-- returns status (1 ok, 0 wait, 2 never), tat to store, remaining, reset_us, retry_us
local function gcra(key, limit, c)
  local T = W / limit
  local tat = stored(key)
  if tat == nil or tat < now then tat = now end
  if c > limit then return 2, tat, remaining(tat, T), tat - now, -1 end
  local new_tat = tat + c * T
  local allow_at = new_tat - W
  if allow_at > now then return 0, tat, remaining(tat, T), tat - now, allow_at - now end
  return 1, new_tat, remaining(new_tat, T), new_tat - now, 0
end

local denials = {}
local snaps = {}
local plan_r = {}
local plan_t = {}
local function deny(kind, i, limit, rem, reset_us, retry_us, never, requested)
  local d = {kind, i, limit, rem, reset_us, retry_us, never, requested}
  for _, x in ipairs(d) do table.insert(denials, x) end
end

for i = 0, n - 1 do
  local k = i * 5
  local a = 9 + i * 5
  local rpm = tonumber(ARGV[a])
  local tpm = tonumber(ARGV[a + 1])
  local conc = tonumber(ARGV[a + 2])
  local day = tonumber(ARGV[a + 3])
  local month = tonumber(ARGV[a + 4])
  local s = {-1, 0, -1, 0}
  if rpm > 0 then
    local st, tat, rem, reset, retry = gcra(KEYS[k + 1], rpm, 1)
    if st == 1 then plan_r[i] = tat; s[1] = rem; s[2] = reset
    else deny(0, i, rpm, rem, reset, retry, st == 2 and 1 or 0, 1) end
  end
  if tpm > 0 then
    local st, tat, rem, reset, retry = gcra(KEYS[k + 2], tpm, cost)
    if st == 1 then plan_t[i] = tat; s[3] = rem; s[4] = reset
    else deny(1, i, tpm, rem, reset, retry, st == 2 and 1 or 0, cost) end
  end
  if conc > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[k + 3], '-inf', now)
    local held = redis.call('ZCARD', KEYS[k + 3])
    if held >= conc then deny(2, i, conc, 0, 1000000, 1000000, 0, 1) end
  end
  if day > 0 then
    local used = stored(KEYS[k + 4]) or 0
    if used + cost > day then
      deny(3, i, day, day - used, day_reset_us, day_reset_us, cost > day and 1 or 0, cost)
    end
  end
  if month > 0 then
    local used = stored(KEYS[k + 5]) or 0
    if used + cost > month then
      deny(4, i, month, month - used, month_reset_us, month_reset_us,
           cost > month and 1 or 0, cost)
    end
  end
  for _, x in ipairs(s) do table.insert(snaps, x) end
end

if #denials > 0 then
  table.insert(denials, 1, 0)
  return denials
end

for i = 0, n - 1 do
  local k = i * 5
  local a = 9 + i * 5
  if plan_r[i] then
    redis.call('SET', KEYS[k + 1], string.format('%.0f', plan_r[i]),
               'PX', math.ceil((plan_r[i] - now) / 1000) + 1000)
  end
  if plan_t[i] then
    redis.call('SET', KEYS[k + 2], string.format('%.0f', plan_t[i]),
               'PX', math.ceil((plan_t[i] - now) / 1000) + 1000)
  end
  if tonumber(ARGV[a + 2]) > 0 then
    redis.call('ZADD', KEYS[k + 3], string.format('%.0f', now + lease_us), lease)
    redis.call('PEXPIRE', KEYS[k + 3], math.ceil(lease_us / 1000) * 2)
  end
  if tonumber(ARGV[a + 3]) > 0 then
    redis.call('INCRBY', KEYS[k + 4], cost)
    redis.call('EXPIRE', KEYS[k + 4], day_ttl)
  end
  if tonumber(ARGV[a + 4]) > 0 then
    redis.call('INCRBY', KEYS[k + 5], cost)
    redis.call('EXPIRE', KEYS[k + 5], month_ttl)
  end
end
table.insert(snaps, 1, 1)
return snaps
"""

# Shared by SETTLE and FINISH: correct one subject's token state by `delta` tokens (the real
# usage minus the admission estimate). KEYS[k+2] is the GCRA theoretical arrival time of the
# tokens-per-minute limit; KEYS[k+4], KEYS[k+5] the day and month budget counters.
# ARGV[a] = tokens per minute (0: none), ARGV[a+1], ARGV[a+2] = day / month budget on (>0).
_SETTLE_SUBJECT = r"""
local function settle_subject(k, a, delta, now)
  local tpm = tonumber(ARGV[a])
  if tpm > 0 then
    local T = 60000000 / tpm
    local v = redis.call('GET', KEYS[k + 2])
    local tat = v and tonumber(v) or nil
    local new_tat = nil
    if delta >= 0 then
      if tat == nil or tat < now then tat = now end
      new_tat = tat + delta * T
    elseif tat ~= nil then
      new_tat = tat + delta * T
      if new_tat <= now then new_tat = nil end
    end
    if new_tat then
      redis.call('SET', KEYS[k + 2], string.format('%.0f', new_tat),
                 'PX', math.ceil((new_tat - now) / 1000) + 1000)
    elseif tat ~= nil then
      redis.call('DEL', KEYS[k + 2])
    end
  end
  for j = 1, 2 do
    if tonumber(ARGV[a + j]) > 0 and redis.call('EXISTS', KEYS[k + 3 + j]) == 1 then
      local used = redis.call('INCRBY', KEYS[k + 3 + j], delta)
      if used < 0 then redis.call('SET', KEYS[k + 3 + j], 0, 'KEEPTTL') end
    end
  end
end
"""

# KEYS as for ADMIT; ARGV: delta, n, then per subject (tpm, day>0, month>0).
SETTLE = _SETTLE_SUBJECT + r"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local delta = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
for i = 0, n - 1 do
  settle_subject(i * 5, 3 + i * 3, delta, now)
end
return 1
"""

# KEYS: lease sets; ARGV: lease id.
RELEASE = r"""
for _, key in ipairs(KEYS) do redis.call('ZREM', key, ARGV[1]) end
return 1
"""

# KEYS: lease sets; ARGV: lease duration (us), then lease ids (one per key). Renews only
# leases that still exist (XX): a reaped lease is not resurrected.
RENEW = r"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local lease_us = tonumber(ARGV[1])
local renewed = 0
for i, key in ipairs(KEYS) do
  renewed = renewed + redis.call('ZADD', key, 'XX', 'CH', string.format('%.0f', now + lease_us),
                                 ARGV[i + 1])
  redis.call('PEXPIRE', key, math.ceil(lease_us / 1000) * 2)
end
return renewed
"""

# SETTLE and RELEASE in one round trip. KEYS as for ADMIT; ARGV: delta, n, lease id, then per
# subject (tpm, day>0, month>0, concurrency>0).
FINISH = _SETTLE_SUBJECT + r"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local delta = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local lease = ARGV[3]
for i = 0, n - 1 do
  local k = i * 5
  local a = 4 + i * 4
  if delta ~= 0 then settle_subject(k, a, delta, now) end
  if tonumber(ARGV[a + 3]) > 0 then redis.call('ZREM', KEYS[k + 3], lease) end
end
return 1
"""
