-- Sluice: frees a concurrency slot (POST /v1/limits:release).
--
-- A transcription of `sluice_core::algo::release`: drops expired slots, removes the slots held
-- by the request id, deletes the key when no slot is left, and keeps the key's expiry
-- otherwise. The slot layout is check.lua's: a sorted set, member "<cost>:<request id>",
-- score = expiry in epoch microseconds.
--
-- KEYS[1]: the concurrency key. ARGV: now (the daemon's clock, µs), request_id.
-- Reply: 1 when the id held a live slot, 0 otherwise.
-- Errors: "SLUICE_CORRUPT 1 <detail>" when the key is not a sorted set of slots.

local key = KEYS[1]
local now = ARGV[1]
local rid = ARGV[2]
if not string.find(now, '^%d+$') or #now > 16 then
    return redis.error_reply('SLUICE_BADARG ARGV[1] is not an integer below 2^53')
end

local t = redis.call('TYPE', key).ok
if t == 'none' then
    return 0
end
if t ~= 'zset' then
    return redis.error_reply('SLUICE_CORRUPT 1 holds a ' .. t .. ', expected a zset')
end

local live = redis.call('ZRANGEBYSCORE', key, '(' .. now, '+inf')
local mine = {}
for _, m in ipairs(live) do
    local c, id = string.match(m, '^(%d+):(.*)$')
    if c == nil then
        return redis.error_reply('SLUICE_CORRUPT 1 concurrency slot ' .. string.format('%q', m) .. ' is not "<cost>:<id>"')
    end
    if id == rid then
        mine[#mine + 1] = m
    end
end
if #mine == 0 then
    return 0
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
for _, m in ipairs(mine) do
    redis.call('ZREM', key, m)
end
if redis.call('ZCARD', key) == 0 then
    redis.call('DEL', key)
end
return 1
