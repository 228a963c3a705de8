-- Sluice: one identity's rules checked together, taken together (the store contract).
--
-- A transcription of `sluice_core::batch::apply` and of every algorithm's `evaluate` / `take`
-- in crates/sluice-core/src/algo/. The arithmetic must stay IDENTICAL to the Rust: the
-- differential test in crates/sluice-store/tests/differential.rs runs both on the same random
-- sequences and compares every outcome field. Lua 5.1 numbers are doubles; the core's
-- validation keeps every value below 2^53, where + - * on integers are exact. Division is not
-- (a / b rounds), so `idiv` floors and then corrects by one step.
--
-- Clock: `now` is the daemon's clock (epoch microseconds), never Redis TIME: the same code
-- runs in the simulator, windows align across regions, and tests are deterministic. Time
-- going backwards (another daemon's clock is behind) is clamped the way the core clamps it:
-- buckets keep max(stored ts, now), logs append at max(last, now), and windows live in one
-- key per window start, so a lagging clock counts in its own window and never rewinds a newer
-- one. See docs/redis.md.
--
-- KEYS: the Redis keys of the call's items, in item order. Every item takes one key, except a
-- sliding window, which takes two (current window, previous window). All share the
-- `{identity}` hash tag, so the script runs on one Cluster slot. A fair share (code 8) takes
-- two too (the tenant's bucket, then the rule's parent bucket), which share the domain as
-- hash tag instead, and a ninth number: see `fs_evaluate`.
--
-- ARGV: "now cost" or "now cost stale", request_id, then one argument per item:
--   "code p1 p2 flags rcur rprev wstart wend", space-separated decimal integers, where
--   code (1 token_bucket, 2 gcra, 3 fixed_window, 4 sliding_window, 5 sliding_log,
--         6 concurrency, 7 leaky_queue), flags = enforce (1) + 2 × charge_rejected, rcur / rprev = the
--   item's remote.cur / remote.prev.
--   p1, p2 = units refilled per µs, burst (token_bucket) | emission interval in µs, burst
--            (gcra) | limit, nominal window (fixed window) | limit, window (sliding window,
--            sliding log) | limit, timeout (concurrency) | emission interval in µs, max_delay
--            in µs (leaky_queue, whose wstart is its rate's period: the outcome's window).
--   wstart, wend = the window's bounds, computed by Rust (calendar maths is Rust's); for a
--   token bucket wstart is its units per token instead (10^6 for a rate per second, e.g.
--   6·10^6 for 10/1m: `algo::Rate`); 0 for other algorithms without windows, and both 0
--   for a fixed or sliding window with `window_start: first_request`, whose window is the key's own
--   (read from its state, see fr_window).
--   A bucket's rate arrives as Rust's `Rate` derives it (units, scale, interval), so the
--   script never divides a period itself. (Format 2; format 1 sent rate_per_s as p1. A
--   script's SHA names its format: each daemon runs the script it was built with.)
-- stale (optional, 0 = none): the Redis TIME (epoch microseconds) after which the call must
--   not run. A call that waited on the wire longer than its caller did (Redis paused, a
--   backlog after a stall) would otherwise take units for a request its daemon has already
--   answered by the rule's failure mode; past `stale` it answers "SLUICE_STALE <late us>" and
--   changes nothing. This is the one place Redis's clock is read, and only to compare: the
--   algorithms still run on `now`.
-- Numbers travel packed, a few arguments per call rather than nine per item: Redis copies
-- and interns every argument and the script checks each, and on a fixed-window check that
-- was most of its cost (docs/redis.md). One pattern match checks an item's digits.
--
-- Reply: { allowed, then per item: allowed, limit, remaining, reset, retry_after, window,
--          usage, generation } as integers (generation: a shared bucket's birth stamp in
--          epoch ms, the label its usage ships under; 0 for every other rule); a call of one fixed-window item answers only the integer
--          count its window held before the call (see fw_alone).
--
-- Errors: a call past its `stale` bound answers "SLUICE_STALE <microseconds late>"; a key
-- holding the wrong type or an unparsable value answers
--   "SLUICE_CORRUPT <key index> <detail>"  (1-based index into KEYS)
-- and an argument that is not what the format says answers "SLUICE_BADARG <detail>".
-- Nothing is written by a call that fails: every read and check happens before the first
-- write.

local SECOND = 1000000     -- microseconds
local MILLI = 1000
local MAX_EXACT = 9007199254740991 -- 2^53 - 1
-- core: algo::UNLABELLED. Added to a shared bucket's rprev: generation labels off (a region
-- not yet all on this release), so its state keeps the older form.
local UNLABELLED = 4294967296 -- 2^32

-- Library functions as locals: a global or table lookup per use is a measurable part of a
-- check in Redis's Lua (docs/redis.md, "What a check costs Redis").
local floor, min, max = math.floor, math.min, math.max
local find, match, format = string.find, string.match, string.format
local rcall, rpcall = redis.call, redis.pcall

-- Exact floor(a / b) for integers 0 <= a, 0 < b below 2^53: the double quotient may be off
-- by one near an integer, so correct it with the exact remainder.
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

-- Rust's u64::div_ceil.
local function ceil_div(a, b)
    local q = idiv(a, b)
    if q * b < a then
        q = q + 1
    end
    return q
end

-- Rust's u64::saturating_sub.
local function sat(a)
    if a < 0 then
        return 0
    end
    return a
end

-- An integer below 2^53 as decimal digits. '%d' formats a C long; '%.0f' (and Lua's own
-- number-to-string, '%.14g', which a number passed to redis.call goes through) take glibc's
-- multi-precision float path, several times slower (docs/redis.md).
local function fmt(n)
    return format('%d', n)
end

local function corrupt(ki, detail)
    return redis.error_reply('SLUICE_CORRUPT ' .. ki .. ' ' .. detail)
end

-- A stored unsigned integer (decimal digits, below 2^53), or nil. Arithmetic converts the
-- checked digits (cheaper than calling tonumber); a digit string above 2^53 - 1 converts to
-- 2^53 or more, so one comparison bounds it.
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

local function badarg(detail)
    error({ err = 'SLUICE_BADARG ' .. detail })
end

local function arg_uint(i)
    local n = uint(ARGV[i])
    if n == nil then
        badarg('ARGV[' .. i .. '] is not an integer below 2^53')
    end
    return n
