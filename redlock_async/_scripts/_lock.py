"""Lua of one lock key: release (telling the waiters, or not for a hand-over) and extension."""

from __future__ import annotations

from redlock_async._scripts._fencing import RAISE

RELEASE = b"""
-- Compare-and-delete, then tell the waiters (pushed hand-off): a digest of
-- the released token (listeners only match words from several nodes; the
-- token itself would let a listener extend or release a lease), on the
-- channel named like the key (or KEYS[2]), only when a key was deleted.
-- KEYS[1]  the lock key (and the channel)
-- KEYS[2]  optional: the channel instead (a semaphore's permits share one)
-- ARGV[1]  the token of the acquisition being released
-- returns  1 deleted; 0 the key is gone or holds another token (left alone)
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', KEYS[2] or KEYS[1], redis.sha1hex(ARGV[1]))
    return 1
end
return 0
"""


HANDED_RELEASE = b"""
-- Compare-and-delete, telling no one: the release of a hand-over, whose next
-- holder's SET follows it on this connection (a word would only wake waiters
-- elsewhere to find the key taken again).
-- KEYS[1]  the lock key
-- ARGV[1]  the token of the acquisition being released
-- returns  1 deleted; 0 the key is gone or holds another token (left alone)
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('DEL', KEYS[1])
    return 1
end
return 0
"""


EXTEND = b"""
-- Compare-and-PEXPIRE of one lock key (an explicit extend() of one unfenced name), and take
-- the key where it is free and the lease may take it here (see EXTEND_MANY: not on a node
-- whose yes its validity counts on). Never touches a key that holds another token. Its
-- fallback after NOSCRIPT takes nothing (it may run behind the lease's own release).
-- KEYS[1]  the lock key
-- ARGV[1]  the token of the acquisition being extended
-- ARGV[2]  the new ttl in integer milliseconds, counted from now
-- ARGV[3]  1: SET the key where it is free; 0: only PEXPIRE
-- returns  1 it holds the token now (extended or taken); 0 the key holds another token, or is
--          gone where it may not be taken
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if not held and ARGV[3] == '1' then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return 1
end
return 0
"""


EXTEND_MANY = (
    b"""
-- Extend leases (the watchdog's batched round, or an explicit extend() of several names or a
-- fenced one), and take the nodes where a lease's keys are free. Per lease, all or none on this node: when every key
-- holds its token, or is free and the lease may take it here, the held keys are PEXPIREd and
-- the free ones SET to its token (fenced: their counters raised to its fencing tokens, never
-- lowered, and their fencers named, as FENCE does); otherwise nothing is touched. A key that
-- holds another token is never touched: a lease that ran out may belong to someone else now.
-- A free key is taken only where the lease asks to (take): not on a node whose yes its
-- validity counts on, where a missing key was lost (a restart, a deletion), not freed.
-- Sent again as EVAL after the server lost it, it may run after a later command on its keys
-- (the lease's own release): its fallback asks to take nothing, so a late run never re-creates.
-- KEYS     per lease: its n keys; fenced, then their n fencing counters and n fencers
-- ARGV     per lease: its token; its new ttl in integer milliseconds, counted from now; and
--          "0" or "1" for one key (1: take it here where it is free); otherwise "<take>:<n>"
--          (take 0 or 1; n negative when fenced: then followed by the n fencing tokens and the
--          counters' ttl in integer milliseconds, empty when they never expire)
-- returns  an array, per lease: 1 it holds every key now (extended, maybe taken); 0 a key
--          holds another token, or is gone where it may not be taken (nothing changed)
"""
    + RAISE
    + b"""
local out, j, k, a, last = {}, 1, 1, 1, #ARGV
while a <= last do
    local token, ttl, spec = ARGV[a], ARGV[a + 1], ARGV[a + 2]
    if spec == '0' or spec == '1' then  -- one key, unfenced: most leases
        local key = KEYS[k]
        local held = redis.call('GET', key)
        if held == token then
            redis.call('PEXPIRE', key, ttl)
            out[j] = 1
        elseif not held and spec == '1' then
            redis.call('SET', key, token, 'PX', ttl)
            out[j] = 1
        else
            out[j] = 0
        end
        a, k = a + 3, k + 1
    else
        local take, n = string.match(spec, '^(%d):(-?%d+)$')
        take, n = take == '1', tonumber(n)
        local fenced = n < 0
        if fenced then
            n = -n
        end
        local free, ok = nil, 1
        for i = k, k + n - 1 do
            local held = redis.call('GET', KEYS[i])
            if held ~= token then
                if held or not take then
                    ok = 0
                    break
                end
                free = free or {}
                free[i] = true
            end
        end
        if ok == 1 then
            for i = k, k + n - 1 do
                if free and free[i] then
                    redis.call('SET', KEYS[i], token, 'PX', ttl)
                    if fenced then
                        local life = ARGV[a + 3 + n]
                        if life == '' then
                            life = nil
                        end
                        raise_counter(KEYS[i + n], ARGV[a + 3 + i - k], life)
                        name_fencer(KEYS[i + 2 * n], token, life)
                    end
                else
                    redis.call('PEXPIRE', KEYS[i], ttl)
                end
            end
        end
        out[j] = ok
        if fenced then
            a, k = a + 4 + n, k + 3 * n
        else
            a, k = a + 3, k + n
        end
    end
    j = j + 1
end
return out
"""
)
