-- Sluice: gives back units a lease took and did not spend (Store::give_back).
--
-- A daemon that leases takes a batch of units by an ordinary check.lua call (cost = the
-- batch), spends them locally, and gives back what is left when the key goes quiet, at
-- shutdown or on a rule change. This is a transcription of `sluice_core::algo::give_back`
-- (crates/sluice-core/src/algo/give_back.rs); the arithmetic must stay IDENTICAL to the Rust,
-- and the differential test (crates/sluice-store/tests/differential.rs) interleaves it with
-- check.lua on random sequences and compares every answer, TTL and stored state. The state
-- encodings are check.lua's, and so are its helpers below (a script cannot load another).
--
-- - token bucket: refilled to `now` as check.lua refills it, then `units` tokens added,
--   capped at the burst. `seen`, `used` and `born` stay as they are: a shared bucket's
--   cumulative `used` has been shipped to other regions under its generation's label
--   (`born`), which merge it by max, so it never goes down.
-- - gcra: tat = max(now, tat - units x emission interval).
-- - fixed window: count - units (not below 0), only while the window holding `now` is the
--   one holding `taken_at`; otherwise the units expired with their window.
-- - sliding window: likewise for the current counter; the previous counter is never touched.
-- - sliding log, concurrency: cannot be leased (SLUICE_BADARG).
-- Absent state (a full bucket, an empty window) has nothing to give back to. A written key
-- gets the TTL check.lua's take would give that state; a region-scope bucket full again is
-- deleted, a shared one kept a refill period.
--
-- Clock: `now` is the daemon's, as for a check; Redis's clock is never read.
--
-- KEYS[1]: the key holding the state at `now`: the rule key for buckets,
--   "<rule key>:<window start>" of the window holding `now` for windows.
-- ARGV[1]: "code p1 p2 wstart wend": check.lua's algorithm code and numbers (units per µs,
--   burst | interval, burst | limit, window) and the bounds of the window holding `now`
--   (a token bucket's units per token in wstart, as in check.lua; 0 0 for gcra).
-- ARGV[2]: "units taken_at now tstart": units given back (at most 10^9, as a cost: it keeps
--   units x interval exact), when they were taken, now, and the start of the window holding
--   `taken_at` (0 for buckets). Window bounds are Rust's (calendar maths), as for a check.
--
-- Reply: 1 when it wrote (or deleted) the key, 0 when there was nothing to give back to.
-- Errors: "SLUICE_CORRUPT 1 <detail>" when the key holds the wrong type or an unparsable
-- value; "SLUICE_BADARG <detail>" when an argument is not what the format says. Nothing is
-- written by a call that fails.

local MILLI = 1000
local MAX_EXACT = 9007199254740991 -- 2^53 - 1
local MAX_LIMIT = 1000000000       -- algo::MAX_LIMIT

local floor, min, max = math.floor, math.min, math.max
local find, match, format = string.find, string.match, string.format
local rcall, rpcall = redis.call, redis.pcall

-- check.lua's helpers, unchanged: exact integer division, formatting and key access.
local function idiv(a, b)
    local q = floor(a / b)
    local r = a - q * b
    if r < 0 then
        q = q - 1
    elseif r >= b then
        q = q + 1
    end
    return q
end

local function ceil_div(a, b)
    local q = idiv(a, b)
    if q * b < a then
        q = q + 1
    end
    return q
end

local function sat(a)
    if a < 0 then
        return 0
    end
    return a
end

local function fmt(n)
    return format('%d', n)
end

local function corrupt(detail)
    return redis.error_reply('SLUICE_CORRUPT 1 ' .. detail)
end

local function badarg(detail)
    return redis.error_reply('SLUICE_BADARG ' .. detail)
end

local function uint(s)
    if type(s) ~= 'string' or #s > 16 or not find(s, '^%d+$') then
        return nil
    end
    local n = s + 0
    if n > MAX_EXACT then
        return nil
    end
    return n
end

local function get_string(key)
    local v = rpcall('GET', key)
    if type(v) == 'table' and v.err then
        return nil, corrupt('holds a ' .. rcall('TYPE', key).ok .. ', expected a string')
    end
    if v == false then
        return nil, nil
    end
    return v, nil
end

-- Every TTL covers a second of lateness, as check.lua's for an unbounded call: a check
-- stamped before the key would have expired may still be on the wire (docs/redis.md, "Keys
-- outlive late calls"). A give-back carries no stale bound to size it by.
local LATE = 1000 * MILLI
local function pexpire_ms(ttl_us)
    local ms = ceil_div(min(ttl_us + LATE, MAX_EXACT), MILLI)
    if ms < 1 then
        ms = 1
    end
    return fmt(ms)
end

local function put_string(key, value, ttl_us)
    if ttl_us <= 0 then
        rcall('DEL', key)
    else
        rcall('SET', key, value, 'PX', pexpire_ms(ttl_us))
    end
end

---------------------------------------------------------------------------------------------
-- Arguments

local code, p1, p2, wstart, wend = match(ARGV[1] or '', '^([1-6]) (%d+) (%d+) (%d+) (%d+)$')
if code == nil then
    return badarg('ARGV[1] is not "code p1 p2 wstart wend"')
end
local units, taken_at, now, tstart = match(ARGV[2] or '', '^(%d+) (%d+) (%d+) (%d+)$')
if units == nil then
    return badarg('ARGV[2] is not "units taken_at now tstart"')
end
for _, s in ipairs({ p1, p2, wstart, wend, units, taken_at, now, tstart }) do
    if uint(s) == nil then
        return badarg('an argument holds a number above 2^53')
    end
end
code, p1, p2, wstart, wend = code + 0, p1 + 0, p2 + 0, wstart + 0, wend + 0
units, taken_at, now, tstart = units + 0, taken_at + 0, now + 0, tstart + 0
if p1 == 0 or p2 == 0 or (code == 1 and wstart == 0) then
    return badarg('a zero parameter')
end
if code == 5 or code == 6 then
    return badarg('algorithm ' .. code .. ' cannot be leased')
end
if units > MAX_LIMIT then
    return badarg('units above the largest limit')
end
if tstart > taken_at then
    return badarg('tstart is after taken_at: not the window holding it')
end
local key = KEYS[1]
if key == nil then
    return badarg('KEYS[1] is missing')
end
if units == 0 then
    return 0
end

-- check.lua's kept_ttl (core: token_bucket::kept_past_full): a bucket carrying a shared
-- figure keeps its key one refill period past full.
local function kept_ttl(to_full, seen, used, period)
    if seen > 0 or used > 0 then
        return min(to_full + period, MAX_EXACT)
    end
    return to_full
end

---------------------------------------------------------------------------------------------
-- token_bucket: "ts" or "tokens ts seen [used [born]]" (check.lua's tb_load / tb_take)

if code == 1 then
    local rate, burst, scale = p1, p2, wstart
    local cap = burst * scale
    local v, e = get_string(key)
    if e then return e end
    if v == nil then return 0 end
    local a, b, c, d, f = '0', match(v, '^(%d+)$'), '0', '0', '0'
    if b == nil then
        a, b, c, d, f = match(v, '^(%d+) (%d+) (%d+) (%d+) (%d+)$')
    end
    if a == nil then
        a, b, c, d = match(v, '^(%d+) (%d+) (%d+) (%d+)$')
        f = '0'
    end
    if a == nil then
        a, b, c = match(v, '^(%d+) (%d+) (%d+)$')
        d, f = '0', '0'
    end
    local tokens, ts, seen, used, born = uint(a), uint(b), uint(c), uint(d), uint(f)
    if tokens == nil or ts == nil or seen == nil or used == nil or born == nil then
        return corrupt('token bucket value ' .. format('%q', v) .. ' is not "ts" or "tokens ts seen [used [born]]"')
    end
    -- core: token_bucket::current with no remote figure (a give-back drains nothing).
    tokens = min(tokens, cap)
    local elapsed = sat(now - ts)
    if elapsed >= ceil_div(cap - tokens, rate) then
        tokens = cap
    else
        tokens = tokens + elapsed * rate
    end
    ts = max(ts, now)
    -- units past the burst fill it all the same: bounding it keeps the sum exact.
    tokens = min(tokens + min(units, burst) * scale, cap)
    -- core: token_bucket::normalize
    local value
    local back = idiv(tokens, rate)
    if seen == 0 and used == 0 and born == 0 and back * rate == tokens and back <= ts then
        value = fmt(ts - back)
    else
        value = fmt(tokens) .. ' ' .. fmt(ts) .. ' ' .. fmt(seen)
        if born > 0 then
            value = value .. ' ' .. fmt(used) .. ' ' .. fmt(born)
        elseif used > 0 then
            value = value .. ' ' .. fmt(used)
        end
    end
    put_string(key, value, kept_ttl(ceil_div(cap - tokens, rate), seen, used, ceil_div(cap, rate)))
    return 1
end

---------------------------------------------------------------------------------------------
-- gcra: "tat [seen [used [born]]]" (check.lua's gcra_load / gcra_take)

if code == 2 then
    local v, e = get_string(key)
    if e then return e end
    if v == nil then return 0 end
    local a, b, c, d = match(v, '^(%d+) (%d+) (%d+) (%d+)$')
    if a == nil then
        a, b, c = match(v, '^(%d+) (%d+) (%d+)$')
        d = '0'
    end
    if a == nil then
        a, b = match(v, '^(%d+) (%d+)$')
        c, d = '0', '0'
    end
    if a == nil then
        a, b, c, d = match(v, '^(%d+)$'), '0', '0', '0'
    end
    local tat, seen, used, born = uint(a), uint(b), uint(c), uint(d)
    if tat == nil or seen == nil or used == nil or born == nil then
        return corrupt('gcra value ' .. format('%q', v) .. ' is not "tat [seen [used [born]]]"')
    end
    -- units <= 10^9 and the interval <= 10^6: the product is exact.
    tat = max(now, sat(tat - units * p1))
    local value = fmt(tat)
    if born > 0 then
        value = value .. ' ' .. fmt(seen) .. ' ' .. fmt(used) .. ' ' .. fmt(born)
    elseif used > 0 then
        value = value .. ' ' .. fmt(seen) .. ' ' .. fmt(used)
    elseif seen > 0 then
        value = value .. ' ' .. fmt(seen)
    end
    put_string(key, value, kept_ttl(tat - now, seen, used, p1 * p2))
    return 1
end

---------------------------------------------------------------------------------------------
-- fixed_window and sliding_window: one integer counter per window start (the key)

-- The units counted in the window holding taken_at; once another window holds now, they
-- expired with theirs (a fixed window) or weigh in as the previous count (a sliding window).
if tstart ~= wstart then
    return 0
end
local v, e = get_string(key)
if e then return e end
if v == nil then return 0 end
local n = uint(v)
if n == nil then
    return corrupt('window counter ' .. format('%q', v) .. ' is not a count')
end
local ttl
if code == 3 then
    ttl = wend - now                 -- core: fixed_window::ttl
else
    ttl = 2 * p2 - (now - wstart)    -- core: sliding_window::ttl
end
put_string(key, fmt(sat(n - units)), ttl)
return 1