end

-- Redis's own clock in epoch microseconds, read once per script run (TIME is cheap but not
-- free) and only when a call carries a stale bound. Effects replication (the default from
-- Redis 7, asked for on older servers) lets a script write after reading the clock.
local redis_now = nil
local function clock_us()
    if redis_now == nil then
        if redis.replicate_commands then
            redis.replicate_commands()
        end
        local t = rcall('TIME')
        redis_now = t[1] * SECOND + t[2]
    end
    return redis_now
end

-- "now cost" or "now cost stale": the call's first argument. stale is 0 when absent.
local function arg_head(i)
    local a, b, c = match(ARGV[i] or '', '^(%d+) (%d+) ?(%d*)$')
    if a == nil then
        badarg('ARGV[' .. i .. '] is not "now cost [stale]"')
    end
    a, b = a + 0, b + 0
    c = (c == '') and 0 or c + 0
    if a > MAX_EXACT or b > MAX_EXACT or c > MAX_EXACT then
        badarg('ARGV[' .. i .. '] ("now cost [stale]") holds a number above 2^53')
    end
    return a, b, c
end

-- Two integers in one argument ("nk na").
local function arg_pair(i, what)
    local a, b = match(ARGV[i] or '', '^(%d+) (%d+)$')
    if a == nil then
        badarg('ARGV[' .. i .. '] is not "' .. what .. '"')
    end
    a, b = a + 0, b + 0
    if a > MAX_EXACT or b > MAX_EXACT then
        badarg('ARGV[' .. i .. '] ("' .. what .. '") holds a number above 2^53')
    end
    return a, b
end

local ITEM = '^([1-7]) (%d+) (%d+) ([0-3]) (%d+) (%d+) (%d+) (%d+)$'

-- A fair share's item (code 8) carries a ninth number, borrow_above (`parse_fs`).
local ITEM_FS = '^8 (%d+) (%d+) ([0-3]) (%d+) (%d+) (%d+) (%d+) (%d+)$'

local function parse_fs(s, i)
    local p1, p2, fl, rc, rp, ws, we, x = match(s, ITEM_FS)
    if p1 == nil then
        badarg('item ' .. i .. ' is not "8 p1 p2 flags rcur rprev wstart wend borrow_above"')
    end
    p1, p2, rc, rp, ws, we, x = p1 + 0, p2 + 0, rc + 0, rp + 0, ws + 0, we + 0, x + 0
    if p1 > MAX_EXACT or p2 > MAX_EXACT or rc > MAX_EXACT or rp > MAX_EXACT
        or ws > MAX_EXACT or we > MAX_EXACT or x > MAX_EXACT then
        badarg('item ' .. i .. ' holds a number above 2^53')
    end
    if p1 == 0 or p2 == 0 or rc == 0 or rp == 0 or ws == 0 or we == 0 then
        badarg('item ' .. i .. ' has a zero parameter')
    end
    return 8, p1, p2, fl + 0, rc, rp, ws, we, x
end

-- One item's argument as numbers: code, p1, p2, flags, rcur, rprev, wstart, wend. One
-- pattern match checks every digit.
local function parse_item(s, i)
    if find(s or '', '^8 ') then
        return parse_fs(s, i)
    end
    local c, p1, p2, fl, rc, rp, ws, we = match(s or '', ITEM)
    if c == nil then
        badarg('item ' .. i .. ' is not "code p1 p2 flags rcur rprev wstart wend"')
    end
    p1, p2, rc, rp, ws, we = p1 + 0, p2 + 0, rc + 0, rp + 0, ws + 0, we + 0
    if p1 > MAX_EXACT or p2 > MAX_EXACT or rc > MAX_EXACT or rp > MAX_EXACT
        or ws > MAX_EXACT or we > MAX_EXACT then
        badarg('item ' .. i .. ' holds a number above 2^53')
    end
    -- A leaky_queue's max_delay is 0 for a caller that cannot wait (Envoy).
    if p1 == 0 or (p2 == 0 and c ~= '7') or (c == '1' and ws == 0) then
        badarg('item ' .. i .. ' has a zero parameter')
    end
    return c + 0, p1, p2, fl + 0, rc, rp, ws, we
end

-- GET that reports a key of another type instead of raising.
local function get_string(key, ki)
    local v = rpcall('GET', key)
    if type(v) == 'table' and v.err then
        return nil, corrupt(ki, 'holds a ' .. rcall('TYPE', key).ok .. ', expected a string')
    end
    if v == false then
        return nil, nil
    end
    return v, nil
end

-- Checks a key is a sorted set or absent.
local function check_zset(key, ki)
    local t = rcall('TYPE', key).ok
    if t ~= 'zset' and t ~= 'none' then
        return corrupt(ki, 'holds a ' .. t .. ', expected a zset')
    end
    return nil
end

-- How late a call may still run: every TTL covers it (docs/redis.md, "Keys outlive late
-- calls"). A state lives in daemon time, its key's TTL in Redis's: a key timed to expire
-- when its state no longer matters, from the call that wrote it, would vanish under a call
-- stamped before that moment that waited longer on the wire, and that call would start from
-- a full bucket or an empty window. A bounded call runs at most its bound after its `now`,
-- so what is left of the writing call's bound covers every later one (the fleet shares one
-- budget); an unbounded call is covered for UNBOUNDED_LATE.
local UNBOUNDED_LATE = SECOND
local late_us = UNBOUNDED_LATE

-- A TTL for SET PX / PEXPIRE, as the argument string.
local function pexpire_ms(ttl_us)
    local ms = ceil_div(min(ttl_us + late_us, MAX_EXACT), MILLI)
    if ms < 1 then
        ms = 1
    end
    return fmt(ms)
end

-- SET with a TTL, or DEL when the state carries nothing (TTL 0), like Write::Put(_, 0).
local function put_string(key, value, ttl_us)
    if ttl_us <= 0 then
        rcall('DEL', key)
    else
        rcall('SET', key, value, 'PX', pexpire_ms(ttl_us))
    end
end

---------------------------------------------------------------------------------------------
-- token_bucket: "tokens ts seen" (micro-tokens, µs, cumulative remote units drained), then
-- " used" (units this region took in the key's generation) only when used > 0, which only a
-- shared rule counts, and " used born" (the generation's birth, epoch ms: the label its
-- figure ships under) whenever born > 0, which only a shared rule writes. An unshared bucket whose tokens are a whole number of µs of refill is
-- written as "ts" alone: 0 tokens at the instant it was empty (core: token_bucket::normalize),
-- one integer, which Redis keeps inside the key's object (72 B a key instead of 104).
--
-- For buckets the item's remote.prev is 0 for a region-scope rule, else the number of
-- regions sharing it (core: Remote::shares_bucket, Remote::fresh_share); buckets have no
-- previous window.

-- core: token_bucket::used_after; MAX_USED = 2^53 - 1. used + min(cost, burst) may round
-- above 2^53, but rounding is monotone, so the min still gives MAX_USED.
local MAX_USED = 9007199254740991

local function used_after(it, used, cost)
    if it.rprev ~= 0 then
        return min(used + min(cost, it.p2), MAX_USED)
    end
    return used
end

-- core: token_bucket::kept_past_full. A bucket carrying a shared figure (seen or used) keeps
-- its key one refill period past full, so a region taking under the rate keeps counting used
-- (region-scope buckets carry neither and expire at full). The TTL is capped at 2^53 - 1:
-- rounding is monotone, so the min gives the core's figure.
local function kept_ttl(to_full, seen, used, period)
    if seen > 0 or used > 0 then
        return min(to_full + period, MAX_USED)
    end
    return to_full
end

-- core: token_bucket::usage
local function bucket_usage(it, used, remaining)
    if it.rprev ~= 0 then
        return used
    end
    return it.p2 - remaining
end

-- core: token_bucket::born_at. A fresh key of a shared rule is labelled with its birth (ms),
-- unless labels are off.
local function born_at(now, rprev)
    if rprev ~= 0 and rprev < UNLABELLED then
        return idiv(now, MILLI)
    end
    return 0
end

-- core: token_bucket::kept_born. A stored birth stamp is dropped when labels are off.
local function kept_born(born, rprev)
    if rprev >= UNLABELLED then
        return 0
    end
    return born
end

-- core: token_bucket::generation, in ms (the daemon multiplies by 1000): the label a shared
-- bucket's usage ships under, 0 for a region-scope rule.
local function bucket_generation(it, born)
    if it.rprev ~= 0 then
        return born
    end
    return 0
end

local function tb_load(key, ki)
    local v, e = get_string(key, ki)
    if e then return nil, e end
    if v == nil then return nil, nil end
    -- The normalized form ("ts") first: it is what an unshared bucket holds.
    local a, b, c, d, e = '0', match(v, '^(%d+)$'), '0', '0', '0'
    if b == nil then
        a, b, c, d, e = match(v, '^(%d+) (%d+) (%d+) (%d+) (%d+)$')
    end
    if a == nil then
        a, b, c, d = match(v, '^(%d+) (%d+) (%d+) (%d+)$')
        e = '0'
    end
    if a == nil then
        a, b, c = match(v, '^(%d+) (%d+) (%d+)$')
        d, e = '0', '0'
    end
    local tokens, ts, seen, used, born = uint(a), uint(b), uint(c), uint(d), uint(e)
    if tokens == nil or ts == nil or seen == nil or used == nil or born == nil then
        return nil, corrupt(ki, 'token bucket value ' .. format('%q', v) .. ' is not "ts" or "tokens ts seen [used [born]]"')
    end
    return { tokens, ts, seen, used, born }, nil
end

-- core: Remote::fresh_share. Units a fresh bucket key holds at once: the whole burst for a
-- region-scope rule (rprev 0) or one region (rprev 1), else this region's share of it,
-- ceil(burst / R) with R = rprev, at least 1 and at most the burst: R regions that each see
-- a new key start together with about one burst, not R.
local function fresh_share(burst, rprev)
    local regions = rprev % UNLABELLED
    if regions <= 1 then
        return burst
    end
    return min(max(ceil_div(burst, regions), 1), burst)
end

-- core: Remote::fresh_seen. The remote figure a fresh bucket key takes as drained: the
-- figure it hears plus the rest of the burst, which the other regions take from their own
-- shares. rcur + the rest may round above 2^53, but rounding is monotone, so the min still
-- gives MAX_USED (rcur itself is at most 2^53 - 1).
local function fresh_seen(burst, rcur, rprev)
    return min(rcur + (burst - fresh_share(burst, rprev)), MAX_USED)
end

-- rate = units per µs, scale = units per token (`algo::Rate::units` / `scale`).
local function tb_current(rate, scale, burst, st, now, rcur, rprev)
    local cap = burst * scale
    local tokens, ts, seen, used, born
    if st then
        tokens = min(st[1], cap)
        local elapsed = sat(now - st[2])
        local missing = cap - tokens
        if elapsed >= ceil_div(missing, rate) then
            tokens = cap
        else
            tokens = tokens + elapsed * rate
        end
        ts = max(st[2], now)
        seen = st[3]
        used = st[4]
        born = kept_born(st[5], rprev)
    else
        tokens, ts, used = fresh_share(burst, rprev) * scale, now, 0
        seen = fresh_seen(burst, rcur, rprev)
        born = born_at(now, rprev)
    end
    -- Other regions' new consumption comes out of what the bucket holds; the rest is owed
    -- (seen lags the figure, at most one burst) and comes out of the refill.
    local fresh = sat(rcur - seen)
    local drained = min(fresh, idiv(tokens, scale))
    tokens = tokens - drained * scale
    if fresh > 0 then
        seen = rcur - min(fresh - drained, burst)
    end
    return tokens, ts, seen, used, born
end

local function tb_evaluate(it, st, now, cost)
    local rate, burst, scale = it.p1, it.p2, it.wstart
    local cap = burst * scale
    local tokens, _, _, used, born = tb_current(rate, scale, burst, st, now, it.rcur, it.rprev)
    local gen = bucket_generation(it, born)
    -- A cost above the burst never fits (and cost × scale could pass 2^53).
    local probe = max(cost, 1)
    local need = cap + 1
    if probe <= burst then
        need = probe * scale
    end
    local window = ceil_div(cap, rate)
    if need <= tokens then
        local after = tokens - cost * scale
        local remaining = idiv(after, scale)
        return { true, burst, remaining, ceil_div(cap - after, rate), 0, window,
            bucket_usage(it, used_after(it, used, cost), remaining), gen }
    end
    local remaining = idiv(tokens, scale)
    local retry
    if need > cap then
        retry = window
    else
        retry = ceil_div(need - tokens, rate)
    end
    return { false, burst, remaining, ceil_div(cap - tokens, rate), retry, window,
        bucket_usage(it, used, remaining), gen }
end

local function tb_take(it, st, now, cost)
    local rate, burst, scale = it.p1, it.p2, it.wstart
    local cap = burst * scale
    local tokens, ts, seen, used, born = tb_current(rate, scale, burst, st, now, it.rcur, it.rprev)
    -- A charge above the burst empties the bucket, no more.
    tokens = sat(tokens - min(cost, burst) * scale)
    used = used_after(it, used, cost)
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
    put_string(it.key, value, kept_ttl(ceil_div(cap - tokens, rate), seen, used, ceil_div(cap, rate)))
end

---------------------------------------------------------------------------------------------
-- gcra: "tat seen used born" (theoretical arrival time in µs, cumulative remote units
-- applied, units this region took in the key's generation, the generation's birth in epoch
-- ms), shortened to "tat seen used" when born is 0 (a key written before labels), to
-- "tat seen" when used is 0 too, and to just "tat" when seen is 0 too (every region-scope
-- rule): Redis then keeps the value as an integer, 16 bytes instead of a 48-byte string
-- allocation.

local function gcra_load(key, ki)
    local v, e = get_string(key, ki)
    if e then return nil, e end
    if v == nil then return nil, nil end
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
        return nil, corrupt(ki, 'gcra value ' .. format('%q', v) .. ' is not "tat [seen [used [born]]]"')
    end
    return { tat, seen, used, born }, nil
end

-- t = the emission interval in µs (`algo::Rate::interval`).
local function gcra_current(t, burst, st, now, rcur, rprev)
    local tat, seen, used, born
    if st then
        tat, seen, used, born = st[1], st[2], st[3], kept_born(st[4], rprev)
    else
        -- Fresh: this region's share of the cells free (all of them unless shared), the
        -- rest left to the other regions' shares.
        tat, seen, used = now + (burst - fresh_share(burst, rprev)) * t, fresh_seen(burst, rcur, rprev), 0
        born = born_at(now, rprev)
    end
    -- Fresh remote consumption up to one burst of debt; the rest is owed (seen lags).
    local fresh = sat(rcur - seen)
    tat = max(tat, now)
    local applied = min(fresh, idiv(sat(now + t * burst - tat), t))
    if fresh > 0 then
        seen = rcur - min(fresh - applied, burst)
    end
    return tat + applied * t, seen, used, born
end

local function gcra_evaluate(it, st, now, cost)
    local t, burst = it.p1, it.p2
    local tolerance = t * burst
    local tat, _, used, born = gcra_current(t, burst, st, now, it.rcur, it.rprev)
    local gen = bucket_generation(it, born)
    local probe_cost = max(cost, 1)
    local probe = tat + probe_cost * t
    if probe - now <= tolerance then
        local after = tat + cost * t
        local remaining = idiv(tolerance - (after - now), t)
        return { true, burst, remaining, after - now, 0, tolerance,
            bucket_usage(it, used_after(it, used, cost), remaining), gen }
    end
    local remaining = idiv(sat(tolerance - (tat - now)), t)
    local retry
    if probe_cost > burst then
        retry = tolerance
    else
        retry = probe - now - tolerance
    end
    return { false, burst, remaining, tat - now, retry, tolerance, bucket_usage(it, used, remaining),
        gen }
end

local function gcra_take(it, st, now, cost)
    local t, burst = it.p1, it.p2
    local tat, seen, used, born = gcra_current(t, burst, st, now, it.rcur, it.rprev)
    -- A charged refusal may not push the TAT beyond one full burst of debt.
    tat = min(tat + cost * t, now + t * burst)
    used = used_after(it, used, cost)
    local value = fmt(tat)
    if born > 0 then
        value = value .. ' ' .. fmt(seen) .. ' ' .. fmt(used) .. ' ' .. fmt(born)
    elseif used > 0 then
        value = value .. ' ' .. fmt(seen) .. ' ' .. fmt(used)
    elseif seen > 0 then
        value = value .. ' ' .. fmt(seen)
    end
    put_string(it.key, value, kept_ttl(tat - now, seen, used, t * burst))
end

---------------------------------------------------------------------------------------------
-- fixed_window: one integer counter per window, key "<rule key>:<window start>"

local function counter_load(key, ki)
    local v, e = get_string(key, ki)
    if e then return nil, e end
    if v == nil then return 0, nil end
    local n = uint(v)
    if n == nil then
        return nil, corrupt(ki, 'window counter ' .. format('%q', v) .. ' is not a count')
    end
    return n, nil
end

-- core: fixed_window::evaluate's `allowed`, the only field the one-item short path needs.
local function fw_allows(limit, rcur, st, cost)
    return st + rcur + max(cost, 1) <= limit
end

-- Scalars in, seven values out (the outcome's fields).
local function fw_evaluate(limit, window, rcur, wend, st, now, cost)
    local used = st + rcur
    local allowed = fw_allows(limit, rcur, st, cost)
    local used_after, local_after = used, st
    if allowed then
        used_after, local_after = used + cost, st + cost
    end
    local retry = 0
    if not allowed then
        retry = wend - now
    end
    return allowed, limit, sat(limit - used_after), wend - now, retry, window, local_after, 0
end

local function fw_take(key, wend, st, now, cost)
    put_string(key, fmt(st + cost), wend - now)
end

-- A call of one fixed window, the common case: the same steps as run_call's general path
-- (load, evaluate, take), without its tables, answering the count it read. The outcome is a
-- function of that count and of what the daemon sent, so the daemon computes it with the
-- core's own code (sluice_core::batch::answer) rather than parse eight integers per call.
local function fw_alone(key, now, cost, limit, flags, rcur, wend)
    local st, e = counter_load(key, 1)
    if e then
        return e
    end
    local ok = fw_allows(limit, rcur, st, cost)
    -- Not enforced (shadow): allowed whatever the count says.
    local allowed = ok or flags % 2 == 0
    -- A refused request was refused by this item: nothing to give back.
    if cost > 0 and (ok or (not allowed and flags >= 2)) then
        fw_take(key, wend, st, now, cost)
    end
    return st
end

---------------------------------------------------------------------------------------------
-- fixed_window with window_start: first_request (an item of code 3 whose wstart and wend
-- are 0): one key, the rule key itself, holding "start count", the key's own window start
-- and its count. core: fixed_window::key_bounds. The stored window lasts [start, start +
-- len); a call after it (or on a fresh key) starts a window at its own now. A call behind
-- the stored start (a lagging clock) counts in the stored window.

local function fr_load(key, ki)
    local v, e = get_string(key, ki)
    if e then return nil, e end
    if v == nil then return nil, nil end
    local a, b = match(v, '^(%d+) (%d+)$')
    local start, count = uint(a), uint(b)
    if start == nil or count == nil then
        return nil, corrupt(ki, 'first-request window value ' .. format('%q', v) .. ' is not "start count"')
    end
    return { start, count }, nil
end

-- The effective now, the window's start and end, and the count in it.
local function fr_window(len, st, now)
    if st == nil then
        return now, now, now + len, 0
    end
    now = max(now, st[1])
    if now < st[1] + len then
        return now, st[1], st[1] + len, st[2]
    end
    return now, now, now + len, 0
end

local function fr_evaluate(it, st, now, cost)
    local n, _, wend, count = fr_window(it.p2, st, now)
    return { fw_evaluate(it.p1, it.p2, it.rcur, wend, count, n, cost) }
end

local function fr_take(it, st, now, cost)
    local n, start, wend, count = fr_window(it.p2, st, now)
    put_string(it.key, fmt(start) .. ' ' .. fmt(count + cost), wend - n)
end

---------------------------------------------------------------------------------------------
-- sliding_window: the counters of the current and previous windows, one key per window start

local function sw_wait_until_rem(window, elapsed, r_ms)
    return sat((window - elapsed) - ((r_ms + 1) * MILLI - 1))
end

local function sw_evaluate(it, st, now, cost)
    local limit, window, start = it.p1, it.p2, it.wstart
    local elapsed = now - start
    local w_ms = idiv(window, MILLI)
    local rem_ms = idiv(window - elapsed, MILLI)
    local lcur, lprev = st[1], st[2]
    local cur = lcur + it.rcur
    local prev = lprev + it.rprev
    local probe = max(cost, 1)
    local budget = limit * w_ms
    local allowed = prev * rem_ms + (cur + probe) * w_ms <= budget
    local cur_after = cur
    if allowed then
        cur_after = cur + cost
    end
    local remaining = sat(idiv(sat(budget - prev * rem_ms), w_ms) - cur_after)
    local retry
    if allowed then
        retry = 0
    elseif probe > limit then
        retry = 2 * window - elapsed
    elseif cur + probe <= limit then
        -- Within this window, once the previous window's weight has shrunk enough.
        local r = idiv((limit - cur - probe) * w_ms, prev)
        retry = sw_wait_until_rem(window, elapsed, r)
    else
        -- Next window: the current count becomes the weighted one.
        local to_next = window - elapsed
        local r = idiv((limit - probe) * w_ms, cur)
        if r >= w_ms then
            retry = to_next
        else
            retry = to_next + sw_wait_until_rem(window, 0, r)
        end
    end
    local usage = lcur
    if allowed then
        usage = lcur + cost
    end
    return { allowed, limit, remaining, window - elapsed, retry, window, usage, 0 }
end

local function sw_take(it, st, now, cost)
    local window = it.p2
    put_string(it.key, fmt(st[1] + cost), 2 * window - (now - it.wstart))
end

---------------------------------------------------------------------------------------------
-- sliding_window with window_start: first_request (code 4, wstart and wend 0): one key, the
-- rule key itself, holding "start cur prev", the key's own window start and the counts of
-- that window and the one before. core: sliding_window::window_of. The stored window lasts
-- [start, start + len); in the window after it the stored count is the previous one; after
-- both (or on a fresh key) a window starts at the call's own now. A call behind the stored
-- start counts in the stored window.

local function swf_load(key, ki)
    local v, e = get_string(key, ki)
    if e then return nil, e end
    if v == nil then return nil, nil end
    local a, b, c = match(v, '^(%d+) (%d+) (%d+)$')
    local start, cur, prev = uint(a), uint(b), uint(c)
    if start == nil or cur == nil or prev == nil then
        return nil, corrupt(ki, 'first-request sliding window value ' .. format('%q', v) .. ' is not "start cur prev"')
    end
    return { start, cur, prev }, nil
end

-- The effective now, the window's start, and its (cur, prev) counts.
local function swf_window(len, st, now)
    if st == nil then
        return now, now, 0, 0
    end
    now = max(now, st[1])
    if now < st[1] + len then
        return now, st[1], st[2], st[3]
    elseif now < st[1] + 2 * len then
        return now, st[1] + len, 0, st[2]
    end
    return now, now, 0, 0
end

-- sw_evaluate and the counters' write, on the key's own window.
local function swf_evaluate(it, st, now, cost)
    local n, start, cur, prev = swf_window(it.p2, st, now)
    local own = { p1 = it.p1, p2 = it.p2, rcur = it.rcur, rprev = it.rprev, wstart = start }
    return sw_evaluate(own, { cur, prev }, n, cost)
end

local function swf_take(it, st, now, cost)
    local n, start, cur, prev = swf_window(it.p2, st, now)
    put_string(it.key, fmt(start) .. ' ' .. fmt(cur + cost) .. ' ' .. fmt(prev),
        2 * it.p2 - (n - start))
end

---------------------------------------------------------------------------------------------
-- sliding_log: a sorted set, one member per admitted unit (the newest `limit` at most),
-- score = admission time, member "<µs>.<seq>" (see sl_member)

-- Live entries are those with t + window > now, i.e. score > now - window.
local function sl_load(key, ki, now, window)
    local e = check_zset(key, ki)
    if e then return nil, e end
    local cutoff = '(' .. fmt(now - window)
    local n = rcall('ZCOUNT', key, cutoff, '+inf')
    local last, last_seq = nil, nil
    if n > 0 then
        -- The newest entry; among equal times the greatest sequence number (see sl_member).
        local r = rcall('ZRANGE', key, -1, -1, 'WITHSCORES')
        last = uint(r[2])
        if last == nil then
            return nil, corrupt(ki, 'sliding log score ' .. tostring(r[2]) .. ' is not a time')
        end
        last_seq = uint(match(r[1], '^%d+%.%d(%d+)$'))
        if last_seq == nil then
            return nil, corrupt(ki, 'sliding log member ' .. format('%q', r[1]) .. ' is not "<µs>.<seq>"')
        end
    end
    return { n = n, last = last, last_seq = last_seq, cutoff = cutoff, key = key, ki = ki }, nil
end

-- Members must be unique: "<at>.<seq>", seq counting up among the entries at one time and
-- written with its digit count first ("10", "11", ..., "210") so that Redis's order among
-- equal scores (by member) is the order of arrival, and trimming the oldest by rank trims
-- the first arrived.
local function sl_member(at, seq)
    local d = fmt(seq)
    return fmt(at) .. '.' .. #d .. d
end

local function sl_evaluate(it, st, now, cost)
    local limit, window = it.p1, it.p2
    local n = st.n
    local probe = max(cost, 1)
    local allowed = n + probe <= limit
    local after = n
    if allowed then
        after = n + cost
    end
    local retry = 0
    if allowed then
        retry = 0
    elseif probe > limit then
        retry = window
    else
        -- The oldest (n + probe - limit) live entries must age out.
        local k = n + probe - limit
        local r = rcall('ZRANGEBYSCORE', st.key, st.cutoff, '+inf', 'WITHSCORES', 'LIMIT', k - 1, 1)
        local t = uint(r[2])
        if t == nil then
            return nil, corrupt(st.ki, 'sliding log score ' .. tostring(r[2]) .. ' is not a time')
        end
        retry = t + window - now
    end
    local reset
    if allowed and cost > 0 then
        reset = window
    elseif st.last ~= nil then
        reset = st.last + window - now
    else
        reset = 0
    end
    return { allowed, limit, sat(limit - after), reset, retry, window, after, 0 }, nil
end

local function sl_take(it, st, now, cost)
    local limit, window = it.p1, it.p2
    local key = it.key
    rcall('ZREMRANGEBYSCORE', key, '-inf', fmt(now - window))
    -- Timestamps stay ascending even if a daemon's clock is behind another's.
    local at = now
    if st.last ~= nil and st.last > now then
        at = st.last
    end
    local seq = 0
    if st.last ~= nil and st.last == at then
        seq = st.last_seq + 1
    end
    -- Only the newest `limit` entries can ever decide (see sliding_log.rs): append at most
    -- `limit` and drop the oldest beyond it, so a charged refusal of a huge cost stays bounded.
    local added = min(cost, limit)
    local args = {}
    for i = 0, added - 1 do
        args[#args + 1] = fmt(at)
        args[#args + 1] = sl_member(at, seq + i)
        if #args >= 200 or i == added - 1 then
            rcall('ZADD', key, unpack(args))
            args = {}
        end
    end
    local excess = rcall('ZCARD', key) - limit
    if excess > 0 then
        rcall('ZREMRANGEBYRANK', key, 0, excess - 1)
    end
    rcall('PEXPIRE', key, pexpire_ms(at + window - now))
end

---------------------------------------------------------------------------------------------
-- concurrency: a sorted set of slots, member "<cost>:<request id>", score = expiry

local function cc_load(key, ki, now)
    local e = check_zset(key, ki)
    if e then return nil, e end
    local r = rcall('ZRANGEBYSCORE', key, '(' .. fmt(now), '+inf', 'WITHSCORES')
    local slots = {}
    for i = 1, #r, 2 do
        local c, id = match(r[i], '^(%d+):(.*)$')
        local cost, exp = uint(c), uint(r[i + 1])
        if cost == nil or exp == nil then
            return nil, corrupt(ki, 'concurrency slot ' .. format('%q', r[i]) .. ' is not "<cost>:<id>" with an expiry')
        end
        slots[#slots + 1] = { member = r[i], id = id, exp = exp, cost = cost }
    end
    return slots, nil
end

local function cc_evaluate(it, st, now, cost, rid)
    local limit, timeout = it.p1, it.p2
    -- A repeated id renews its own slot rather than taking another.
    local held = 0
    local others = {}
    for _, s in ipairs(st) do
        if s.id ~= rid then
            held = held + s.cost
            others[#others + 1] = { s.exp, s.cost }
        end
    end
    local probe = max(cost, 1)
    local allowed = held + probe <= limit
    local after = held
    if allowed then
        after = held + cost
    end
    local retry
    if allowed then
        retry = 0
    elseif probe > limit then
        retry = timeout
    else
        table.sort(others, function(a, b)
            if a[1] ~= b[1] then return a[1] < b[1] end
            return a[2] < b[2]
        end)
        local need = held + probe - limit
        retry = timeout
        for _, ec in ipairs(others) do
            if ec[2] >= need then
                retry = ec[1] - now
                break
            end
            need = need - ec[2]
        end
    end
    return { allowed, limit, sat(limit - after), timeout, retry, timeout, after, 0 }
end

local function cc_take(it, st, now, cost, rid)
    local key, timeout = it.key, it.p2
    rcall('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
    for _, s in ipairs(st) do
        if s.id == rid then
            rcall('ZREM', key, s.member)
        end
    end
    if cost > 0 then
        rcall('ZADD', key, fmt(now + timeout), fmt(cost) .. ':' .. rid)
    end
    local top = rcall('ZRANGE', key, -1, -1, 'WITHSCORES')
    if #top == 0 then
        rcall('DEL', key)
        return
    end
    local ttl = sat(tonumber(top[2]) - now)
    if ttl <= 0 then
        rcall('DEL', key)
    else
        rcall('PEXPIRE', key, pexpire_ms(ttl))
    end
end

---------------------------------------------------------------------------------------------
-- batch::apply

---------------------------------------------------------------------------------------------
-- leaky_queue: "tat", the next free departure in µs (core: algo/leaky_queue.rs). A request
-- departs at max(now, tat) and holds the queue for cost intervals; allowed while its wait is
-- at most max_delay, and an allowed outcome's retry_after is that wait (its delay). The key
-- expires at tat: past it, absent state is the same empty queue.

local function lq_load(key, ki)
    local v, e = get_string(key, ki)
    if e then return nil, e end
    if v == nil then return nil, nil end
    local tat = uint(match(v, '^(%d+)$'))
    if tat == nil then
        return nil, corrupt(ki, 'leaky_queue value ' .. format('%q', v) .. ' is not "tat"')
    end
    return tat, nil
end

-- core: leaky_queue::held_until
local function lq_held_until(depart, cost, t)
    return min(depart + cost * t, MAX_EXACT)
end

-- core: leaky_queue::room
local function lq_room(t, max_delay, ahead)
    if ahead > max_delay then
        return 0
    end
    return idiv(max_delay - ahead, t) + 1
end

local function lq_evaluate(it, st, now, cost)
    local t, max_delay = it.p1, it.p2
    local depart = now
    if st then
        depart = max(st, now)
    end
    local delay = depart - now
    local limit = lq_room(t, max_delay, 0)
    if delay <= max_delay then
        local held = depart
        if cost > 0 then
            held = lq_held_until(depart, cost, t)
        end
        local remaining = lq_room(t, max_delay, held - now)
        return { true, limit, remaining, held - now, delay, it.wstart, limit - min(remaining, limit), 0 }
    end
    return { false, limit, 0, delay, delay - max_delay, it.wstart, limit, 0 }
end

local function lq_take(it, st, now, cost)
    local depart = now
    if st then
        depart = max(st, now)
    end
    local tat = lq_held_until(depart, cost, it.p1)
    put_string(it.key, fmt(tat), tat - now)
end

---------------------------------------------------------------------------------------------
-- fair share (code 8, core: algo::fair_share): a tenant's bucket (the item's first key)
-- inside a parent bucket shared by every tenant of the rule (its second key), both stored as
-- region-scope token buckets. p1, p2, wstart = the parent's units per µs, burst, units per
-- token; rcur, rprev, wend = the child's (a fair share is never global, so the remote
-- fields are free); x = borrow_above, the tokens borrowing leaves in the parent.

local function fs_levels(it, st, now)
    local c = tb_current(it.rcur, it.wend, it.rprev, st[1], now, 0, 0)
    local p = tb_current(it.p1, it.wstart, it.p2, st[2], now, 0, 0)
    return c, p
end

-- core: fair_share::path_at. 1 borrowed (the parent only), 2 guaranteed (both), 0 refused.
local function fs_path(it, c, p, probe)
    local ps, cs = it.wstart, it.wend
    if probe + it.x <= it.p2 and p >= (probe + it.x) * ps then
        return 1
    end
    if probe <= it.rprev and probe <= it.p2 and p >= probe * ps and c >= probe * cs then
        return 2
    end
    return 0
end

-- core: fair_share::remaining
local function fs_remaining(it, c, p)
    local borrow = sat(idiv(p, it.wstart) - it.x)
    local own = min(idiv(c, it.wend), idiv(p, it.wstart))
    return max(borrow, own)
end

local function fs_evaluate(it, st, now, cost)
    local c, p = fs_levels(it, st, now)
    local ps, cs, pu, cu, burst = it.wstart, it.wend, it.p1, it.rcur, it.p2
    local cap = burst * ps
    local window = ceil_div(cap, pu)
    local probe = max(cost, 1)
    local path = fs_path(it, c, p, probe)
    if path == 0 then
        local borrow, own
        if probe + it.x <= burst then
            borrow = ceil_div(sat((probe + it.x) * ps - p), pu)
        end
        if probe <= it.rprev and probe <= burst then
            own = max(ceil_div(sat(probe * cs - c), cu), ceil_div(sat(probe * ps - p), pu))
        end
        local retry = window
        if borrow and own then
            retry = min(borrow, own)
        elseif borrow or own then
            retry = borrow or own
        end
        local rem = fs_remaining(it, c, p)
        return { false, burst, rem, ceil_div(cap - p, pu), retry, window, burst - min(rem, burst), 0 }
    end
    local c2, p2 = c, p - cost * ps
    if path == 2 then
        c2 = c - cost * cs
    end
    local rem = fs_remaining(it, c2, p2)
    return { true, burst, rem, ceil_div(cap - p2, pu), 0, window, burst - min(rem, burst), 0 }
end

-- Borrowing takes from the parent only; the guaranteed path and a charged refusal from both.
local function fs_take(it, st, now, cost)
    local c, p = fs_levels(it, st, now)
    local child_cost = cost
    if fs_path(it, c, p, max(cost, 1)) == 1 then
        child_cost = 0
    end
    tb_take({ key = it.key, p1 = it.rcur, p2 = it.rprev, wstart = it.wend, rcur = 0, rprev = 0 },
        st[1], now, child_cost)
    tb_take({ key = it.parent_key, p1 = it.p1, p2 = it.p2, wstart = it.wstart, rcur = 0, rprev = 0 },
        st[2], now, cost)
end

-- core: algo::remote_news. A shared bucket whose state lags the remote figure writes the
-- drained state even when it takes nothing, so the drain outlives its own refill schedule.
local function remote_news(it, st)
    if st == nil or it.rprev == 0 then
        return false
    end
    if it.code == 1 then
        return it.rcur > st[3]
    elseif it.code == 2 then
        return it.rcur > st[2]
    end
    return false
end

-- One call: its KEYS start after `kb` keys and its ARGV after `ab` arguments, `na` of them
-- (0, 0, #ARGV for a single call). Returns the reply, or an error reply; key indexes in
-- errors are the call's own (1-based).
local function run_call(kb, ab, na)
    local now, cost, stale = arg_head(ab + 1)
    local rid = ARGV[ab + 2]
    local n = na - 2
    if rid == nil or n < 0 then
        badarg('a call needs "now cost" and a request id')
    end
    if stale > 0 and clock_us() > stale then
        return redis.error_reply('SLUICE_STALE ' .. fmt(clock_us() - stale))
    end
    if stale > 0 then
        late_us = stale - clock_us()
    else
        late_us = UNBOUNDED_LATE
    end

    local items = {}
    local ki = 1
    for i = 1, n do
        local code, p1, p2, fl, rc, rp, ws, we, x = parse_item(ARGV[ab + 2 + i], i)
        local key = KEYS[kb + ki]
        if key == nil then
            badarg('fewer KEYS than items need')
        end
        if n == 1 and code == 3 and we > 0 then
            return fw_alone(key, now, cost, p1, fl, rc, we)
        end
        local it = {
            code = code,
            p1 = p1,
            p2 = p2,
            enforce = fl % 2 == 1,
            charge = fl >= 2,
            rcur = rc,
            rprev = rp,
            wstart = ws,
            wend = we,
            ki = ki,
            key = key,
        }
        ki = ki + 1
        if code == 8 then
            it.x = x
            it.parent_key = KEYS[kb + ki]
            if it.parent_key == nil then
                badarg('fewer KEYS than items need')
            end
            ki = ki + 1
        end
        if code == 4 and we > 0 then
            it.prev_key = KEYS[kb + ki]
            if it.prev_key == nil then
                badarg('fewer KEYS than items need')
            end
            ki = ki + 1
        end
        items[i] = it
    end

    -- Load every state first: a corrupt key fails the call before anything is written.
    local states = {}
    for i, it in ipairs(items) do
        local st, e
        if it.code == 1 then
            st, e = tb_load(it.key, it.ki)
        elseif it.code == 8 then
            local c, p
            c, e = tb_load(it.key, it.ki)
            if not e then
                p, e = tb_load(it.parent_key, it.ki + 1)
            end
            st = { c, p }
        elseif it.code == 2 then
            st, e = gcra_load(it.key, it.ki)
        elseif it.code == 3 and it.wend == 0 then
            st, e = fr_load(it.key, it.ki)
        elseif it.code == 3 then
            st, e = counter_load(it.key, it.ki)
        elseif it.code == 4 and it.wend == 0 then
            st, e = swf_load(it.key, it.ki)
        elseif it.code == 4 then
            local cur, prev
            cur, e = counter_load(it.key, it.ki)
            if not e then
                prev, e = counter_load(it.prev_key, it.ki + 1)
            end
            st = { cur, prev }
        elseif it.code == 5 then
            st, e = sl_load(it.key, it.ki, now, it.p2)
        elseif it.code == 7 then
            st, e = lq_load(it.key, it.ki)
        else
            st, e = cc_load(it.key, it.ki, now)
        end
        if e then
            return e
        end
        states[i] = st
    end

    local outcomes = {}
    for i, it in ipairs(items) do
        local o, e
        local st = states[i]
        if it.code == 1 then
            o = tb_evaluate(it, st, now, cost)
        elseif it.code == 8 then
            o = fs_evaluate(it, st, now, cost)
        elseif it.code == 2 then
            o = gcra_evaluate(it, st, now, cost)
        elseif it.code == 3 and it.wend == 0 then
            o = fr_evaluate(it, st, now, cost)
        elseif it.code == 3 then
            o = { fw_evaluate(it.p1, it.p2, it.rcur, it.wend, st, now, cost) }
        elseif it.code == 4 and it.wend == 0 then
            o = swf_evaluate(it, st, now, cost)
        elseif it.code == 4 then
            o = sw_evaluate(it, st, now, cost)
        elseif it.code == 5 then
            o, e = sl_evaluate(it, st, now, cost)
        elseif it.code == 7 then
            o = lq_evaluate(it, st, now, cost)
        else
            o = cc_evaluate(it, st, now, cost, rid)
        end
        if e then
            return e
        end
        outcomes[i] = o
    end

    local allowed = true
    for i, it in ipairs(items) do
        if it.enforce and not outcomes[i][1] then
            allowed = false
        end
    end

    if not allowed and cost > 0 then
        -- Outcomes say "after this request"; a refused request takes nothing from the rules that
        -- would have allowed it, so give the cost back in what they report.
        for i, it in ipairs(items) do
            local o = outcomes[i]
            if o[1] and not (it.enforce and it.charge) then
                o[3] = min(o[3] + cost, o[2])
                o[7] = sat(o[7] - cost)
            end
        end
    end

    for i, it in ipairs(items) do
        local charge = false
        if cost > 0 then
            if allowed then
                charge = outcomes[i][1]
            else
                charge = it.enforce and it.charge
            end
        end
        local st = states[i]
        if charge then
            if it.code == 1 then
                tb_take(it, st, now, cost)
            elseif it.code == 8 then
                fs_take(it, st, now, cost)
            elseif it.code == 2 then
                gcra_take(it, st, now, cost)
            elseif it.code == 3 and it.wend == 0 then
                fr_take(it, st, now, cost)
            elseif it.code == 3 then
                fw_take(it.key, it.wend, st, now, cost)
            elseif it.code == 4 and it.wend == 0 then
                swf_take(it, st, now, cost)
            elseif it.code == 4 then
                sw_take(it, st, now, cost)
            elseif it.code == 5 then
                sl_take(it, st, now, cost)
            elseif it.code == 7 then
                lq_take(it, st, now, cost)
            else
                cc_take(it, st, now, cost, rid)
            end
        elseif remote_news(it, st) then
            if it.code == 1 then
                tb_take(it, st, now, 0)
            else
                gcra_take(it, st, now, 0)
            end
        end
    end

    local reply = { allowed and 1 or 0 }
    for i = 1, #outcomes do
        local o = outcomes[i]
        reply[#reply + 1] = o[1] and 1 or 0
        for j = 2, 8 do
            reply[#reply + 1] = o[j]
        end
    end
    return reply
end

-- A batch (the standalone store groups concurrent calls, one EVALSHA for many): ARGV is
-- "B", the number of calls, then per call "nk na" (its key count and argument count, one
-- argument) and its own arguments; KEYS are the calls' keys one after the other. Each call is
-- still checked and taken atomically (the whole script is). Every call gets its own reply: an
-- error in one is that call's answer, a one-element array holding the error text, and the
-- others go on.
if ARGV[1] == 'B' then
    local m = arg_uint(2)
    -- Before any call writes: on a server older than 7, reading the clock after a write fails.
    clock_us()
    local replies = {}
    local kb, ab = 0, 2
    for c = 1, m do
        local nk, na = arg_pair(ab + 1, 'nk na')
        local ok, r = pcall(run_call, kb, ab + 1, na)
        if not ok then
            local msg = type(r) == 'table' and r.err or tostring(r)
            if not find(msg, '^[A-Z_]+ ') then
                msg = 'SLUICE_ERR ' .. msg
            end
            r = { msg }
        elseif type(r) == 'table' and r.err then
            r = { r.err }
        end
        replies[c] = r
        kb, ab = kb + nk, ab + 1 + na
    end
    return replies
end

return run_call(0, 0, #ARGV)
